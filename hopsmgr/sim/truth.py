"""Ground-truth throughput worlds for the simulator: the hidden "true" speed the estimator must learn.

A `World` answers, for a job's model and a configuration given as (server, GPUs on it) pairs, the true
total samples/s (`true_rate`), one noisy measurement of it (`sample_rate`), what the profiler would see on
one GPU (`profile`) and what an agent's calibration kernels would report (`calibration`). Every server
carries hidden factors drawn from a hash of (seed, server id), so two servers of one type differ.

"gavel" world: Gavel's measured isolated steps/s (shared/data/gavel/simulation_throughputs.json, MIT),
samples/s = steps/s x per-GPU batch size (Gavel's steps are summed over workers: its 8-GPU steps/s are
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

"paper" world (the Hops paper's clusters; every number below is an assumption of ours):

| GPU type  | fp32 speed | memory GB/s | PCIe GB/s | | host model | CPU speed | cache bonus | contention |
|-----------|------------|-------------|-----------|-|------------|-----------|-------------|------------|
| gtx1080ti | 1.0        | 484         | 6         | | "" (old)   | 0.9       | 0           | 0.05/GPU   |
| titanxp   | 1.1        | 548         | 6         | | A          | 1.0       | 0           | 0.04/GPU   |
| rtx3090   | 2.2        | 936         | 12        | | B (memory) | 1.3       | +0.15       | 0.03/GPU   |
|           |            |             |           | | C (newest) | 1.6       | 0           | 0.025/GPU  |

| model (variant)       | Mparams | batch | fwd/bwd ms | miss ms | p hit | hit/miss | overlap | pattern |
|-----------------------|---------|-------|------------|---------|-------|----------|---------|---------|
| ResNet18              | 11.7    | 128   | 60/120     | 110     | 0.60  | 0.50     | 0.70    | 1       |
| ResNet50              | 25.6    | 64    | 105/210    | 70      | 0.60  | 0.50     | 0.80    | 1       |
| VGG11                 | 132.9   | 64    | 85/175     | 70      | 0.60  | 0.50     | 0.50    | 1       |
| VGG13                 | 133.0   | 64    | 120/250    | 70      | 0.60  | 0.50     | 0.50    | 1       |
| ConvNeXt-base         | 88.6    | 32    | 150/310    | 40      | 0.80  | 0.50     | 0.70    | 1       |
| DenseNet161           | 28.7    | 32    | 95/195     | 40      | 0.80  | 0.50     | 0.80    | 1       |
| MobileNetV2           | 3.5     | 128   | 45/95      | 120     | 0.50  | 0.40     | 0.90    | 1       |
| RegNet (RegNetY-3.2GF)| 19.4    | 64    | 70/140     | 70      | 0.60  | 0.50     | 0.80    | 1       |
| DistilBERT            | 66.4    | 32    | 50/100     | 12      | 0.95  | 0.60     | 0.60    | 2       |
| ViT (ViT-B/16)        | 86.6    | 32    | 175/355    | 40      | 0.90  | 0.80     | 0.70    | 1       |
| wav2vec (2.0 base)    | 95.0    | 8     | 140/290    | 110     | 0.40  | 0.30     | 0.60    | 2       |
| GPT-2 medium          | 354.8   | 4     | 330/680    | 10      | 0.95  | 0.60     | 0.50    | 2       |

Public parameter counts at 4 bytes/parameter; batch is per GPU; times are assumptions of ours. MacBERT
(BERT-base sized) is left out to keep the paper's twelve. A server's GPU type is matched loosely
("GTX1080Ti", "RTX 3090"); its `host_model` is "", "A", "B" or "C" (1080Ti/TitanXp servers: "").

Hidden per-server factors: compute and data lognormal(0, sigma), memory and link (sigma/2), net (sigma/4).
One GPU of server s holding g of the configuration's N GPUs over k servers: fwd/bwd = table / (speed x
compute factor); update = 7 x params bytes / (memory GB/s x factor); data = miss time (x hit/miss on a hit,
probability p hit + cache bonus) / (CPU speed x data factor) x (1 + contention x (g - 1)): the GPUs of a
host share its CPU. Communication Tc (ring all-reduce) = max over servers of 2(g-1)/g x bytes / PCIe GB/s,
plus 2(k-1)/k x bytes / 12.5 GB/s (100 Gbit/s InfiniBand) when k > 1; `overlap` x Tc hides behind backward
(up to its length), the rest is exposed. Pattern 1: t = fwd + max(data, bwd + update + exposed); pattern 2:
the sum. A synchronous step lasts the expected maximum of t over all N GPUs (exact over hit/miss), times
1 + 0.03 sqrt(2 ln N) (compute jitter); rate = batch x N / step. The estimator's formula differs (fixed 0.2
exposed share, no contention, one GPU's expectation), so it has real error beyond one GPU. `true_rate` with
`rng_key` != 0 multiplies by a fixed lognormal(0, 0.03) job-instance factor (both worlds); pass the same
key to `profile` and `sample_rate` to stay consistent with it. Restart cost (both worlds): 25 s + 0.15 s per MB of parameters, at most 250 s.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, Server

Parts = Sequence[tuple[Server, int]]


@dataclass(frozen=True, slots=True)
class TrueModel:
    """One model of a world: parameter bytes, per-GPU batch size, checkpoint+restart seconds."""

    name: str
    params_bytes: float
    batch_size: int
    restart_s: float


class World(Protocol):
    """A hidden ground truth of job speeds (see the module docstring)."""

    name: str

    def models(self) -> tuple[TrueModel, ...]: ...
    def model(self, name: str) -> TrueModel: ...
    def gpu_types(self) -> tuple[str, ...]: ...
    # shares: each rank's share of the global batch as the launch gave them (LaunchAttempt.shares; ()
    # = equal); a world may take them into account or split the batch its own way
    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float: ...
    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float: ...
    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile: ...
    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float: ...
    def calibration(self, server: Server) -> Calibration: ...


def _stable_rng(*key: object) -> random.Random:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _factor(sigma: float, *key: object) -> float:
    return math.exp(_stable_rng(*key).gauss(0.0, sigma)) if sigma > 0 else 1.0


def _restart_s(params_bytes: float) -> float:
    return min(25.0 + 0.15 * params_bytes / 1e6, 250.0)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _spans_types(parts: Parts) -> bool:
    return len({s.gpu_type.lower() for s, _ in parts}) > 1


def _check_parts(parts: Parts) -> int:
    if not parts:
        raise ValueError("a configuration needs at least one (server, gpus) part")
    for server, gpus in parts:
        if not isinstance(gpus, int) or not 0 < gpus <= server.gpus:
            raise ValueError(f"configuration gives server {server.id!r} ({server.gpus} GPUs) {gpus!r} GPUs")
    return sum(g for _, g in parts)


@functools.lru_cache(maxsize=65536)
def _job_factor(seed: int, model: str, rng_key: int) -> float:
    """Per-job-instance speed multiplier: exactly 1 for key 0, else lognormal(0, 0.03)."""
    return 1.0 if rng_key == 0 else _factor(0.03, seed, "job", model, rng_key)


class _BaseWorld:
    """Model lookup and reference configurations shared by both worlds."""

    _gpus_per_server = 8

    def __init__(self, name: str, seed: int, sigma: float, types: tuple[str, ...]) -> None:
        self.name, self.seed, self.sigma, self._types = name, seed, sigma, types
        self._models: dict[str, TrueModel] = {}
        self._ref_host: dict[str, str] = {}
        self._memo: dict[tuple[str, tuple[tuple[Server, int], ...], bool], float] = {}
        self._reference: dict[tuple[str, int, str | None], float] = {}

    def models(self) -> tuple[TrueModel, ...]:
        return tuple(self._models.values())

    def model(self, name: str) -> TrueModel:
        found = self._models.get(name) or next(
            (m for m in self._models.values() if _norm(m.name) == _norm(name)), None
        )
        if found is None:
            raise ValueError(f"unknown model {name!r} in the {self.name} world")
        return found

    def gpu_types(self) -> tuple[str, ...]:
        return self._types

    def reference_parts(self, gpus: int, gpu_type: str | None = None) -> list[tuple[Server, int]]:
        """Nominal servers (hidden factors 1) of `gpu_type` (default: the middle type) holding `gpus`."""
        gtype = gpu_type or self._types[len(self._types) // 2]
        per, parts = self._gpus_per_server, []
        for i in range(math.ceil(gpus / per)):
            server = Server(f"__ref{i}", gtype, per, host_model=self._ref_host.get(_gpu_key(gtype), ""))
            parts.append((server, min(per, gpus - i * per)))
        return parts

    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float:
        """The rate of `model` on `config_parts` (a speed-balanced placement at the ideal split, whatever
        `shares` the launch gave: see _balanced_shares)."""
        rate = self._memo_rate(model, config_parts, nominal=False)
        return rate * _job_factor(self.seed, self.model(model).name, rng_key) if rng_key else rate

    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float:
        """True rate on nominal servers of `gpu_type` (middle type by default), 8 GPUs per server."""
        key = (model, gpus, gpu_type)
        rate = self._reference.get(key)
        if rate is None:
            rate = self._reference[key] = self._memo_rate(model, self.reference_parts(gpus, gpu_type), True)
        return rate

    def _memo_rate(self, model: str, parts: Parts, nominal: bool) -> float:
        key = (model, tuple(parts), nominal)
        rate = self._memo.get(key)
        if rate is None:
            if len(self._memo) >= 100_000:
                self._memo.clear()
            rate = self._memo[key] = self._rate(model, parts, nominal)
        return rate

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------- gavel

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


class GavelWorld(_BaseWorld):
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
            self._models[job] = TrueModel(job, params, batch, _restart_s(params))

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
        return 1.0 if nominal else _factor(self.sigma, self.seed, server.id)

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        total = _check_parts(parts)
        tm = self.model(model)
        paces = [
            self.steps_per_s(tm.name, self._type(s), total) * self._server_factor(s, nominal)
            for s, _ in parts
        ]
        if _spans_types(parts):  # speed-balanced batches: each GPU at its own pace (their mean)
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
        noise = _stable_rng(self.seed, "calibration", server.id)
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


# ----------------------------------------------------------------------------------------------- paper


class _PaperModel(NamedTuple):
    params_m: float
    batch: int
    tf_ms: float
    tb_ms: float
    td_miss_ms: float
    p_hit: float
    hit_ratio: float
    overlap: float
    pattern: int


# fmt: off
_PAPER_GPUS = {"gtx1080ti": (1.0, 484.0, 6.0), "titanxp": (1.1, 548.0, 6.0), "rtx3090": (2.2, 936.0, 12.0)}
_PAPER_HOSTS = {"": (0.9, 0.0, 0.05), "A": (1.0, 0.0, 0.04), "B": (1.3, 0.15, 0.03), "C": (1.6, 0.0, 0.025)}
_NET_GBPS = 12.5  # 100 Gbit/s InfiniBand
_JITTER = 0.03  # per-GPU compute-time variation: a synchronous step waits for the slowest GPU
_PAPER_MODELS = {  # params M, batch, fwd ms, bwd ms, data miss ms, p hit, hit/miss, overlap, pattern
    "ResNet18":      _PaperModel(11.7, 128, 60, 120, 110, 0.60, 0.50, 0.70, 1),
    "ResNet50":      _PaperModel(25.6, 64, 105, 210, 70, 0.60, 0.50, 0.80, 1),
    "VGG11":         _PaperModel(132.9, 64, 85, 175, 70, 0.60, 0.50, 0.50, 1),
    "VGG13":         _PaperModel(133.0, 64, 120, 250, 70, 0.60, 0.50, 0.50, 1),
    "ConvNeXt-base": _PaperModel(88.6, 32, 150, 310, 40, 0.80, 0.50, 0.70, 1),
    "DenseNet161":   _PaperModel(28.7, 32, 95, 195, 40, 0.80, 0.50, 0.80, 1),
    "MobileNetV2":   _PaperModel(3.5, 128, 45, 95, 120, 0.50, 0.40, 0.90, 1),
    "RegNet":        _PaperModel(19.4, 64, 70, 140, 70, 0.60, 0.50, 0.80, 1),
    "DistilBERT":    _PaperModel(66.4, 32, 50, 100, 12, 0.95, 0.60, 0.60, 2),
    "ViT":           _PaperModel(86.6, 32, 175, 355, 40, 0.90, 0.80, 0.70, 1),
    "wav2vec":       _PaperModel(95.0, 8, 140, 290, 110, 0.40, 0.30, 0.60, 2),
    "GPT-2 medium":  _PaperModel(354.8, 4, 330, 680, 10, 0.95, 0.60, 0.50, 2),
}
# fmt: on


def _gpu_key(gpu_type: str) -> str:
    key = _norm(gpu_type)
    for prefix in ("nvidia", "geforce", "gtx", "rtx"):
        key = key.removeprefix(prefix)
    return {"1080ti": "gtx1080ti", "titanxp": "titanxp", "3090": "rtx3090"}.get(key, key)


def _host_key(host_model: str) -> str:
    key = _norm(host_model).removeprefix("servermodel").removeprefix("model").removeprefix("host").upper()
    return "" if key in ("", "OLD", "LEGACY") else key


class _Modules(NamedTuple):
    """One GPU of a server, alone on its host: compute times, data-miss time, hit probability, links."""

    tf: float
    tb: float
    tu: float
    miss: float
    p_hit: float
    contention: float
    link_gbps: float
    net_gbps: float


def _balanced_shares(pm: _PaperModel, mods: list[tuple[_Modules, int]], total: int) -> list[float]:
    """[ours] Per part, its GPUs' local batch over the mean one when the global batch is split in
    proportion to each GPU's true speed (its expected forward, backward and loading time per batch):
    the ideal split; the runtime splits by the estimator's rates, which are a few percent off."""
    speeds = []
    for m, g in mods:
        miss = m.miss * (1 + m.contention * (g - 1))
        loading = m.p_hit * miss * pm.hit_ratio + (1 - m.p_hit) * miss
        speeds.append(1.0 / (m.tf + m.tb + loading))
    mean = sum(v * g for v, (_, g) in zip(speeds, mods, strict=True)) / total
    return [v / mean for v in speeds]


