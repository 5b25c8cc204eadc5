"""Fair share with memory: each tenant's decayed use in reference-GPU-seconds, and its priority factor.

A tenant is charged for the GPUs its jobs hold, each second of a GPU weighted by how fast that GPU is
for the job relative to the reference GPU type (`speed`): an hour of a fast GPU costs more than an hour
of a slow one. What was charged decays with a half-life, so old use is forgiven. The planner multiplies
a tenant's weight by its factor `2 ** -(k x (use share / weight share - 1))`, after the classic formula
of Slurm's multifactor plugin (`2 ** -(use / share)`) made neutral at the fair share and steeper with
k (`fairshare_strength`): 1 for a tenant at exactly its share, 2^k for one that used nothing, 2^-k for
one that used twice its share. Asking for more GPUs than a job needs buys no share: the GPUs held are
charged, and the tenant's later jobs rank lower.

Pure: times are passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import Config, GpuType, JobSpec, Server, ServerId

HOUR_S = 3600.0
# [ours] How steeply the factor falls with use above the share. A job's latency ratio grows with 1/age,
# so a tenant whose jobs ask for twice the GPUs (and run twice as fast) ranks twice as high for the same
# wait; the factor must outweigh that: at equilibrium the share exceeds the fair one by 1/(4 x strength)
# of the cluster for such a doubling (5: 0.55 of it for a tenant entitled to half).
DEFAULT_STRENGTH = 5.0


@dataclass(slots=True)
class TenantUsage:
    """One tenant's decayed use (reference-GPU-seconds) as of `at`."""

    tenant: str
    used: float = 0.0
    at: float = 0.0

    def decayed(self, now: float, half_life_h: float) -> float:
        return self.used * decay(now - self.at, half_life_h)

    def charge(self, amount: float, now: float, half_life_h: float) -> None:
        self.used = self.decayed(now, half_life_h) + max(0.0, amount)
        self.at = max(self.at, now)


def decay(elapsed_s: float, half_life_h: float) -> float:
    """What is left of one unit of use after `elapsed_s` (1.0 for no time, or no half-life)."""
    if elapsed_s <= 0 or not math.isfinite(half_life_h) or half_life_h <= 0:
        return 1.0
    return 0.5 ** (elapsed_s / (half_life_h * HOUR_S))


def reference_type(servers: Iterable[Server], configured: str = "") -> GpuType:
    """The configured reference GPU type, else the type with the most GPUs (ties: by name)."""
    totals: dict[GpuType, int] = {}
    for s in servers:
        totals[s.gpu_type] = totals.get(s.gpu_type, 0) + s.gpus
    return reference_of_totals(totals, configured)


def reference_of_totals(type_gpus: Mapping[GpuType, int], configured: str = "") -> GpuType:
    """`reference_type` from the GPUs per type (for a caller that keeps them)."""
    if configured:
        return configured
    if not type_gpus:
        return ""
    return min(type_gpus, key=lambda t: (-type_gpus[t], t))


def speed(job: JobSpec, gpu_type: GpuType, reference: GpuType, estimator: Estimator) -> float:
    """How many reference GPUs one GPU of `gpu_type` is worth for this job: its measured per-GPU rate
    there over its rate on the reference type; 1.0 when either is unknown (not profiled yet)."""
    if gpu_type == reference:
        return 1.0
    here = estimator.type_rate(job, gpu_type)
    there = estimator.type_rate(job, reference)
    if here is None or there is None or here <= 0 or there <= 0:
        return 1.0
    return here / there


def charge_rate(
    job: JobSpec,
    config: Config,
    servers: Mapping[ServerId, Server],
    reference: GpuType,
    estimator: Estimator,
) -> float:
    """Reference-GPU-seconds per second that holding `config` costs the job's tenant."""
    total = 0.0
    for sid, gpus in config.parts:
        server = servers.get(sid)
        gpu_type = server.gpu_type if server is not None else reference
        total += gpus * speed(job, gpu_type, reference, estimator)
    return total


def factors(
    usage: Mapping[str, float],
    weights: Mapping[str, float],
    tenants: Iterable[str],
    strength: float = DEFAULT_STRENGTH,
) -> dict[str, float]:
    """Each tenant's fair-share factor `2 ** -(strength x (use share / weight share - 1))` among
    `tenants` (those with live jobs): 1 at exactly its share, above 1 below it; 1.0 for all while none
    of them has used anything."""
    names = sorted(set(tenants))
    total_use = sum(max(0.0, usage.get(t, 0.0)) for t in names)
    total_weight = sum(max(0.0, weights.get(t, 1.0)) for t in names)
    if total_use <= 0 or total_weight <= 0:
        return dict.fromkeys(names, 1.0)
    out: dict[str, float] = {}
    for t in names:
        share = max(0.0, weights.get(t, 1.0)) / total_weight
        used = max(0.0, usage.get(t, 0.0)) / total_use
        out[t] = 0.0 if share <= 0 else 2.0 ** (-strength * (used / share - 1.0))
    return out
