"""A ground-truth world (hopsmgr.sim.truth.World) for emulated jobs on emulated nodes: what
`examples/emulated_train.py` really does on a server of a local cluster (`hopsmgr up`).

An emulated agent reports its configured speed as its calibration (`compute_factor` = `memory_factor` =
speed, `data_factor` 1, source "emulated"; hopsmgr_agent.main); the master passes `compute_factor` to
the node wrapper as `--emulated-speed` (hopsmgr.master.commands), which sets `HOPS_EMULATED_SPEED`
(hopsmgr.node.ops); the runtime reads it as `rt.emulated_speed`. Each iteration of the example sleeps
`step_s / speed` in four equal phases (data, forward, backward, update), plus `miss_s / speed` in the
data phase of every `miss_every`-th iteration. So on a server of speed v one iteration lasts

    t(v) = (step_s + miss_s / miss_every) / v x (1 + step_overhead)

where `step_overhead` is the measured relative cost of the runtime's bookkeeping and of `sleep`
overshooting (0 by default: a calibration constant, not part of the example's arithmetic).

The example does not use its GPUs: one iteration lasts t(v) whatever the GPU count, and a job placed
over several servers runs one independent process per server, of which the master follows the primary
(the placement's first server: its progress, its exit). The true rate is therefore that of the primary
server alone; on a placement across GPU types the launch's speed-balanced shares (HOPS_RANK_SHARES)
give the primary's GPUs `node share x world GPUs / its GPUs` of an equal share of the global batch,
and its iterations last that much longer (`_pace`). Units follow the master: a job's work is
`iterations x batch x R1` samples (R1 its smallest GPU count, `JobSpec.samples_from_iterations`); the
per-GPU batch stays fixed, so an iteration on G GPUs does G / R1 iterations of that work (`rt.work`,
which the example loops on) and the true rate is `batch x G / t(v)`. The master measures it so too, from
the iteration time the runtime reports (the runtime's own samples/s, `batch / t(v)`, is the script's
rank's). Nothing is random: the emulation is deterministic, and measurements carry no noise.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, Server
from hopsmgr.sim.truth import Parts, TrueModel


@dataclass(frozen=True, slots=True)
class EmulatedModel:
    """One kind of emulated job: the example's `--step-seconds`, `--batch-size`, `--miss-every` and
    `--miss-seconds`, and the smallest GPU count of its requirement set (the master's iteration unit)."""

    name: str
    step_s: float
    batch_size: int
    base_gpus: int = 1
    miss_every: int = 0
    miss_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.step_s > 0 and self.batch_size > 0 and self.base_gpus > 0):
            raise ValueError(f"emulated model {self.name!r}: step_s, batch_size, base_gpus must be > 0")
        if self.miss_every < 0 or self.miss_s < 0:
            raise ValueError(f"emulated model {self.name!r}: miss_every and miss_s must be >= 0")

    @staticmethod
    def name_for(
        step_s: float, batch_size: int, base_gpus: int, miss_every: int = 0, miss_s: float = 0.0
    ) -> str:
        return f"emulated:step={step_s:g}:batch={batch_size}:r1={base_gpus}:miss={miss_every}x{miss_s:g}"

    def work_s(self) -> float:
        """Sleep of one iteration at speed 1, the mean over iterations (misses spread evenly)."""
        return self.step_s + (self.miss_s / self.miss_every if self.miss_every > 0 else 0.0)