class PaperWorld(_BaseWorld):
    """The Hops paper's five server kinds and twelve models (see the module docstring)."""

    def __init__(self, seed: int = 0, per_server_sigma: float = 0.08) -> None:
        super().__init__("paper", seed, per_server_sigma, tuple(_PAPER_GPUS))
        self._ref_host = {"rtx3090": "A"}
        for name, pm in _PAPER_MODELS.items():
            params = pm.params_m * 4e6
            self._models[name] = TrueModel(name, params, pm.batch, _restart_s(params))

    def _kind(self, server: Server) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        gpu = _PAPER_GPUS.get(_gpu_key(server.gpu_type))
        if gpu is None:
            known = ", ".join(self._types)
            raise ValueError(f"unknown GPU type {server.gpu_type!r} in the paper world (known: {known})")
        host = _PAPER_HOSTS.get(_host_key(server.host_model))
        if host is None:
            raise ValueError(f"unknown host model {server.host_model!r} in the paper world (known: '', A-C)")
        return gpu, host

    def _factors(self, server: Server, nominal: bool) -> tuple[float, float, float, float, float]:
        """Hidden (compute, memory, data, link, net) factors of a server; all 1 when nominal."""
        if nominal:
            return 1.0, 1.0, 1.0, 1.0, 1.0
        s, key = self.sigma, (self.seed, server.id)
        return (
            _factor(s, *key, "compute"), _factor(s / 2, *key, "memory"), _factor(s, *key, "data"),
            _factor(s / 2, *key, "link"), _factor(s / 4, *key, "net"),
        )  # fmt: skip

    def _modules(self, pm: _PaperModel, server: Server, nominal: bool) -> _Modules:
        (speed, mem_gbps, link_gbps), (cpu, cache_bonus, contention) = self._kind(server)
        fc, fm, fd, fl, fn = self._factors(server, nominal)
        return _Modules(
            tf=pm.tf_ms / 1e3 / (speed * fc), tb=pm.tb_ms / 1e3 / (speed * fc),
            tu=7 * pm.params_m * 4e6 / (mem_gbps * 1e9 * fm), miss=pm.td_miss_ms / 1e3 / (cpu * fd),
            p_hit=min(0.97, pm.p_hit + cache_bonus), contention=contention,
            link_gbps=link_gbps * fl, net_gbps=_NET_GBPS * fn,
        )  # fmt: skip

    def _rate(self, model: str, parts: Parts, nominal: bool) -> float:
        total = _check_parts(parts)
        pm = _PAPER_MODELS[self.model(model).name]
        mods = [(self._modules(pm, s, nominal), g) for s, g in parts]
        size, k = pm.params_m * 4e6, len(parts)
        comm = max(2 * (g - 1) / g * size / (m.link_gbps * 1e9) for m, g in mods)
        if k > 1:
            comm += 2 * (k - 1) / k * size / (min(m.net_gbps for m, _ in mods) * 1e9)
        share = _balanced_shares(pm, mods, total) if _spans_types(parts) else [1.0] * len(mods)
        dists = []  # per part: (time on a hit, time on a miss, hit probability), GPUs
        for (m, g), f in zip(mods, share, strict=True):
            # a speed-balanced part computes f x the batch per GPU (its forward, backward, loading)
            m = m._replace(tf=m.tf * f, tb=m.tb * f, miss=m.miss * f)
            miss = m.miss * (1 + m.contention * (g - 1))
            exposed = comm * (1 - pm.overlap) + max(0.0, pm.overlap * comm - m.tb)
            busy = m.tb + m.tu + exposed
            hit, slow = (
                (m.tf + max(td, busy)) if pm.pattern == 1 else td + m.tf + busy
                for td in (miss * pm.hit_ratio, miss)
            )
            dists.append((hit, slow, m.p_hit, g))

        def cdf(x: float) -> float:  # P(every GPU's time <= x)
            return math.prod(
                ((p if h <= x else 0.0) + (1 - p if m <= x else 0.0)) ** g for h, m, p, g in dists
            )

        expected, last = 0.0, 0.0
        for v in sorted({v for h, m, _, _ in dists for v in (h, m)}):
            now = cdf(v)
            expected, last = expected + v * (now - last), now
        expected *= 1 + _JITTER * math.sqrt(2 * math.log(total))
        return pm.batch * total / expected

    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile:
        """Noisy time modules of 40 profiled iterations on one GPU of `server` (hit rate counted)."""
        pm = _PAPER_MODELS[self.model(model).name]
        m = self._modules(pm, server, nominal=False)
        speedup = _job_factor(self.seed, self.model(model).name, rng_key)

        def noisy(x: float, sigma: float = 0.03) -> float:
            return x / speedup * math.exp(rng.gauss(0.0, sigma))

        hits = sum(rng.random() < m.p_hit for _ in range(40))
        return TimeProfile(
            tf_s=noisy(m.tf), tb_s=noisy(m.tb), tu_s=noisy(m.tu), td_hit_s=noisy(m.miss * pm.hit_ratio, 0.05),
            td_miss_s=noisy(m.miss, 0.05), p_cache=max(hits / 40, 0.025), pattern=pm.pattern,
            td_hit_sigma=0.1 * m.miss * pm.hit_ratio, td_miss_sigma=0.1 * m.miss,
        )  # fmt: skip

    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float:
        """One measurement over ~50 iterations: noise grows with the model's data-loading variability."""
        pm = _PAPER_MODELS[self.model(model).name]
        cv = 0.01 + (1 - pm.hit_ratio) * math.sqrt(pm.p_hit * (1 - pm.p_hit) / 50)
        return self.true_rate(model, config_parts, rng_key) * max(0.5, 1 + rng.gauss(0.0, cv))

    def calibration(self, server: Server) -> Calibration:
        (_, _, link_gbps), (cpu, _, _) = self._kind(server)
        fc, fm, fd, fl, fn = self._factors(server, nominal=False)
        noise = _stable_rng(self.seed, "calibration", server.id)

        def noisy(x: float) -> float:
            return x * math.exp(noise.gauss(0.0, 0.02))

        return Calibration(
            compute_factor=noisy(fc), memory_factor=noisy(fm), data_factor=noisy(cpu * fd),
            link_gbps=noisy(link_gbps * fl), net_gbps=noisy(_NET_GBPS * fn), source="emulated",
        )  # fmt: skip


def paper_world(seed: int = 0, per_server_sigma: float = 0.08) -> World:
    """The "paper" world: five server kinds and twelve models of the Hops paper."""
    return PaperWorld(seed, per_server_sigma)


def world_by_name(name: str, **kw: object) -> World:
    """'gavel' (needs `throughputs_path`) or 'paper'; other keywords go to the world's factory."""
    if name == "paper":
        return paper_world(**kw)  # type: ignore[arg-type]
    if name == "gavel":
        return gavel_world(**kw)  # type: ignore[arg-type]
    raise ValueError(f"unknown world {name!r} (known: gavel, paper)")
