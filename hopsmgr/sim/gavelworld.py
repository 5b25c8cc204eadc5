"""The "gavel" ground-truth world (hopsmgr.sim.truth): Gavel's measured isolated steps/s
(shared/data/gavel/simulation_throughputs.json, MIT), samples/s = steps/s x per-GPU batch size (Gavel's steps are summed over workers: its 8-GPU steps/s are
5-8x its 1-GPU steps/s). Zero entries (out of memory in Gavel's runs) count as not measured; entries
above n x the 1-GPU value (superlinear, v100 ResNet-18) are capped there. Counts not in the file:
log-log interpolation between measured counts; beyond the largest, the exponent of the last two
measured counts (the 4->8 scaling, clamped to [0, 1]); a type measured at one GPU only scales with
exponent log2(1.8). Configurations over k > 1 servers are slowed by the file's "unconsolidated"/
consolidated ratio at the nearest measured count (capped at 1; 0.85 where absent), then 0.85 per further
server (not with `spread_slowdown=False`, the `--gavel-compat` setting: Gavel's simulator uses the
consolidated rates). Every GPU of a configuration runs at the per-GPU pace of the slowest server
(slowest-server rule), except on a configuration that spans GPU types: its ranks split the global
batch by speed (hopsmgr.runtime.balance), so each GPU runs at its own pace (the rate is their sum).
Hidden per-server factor: lognormal(0, per_server_sigma) on speed. The profile splits the 1-GPU step
30/55/15 % into fwd/bwd/update with data loading (40 %) hidden under backward.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, Server
from hopsmgr.sim.truth import (
    BaseWorld,
    Parts,
    TrueModel,
    World,
    check_parts,
    hidden_factor,
    parts_span_types,
    restart_s_of,
    stable_rng,
)

_JOB_TYPE = re.compile(r"^(?P<family>.+?)(?: \(batch size (?P<batch>\d+)\))?$")
# Parameter counts (millions) per Gavel job family; A3C, LM, Recommendation, Transformer are approximate.
_GAVEL_PARAMS_M = {"ResNet-18": 11.7, "ResNet-50": 25.6, "Transformer": 65, "LM": 28, "Recommendation": 40}
_GAVEL_PARAMS_M.update({"A3C": 1.0, "CycleGAN": 28.3})
_SINGLE_EXPONENT = math.log2(1.8)
_SPREAD_SLOWDOWN = 0.85


def parse_job_type(job_type: str) -> tuple[str, int]:
    """'ResNet-18 (batch size 16)' -> ('ResNet-18', 16); a name without a batch size has batch 1."""
    match = _JOB_TYPE.match(job_type.strip())
    if not match:
        raise ValueError(f"job type {job_type!r} cannot be parsed")
    return match["family"], int(match["batch"] or 1)


def _parse_key(key: str) -> tuple[str, int]:
    match = re.fullmatch(r"\('(.+)', (\d+)\)", key)
    if not match:
        raise ValueError(f"throughput key {key!r} is not ('<job type>', <gpus>)")
    return match[1], int(match[2])


class GavelWorld(BaseWorld):
    """Gavel's measured throughputs with hidden per-server factors (see the module docstring)."""

    def __init__(
        self,
        throughputs: dict[str, dict[str, dict[str, object]]],
        seed: int,
        sigma: float,
        spread_slowdown: bool = True,
    ) -> None:
        self.spread_slowdown = spread_slowdown
        self._steps: dict[tuple[str, str], dict[int, float]] = {}
        spread: dict[tuple[str, str], dict[int, float]] = {}
        for worker, table in throughputs.items():
            base, _, uncons = worker.partition("_")
            target = spread if uncons else self._steps
            for key, entry in table.items():
                job, gpus = _parse_key(key)
                value = entry.get("null")
                if isinstance(value, (int, float)) and value > 0:
                    target.setdefault((base.lower(), job), {})[gpus] = float(value)
        for counts in self._steps.values():  # superlinear entries (v100 ResNet-18): cap at linear scaling
            one = counts.get(1)
            counts.update({n: min(v, n * one) for n, v in counts.items()} if one else {})
        self._spread: dict[tuple[str, str], dict[int, float]] = {}
        for k, counts in spread.items():
            base_counts = self._steps.get(k, {})
            ratios = {
                n: min(1.0, v / base_counts[n]) for n, v in counts.items() if n > 1 and n in base_counts
            }
            if ratios:
                self._spread[k] = ratios
        types = tuple(t for t in ("k80", "p100", "v100") if any(k[0] == t for k in self._steps))
        super().__init__(
            "gavel", seed, sigma, types + tuple(sorted({k[0] for k in self._steps} - set(types)))
        )
        for _, job in sorted(self._steps):
            family, batch = parse_job_type(job)
            params = 4e6 * _GAVEL_PARAMS_M.get(family, 25.0)
            self._models[job] = TrueModel(job, params, batch, restart_s_of(params))

    def _type(self, server: Server) -> str:
        gtype = server.gpu_type.lower()
        if gtype not in self._types:
            known = ", ".join(self._types)
            raise ValueError(f"unknown GPU type {server.gpu_type!r} in the gavel world (known: {known})")
        return gtype

    def steps_per_s(self, job: str, gpu_type: str, gpus: int) -> float:
        """Isolated steps/s (summed over workers) of `job` on `gpus` GPUs of a type, filled as documented."""
        measured = self._steps.get((gpu_type, job))
        if not measured:
            raise ValueError(f"job type {job!r} has no throughput on GPU type {gpu_type!r}")
        if gpus in measured:
            return measured[gpus]
        counts = sorted(measured)
        below = [n for n in counts if n < gpus]
        above = [n for n in counts if n > gpus]
        if below and above:
            lo, hi = below[-1], above[0]
            exponent = math.log(measured[hi] / measured[lo]) / math.log(hi / lo)
            return measured[lo] * (gpus / lo) ** exponent
        if not below:
            return measured[counts[0]] * gpus / counts[0]
        top = counts[-1]
        if len(counts) >= 2:
            prev = counts[-2]
            exponent = min(max(math.log(measured[top] / measured[prev]) / math.log(top / prev), 0.0), 1.0)
        else:
            exponent = _SINGLE_EXPONENT
        return measured[top] * (gpus / top) ** exponent

    def _spread_factor(self, gpu_type: str, job: str, gpus: int, servers: int) -> float:
        ratios = self._spread.get((gpu_type, job))
        first = _SPREAD_SLOWDOWN
        if ratios:
            first = ratios[min(ratios, key=lambda n: (abs(math.log(n / gpus)), n))]
        return first * _SPREAD_SLOWDOWN ** (servers - 2)

    def _server_factor(self, server: Server, nominal: bool = False) -> float:
        return 1.0 if nominal else hidden_factor(self.sigma, self.seed, server.id)

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        total = check_parts(parts)
        tm = self.model(model)
        paces = [
            self.steps_per_s(tm.name, self._type(s), total) * self._server_factor(s, nominal)
            for s, _ in parts
        ]
        if parts_span_types(parts):  # speed-balanced batches: each GPU at its own pace (their mean)
            rate = sum(p * g for p, (_, g) in zip(paces, parts, strict=True)) / total * tm.batch_size
        else:
            rate = min(paces) * tm.batch_size  # every GPU runs at the slowest server's pace
        if len(parts) > 1 and self.spread_slowdown:
            rate *= min(self._spread_factor(self._type(s), tm.name, total, len(parts)) for s, _ in parts)
        return rate

    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile:
        tm = self.model(model)
        t_iter = tm.batch_size / self.true_rate(model, [(server, 1)], rng_key)

        def noisy(x: float) -> float:
            return x * math.exp(rng.gauss(0.0, 0.03))

        td = noisy(0.4 * t_iter)
        tf, tb, tu = noisy(0.3 * t_iter), noisy(0.55 * t_iter), noisy(0.15 * t_iter)
        return TimeProfile(tf_s=tf, tb_s=tb, tu_s=tu, td_hit_s=td, td_miss_s=td)

    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float:
        return self.true_rate(model, config_parts, rng_key) * math.exp(rng.gauss(0.0, 0.02))

    def calibration(self, server: Server) -> Calibration:
        self._type(server)
        factor = self._server_factor(server)
        noise = stable_rng(self.seed, "calibration", server.id)
        compute, memory = (factor * math.exp(noise.gauss(0.0, 0.02)) for _ in range(2))
        return Calibration(compute_factor=compute, memory_factor=memory, source="emulated")


def gavel_world(
    throughputs_path: str | Path, seed: int = 0, per_server_sigma: float = 0.08, spread_slowdown: bool = True
) -> World:
    """The "gavel" world from Gavel's simulation_throughputs.json. `spread_slowdown=False` runs a
    configuration over several servers at its consolidated rate, as Gavel's own simulator does."""
    with open(throughputs_path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{throughputs_path}: not a throughput table")
    return GavelWorld(data, seed, per_server_sigma, spread_slowdown)