class EmulatedWorld:
    """The truth of emulated jobs on emulated servers of the given speeds (see the module docstring)."""

    name = "emulated"

    def __init__(
        self,
        speeds: Mapping[str, float],
        models: Sequence[EmulatedModel],
        *,
        restart_s: float = 10.0,
        step_overhead: float = 0.0,
        default_speed: Mapping[str, float] | None = None,
    ) -> None:
        """`speeds`: server id -> emulated speed (as `hopsmgr.local.cluster.emulated_speed` gives it);
        `default_speed`: GPU type -> speed for servers not in `speeds`; `restart_s`: the restart cost the
        planner is told (the master's for a job without parameters: 10 s); `step_overhead`: see above."""
        if step_overhead < 0:
            raise ValueError("step_overhead must be >= 0")
        self.speeds = dict(speeds)
        self.default_speed = dict(default_speed or {})
        self.step_overhead = step_overhead
        self._models = {m.name: m for m in models}
        self._true = {m.name: TrueModel(m.name, 0.0, m.batch_size, restart_s) for m in models}

    # ---- the World protocol -------------------------------------------------------------------------
    def models(self) -> tuple[TrueModel, ...]:
        return tuple(self._true.values())

    def model(self, name: str) -> TrueModel:
        try:
            return self._true[name]
        except KeyError:
            raise ValueError(f"unknown model {name!r} in the emulated world") from None

    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted(self.default_speed))

    def speed(self, server: Server) -> float:
        speed = self.speeds.get(server.id, self.default_speed.get(server.gpu_type))
        if speed is None:
            raise ValueError(f"server {server.id!r} ({server.gpu_type}) has no emulated speed")
        return speed

    def iteration_s(self, model: str, server: Server, pace: float = 1.0) -> float:
        """One iteration of `model` on `server`: t(v) of the module docstring; with `pace` (`_pace`) the
        step's work scaled by the node's share of the batch, as the example scales it (not its misses)."""
        m = self._emulated(model)
        misses = m.miss_s / m.miss_every if m.miss_every > 0 else 0.0
        return (m.step_s * pace + misses) / self.speed(server) * (1.0 + self.step_overhead)

    def true_rate(
        self, model: str, config_parts: Parts, rng_key: int = 0, shares: Sequence[float] = ()
    ) -> float:
        if not config_parts:
            raise ValueError("a configuration needs at least one (server, gpus) part")
        m = self._emulated(model)
        pace = _pace(config_parts, shares)
        return m.batch_size * _gpus(config_parts) / self.iteration_s(model, config_parts[0][0], pace)

    def reported_rate(self, model: str, server: Server, gpus: int) -> float:
        """Samples/s as the master records them from the runtime's iteration time on a placement of
        `gpus` GPUs whose primary is `server` (equal shares): batch x gpus / iteration time."""
        return self._emulated(model).batch_size * gpus / self.iteration_s(model, server)

    def reference_rate(self, model: str, gpus: int, gpu_type: str | None = None) -> float:
        """The true rate on `gpus` GPUs of a nominal server of `gpu_type` (its default speed; the middle
        type by name when not given; speed 1 when unknown)."""
        types = sorted(self.default_speed)
        gtype = gpu_type or (types[len(types) // 2] if types else "")
        m = self._emulated(model)
        return (
            m.batch_size
            * gpus
            * self.default_speed.get(gtype, 1.0)
            / (m.work_s() * (1.0 + self.step_overhead))
        )

    def profile(self, model: str, server: Server, rng: random.Random, rng_key: int = 0) -> TimeProfile:
        """What the runtime's profile of the example gives, as the master reads it
        (hopsmgr.master.state.time_profile): four equal phases of step_s / 4 / v in sequence (pattern 2),
        the misses in the data phase."""
        m = self._emulated(model)
        scale = (1.0 + self.step_overhead) / self.speed(server)
        quarter = m.step_s / 4 * scale
        if m.miss_every > 0 and m.miss_s > 0:
            p_hit = 1.0 - 1.0 / m.miss_every
            return TimeProfile(
                quarter, quarter, quarter, quarter, quarter + m.miss_s * scale, p_hit, pattern=2
            )
        return TimeProfile(quarter, quarter, quarter, quarter, quarter, 1.0, pattern=2)

    def sample_rate(
        self,
        model: str,
        config_parts: Parts,
        rng: random.Random,
        rng_key: int = 0,
        shares: Sequence[float] = (),
    ) -> float:
        if not config_parts:
            raise ValueError("a configuration needs at least one (server, gpus) part")
        pace = _pace(config_parts, shares)
        m = self._emulated(model)
        return m.batch_size * _gpus(config_parts) / self.iteration_s(model, config_parts[0][0], pace)

    def calibration(self, server: Server) -> Calibration:
        speed = self.speed(server)
        return Calibration(compute_factor=speed, memory_factor=speed, data_factor=1.0, source="emulated")

    # ---- helpers ------------------------------------------------------------------------------------
    def _emulated(self, name: str) -> EmulatedModel:
        try:
            return self._models[name]
        except KeyError:
            raise ValueError(f"unknown model {name!r} in the emulated world") from None


def _gpus(config_parts: Parts) -> int:
    return sum(g for _, g in config_parts)


def _pace(config_parts: Parts, shares: Sequence[float]) -> float:
    """The factor on the primary server's step work under speed-balanced shares: the example's work per
    step scales with its node's share of the global batch over an equal one (examples/emulated_train.py:
    node_share x world GPUs / the node's GPUs; its misses are not scaled); 1 with equal shares."""
    world = sum(g for _, g in config_parts)
    first = config_parts[0][1]
    if len(shares) != world or first <= 0:
        return 1.0
    return sum(shares[:first]) * world / first
