"""The time modules of one training iteration and the iteration-time formula (HOPS.md 3): what a job's
profile holds (`TimeProfile`), how an iteration's time follows from it on a server (`iteration_time`,
`expected_iteration_time`) and the all-reduce term (`allreduce_time`). Pure; used by the estimator
(hopsmgr.core.estimator) and the simulator's worlds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from hopsmgr.core.model import ModelError

TC_EXPOSED = 0.2  # share of the communication time that does not overlap backward (Tc~ = 0.2 * Tc)


def is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def require(name: str, value: object, *, positive: bool) -> None:
    if not is_real(value) or value < 0 or (positive and value == 0):  # type: ignore[operator]
        bound = "> 0" if positive else ">= 0"
        raise ModelError(f"{name} must be a finite number {bound}, got {value!r}")


def require_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelError(f"{name} must be a positive integer, got {value!r}")


def require_shape(gpus_here: object, n_servers: object) -> None:
    require_count("gpus_here", gpus_here)
    require_count("n_servers", n_servers)


@dataclass(frozen=True, slots=True)
class TimeProfile:
    """Basic time modules of one iteration, measured by the profiler on ONE GPU of a server whose
    calibration is `measured_on` (given to `Estimator.add_profile`). Times in seconds."""

    tf_s: float  # forward
    tb_s: float  # backward
    tu_s: float  # weight update
    td_hit_s: float  # data time on cache hit (mean mu_c)
    td_miss_s: float  # data time on cache miss (mean mu_l)
    p_cache: float = 1.0  # probability of a cache hit (p_load = 1 - p_cache)
    tw_hit_s: float = 0.0  # sync wait when data hit
    tw_miss_s: float = 0.0  # sync wait when data missed (Tw correlates with Td)
    pattern: int = 1  # 1: data loading overlaps backward+comm; 2: it does not
    td_hit_sigma: float = 0.0  # kept for reporting; the estimate uses expectations
    td_miss_sigma: float = 0.0

    def __post_init__(self) -> None:
        for name in _TIME_FIELDS:
            require(f"time profile: {name}", getattr(self, name), positive=False)
        if not (is_real(self.p_cache) and 0.0 <= self.p_cache <= 1.0):
            raise ModelError(f"time profile: p_cache must be within [0, 1], got {self.p_cache!r}")
        if type(self.pattern) is not int or self.pattern not in (1, 2):
            raise ModelError(f"time profile: pattern must be 1 or 2, got {self.pattern!r}")
        if self.tf_s + self.tb_s + self.tu_s <= 0:
            raise ModelError("time profile: tf_s + tb_s + tu_s must be > 0 (an iteration takes time)")


_TIME_FIELDS = tuple(f.name for f in fields(TimeProfile) if f.name not in ("p_cache", "pattern"))

# [ours] A job that does not use hopsmgr.runtime has no profile: it counts its work in seconds at
# nominal speed (batch 1, one "iteration" a second on one nominal GPU), so only the server's compute
# calibration (and what the type layer learns from its run) tells GPU types and servers apart.
RUN_TIME_PROFILE = TimeProfile(tf_s=1.0, tb_s=0.0, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)


def iteration_time(tf: float, tb: float, tu: float, td: float, tw: float, tc: float, pattern: int) -> float:
    """T_iter (HOPS.md 3); pattern 1 overlaps data loading with backward and communication."""
    busy = max(tb + TC_EXPOSED * tc, tc) + tu
    if pattern == 1:
        return max(td, busy) + tf + tw
    if pattern == 2:
        return td + busy + tf + tw
    raise ModelError(f"pattern must be 1 or 2, got {pattern!r}")


def allreduce_time(
    params_bytes: float, gpus_here: int, n_servers: int, link_gbps: float, net_gbps: float
) -> float:
    """Tc: ring all-reduce over the `gpus_here` GPUs of one server, or the network term across servers.

    Bandwidths are in GB/s (1e9 bytes per second), as in `Calibration`.
    """
    require("params_bytes", params_bytes, positive=False)
    require_shape(gpus_here, n_servers)
    require("link_gbps", link_gbps, positive=True)
    require("net_gbps", net_gbps, positive=True)
    if n_servers > 1:
        return params_bytes / (net_gbps * 1e9)
    return params_bytes / (link_gbps * 1e9) * (gpus_here - 1) / gpus_here


def expected_iteration_time(
    profile: TimeProfile, tc: float, compute_scale: float = 1.0, data_scale: float = 1.0
) -> float:
    """E[T_iter] = p_cache * T(hit) + (1 - p_cache) * T(miss); times divided by the scales."""
    require("tc", tc, positive=False)
    require("compute_scale", compute_scale, positive=True)
    require("data_scale", data_scale, positive=True)
    return iteration_time_of(profile, tc, compute_scale, data_scale)


def iteration_time_of(profile: TimeProfile, tc: float, compute_scale: float, data_scale: float) -> float:
    """`expected_iteration_time` without the argument checks (the estimator's own, already valid, calls).

    `iteration_time` written out for the hit and the miss (the same arithmetic in the same order): this
    is the estimator's innermost call, a few hundred thousand times in a cold 4,096-GPU round."""
    cs, ds, p = compute_scale, data_scale, profile.p_cache
    tf = profile.tf_s / cs
    busy = max(profile.tb_s / cs + TC_EXPOSED * tc, tc) + profile.tu_s / cs
    if profile.pattern == 1:
        hit = max(profile.td_hit_s / ds, busy) + tf + profile.tw_hit_s / ds
        if p >= 1.0:
            return hit
        miss = max(profile.td_miss_s / ds, busy) + tf + profile.tw_miss_s / ds
    else:
        hit = profile.td_hit_s / ds + busy + tf + profile.tw_hit_s / ds
        if p >= 1.0:
            return hit
        miss = profile.td_miss_s / ds + busy + tf + profile.tw_miss_s / ds
    return p * hit + (1.0 - p) * miss
