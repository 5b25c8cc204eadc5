"""Scheduler settings: the knobs of the Hops algorithm, as one frozen value passed down explicitly.

`hopsmgr.config` parses them from TOML (section [scheduler]); the simulator and the master hand the
same object to the planner. Defaults follow HOPS.md (lambda = 1, sigma = 1.4, gap 1%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

from hopsmgr.core.priority import DEFAULT_LR_GUARD

PriorityKind = Literal["latency_ratio", "fifo", "las", "sjf", "srtf", "ftf", "srtf_lr"]
PRIORITY_KINDS: tuple[str, ...] = ("latency_ratio", "fifo", "las", "sjf", "srtf", "ftf", "srtf_lr")
SolverMode = Literal["auto", "exact", "classes"]
GainBase = Literal["auto", "smallest", "expected"]
GAIN_BASES: tuple[str, ...] = ("auto", "smallest", "expected")
SpeedValue = Literal["priority", "neutral"]
SPEED_VALUES: tuple[str, ...] = ("priority", "neutral")
SOLVER_MODES: tuple[str, ...] = ("auto", "exact", "classes")
# [ours] the smallest knee of the weights' exponent: priorities are at least the ILP bias (0.01) apart
# from 0, and a knee far below that only divides them into overflow
MIN_KNEE = 1e-3
# [ours] `lr_hysteresis`: measured at 0.1 and 0.25 on paper-512, Gavel's traces, five other workloads
# and the gang scenario (docs/results.md, session 43)
LR_HYSTERESIS_DEFAULT = 0.1


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    round_seconds: float = 120.0
    lambda_: float = 1.0
    # [ours] a knee in the weights' exponent: priorities (plus bias) below `lambda_knee` are weighed with
    # the exponent `lambda_below`, those above it with `lambda_` (continuous at the knee), so that jobs
    # that have waited little compete mostly on throughput and fairness takes over past the knee; 0 =
    # one exponent, the paper's (docs/scheduling.md, "the weights' exponent")
    lambda_knee: float = 0.0
    lambda_below: float = 0.5
    # [ours] with the latency-ratio priority, first plans count two jobs' priority values (latency
    # ratios times tenant weights) within this much of each other as equal, the tie going to the job
    # that holds the GPUs (hopsmgr.core.priority.with_hysteresis); 0 = off
    lr_hysteresis: float = LR_HYSTERESIS_DEFAULT
    sigma: float = 1.4
    window: bool = True
    fragment_plans: bool = True
    sensitivity_adjustment: bool = True
    # [ours] fragment plans also take jobs from behind the window that fit the idle GPUs (core.window);
    # off by default: it breaks the no-preemption-cycle property on rare scenarios (docs/scheduling.md)
    idle_backfill: bool = False
    gap: float = 0.01
    time_limit_s: float = 5.0
    priority: PriorityKind = "latency_ratio"
    rnum: int = 4
    solver: SolverMode = "auto"
    exact_max_variables: int = 2000
    restart_penalty: bool = True
    preemption_cost: bool = True
    projected_priority: bool = True
    move_min_gain: float = 0.15  # [ours] a same-count move that frees no room must gain this much
    # [ours] "srtf_lr": the latency ratio past which a job climbs over the shortest-remaining order
    lr_guard: float = DEFAULT_LR_GUARD
    # [ours] "srtf_lr" and "latency_ratio": a running job on the critical path of the backlog's makespan
    # (its remaining run time within a round of the larger of the longest one and the time the cluster
    # needs for all remaining work) ranks as if one past its guard, or as if its latency ratio were the
    # queue's highest (core.priority.critical_path_jobs, core.queueorder); off: it costs average JCT on
    # small clusters (docs/results.md)
    critical_path: bool = False
    # [ours] what a configuration's throughput is divided by in the program (G): "smallest" the job's
    # smallest configuration on the slowest type (Sia's and the paper's), "expected" the rate its
    # expected run time assumes (then w x G with the srtf_lr priority is the share of the job's
    # remaining work done per hour: Smith's rule); "auto": "expected" with srtf_lr, else "smallest"
    # (docs/results.md measures both with both priorities)
    gain_base: GainBase = "auto"
    # [ours] how the program values a configuration's speed above the rate the job's expected run time
    # assumes (G = E there): "priority" at the job's own weight (w x G, the paper's), "neutral" at one
    # weight for all jobs of the plan (the median of theirs): w x min(G, E) + w_median x max(0, G - E),
    # so that faster and larger configurations than the expected ones go where they gain the most per
    # GPU, whatever the job's length (docs/scheduling.md section 7)
    speed_value: SpeedValue = "priority"
    profiling_iterations: int = 30
    raqlr_hours: float = 6.0
    min_attempt_s: float = 300.0
    cbc_path: str = ""  # the CBC binary; "" = the one PuLP bundles
    fairshare: bool = True  # tenants' decayed use scales their weight (hopsmgr.core.fairshare)
    fairshare_half_life_h: float = 24.0
    fairshare_strength: float = 5.0  # the factor is 2 ** -(strength x (use share / weight share - 1))
    fairshare_reference: str = ""  # the reference GPU type of use; "" = the type with the most GPUs
    profiling_timeout_s: float = 600.0  # [ours] a profiling run that wrote no profile by then fails its job
    default_run_s: float = 3600.0  # [ours] expected run time of a job without the runtime and without --time
    mixed_types: bool = True  # [ours] low-sensitivity jobs may span GPU types, batches split by speed
    # [ours] the planner estimates a job on a GPU type it has no profile on from its profile on another
    # type and the type ratios of the jobs profiled on both (hopsmgr.core.transfer)
    transfer_estimates: bool = True
    reservations: bool = False  # [ours] reserve and drain servers for big waiting jobs (core.reserve)
    reserve_min_gpus: int = 8  # a job asking for at least this many GPUs may get a reservation
    reserve_after_lr: float = 0.5  # ... once its latency ratio (wait / expected run time) reaches this
    reserve_preempt: bool = True  # reserved servers' jobs that would not end within a round are preempted
    reserve_at_head: bool = True  # only for a big job the queue puts ahead of every narrower waiting job
    reserve_share: float = 0.5  # at most this share of the cluster's GPUs is reserved at once
    backfill_p90_factor: float = 1.25  # a backfilled job's P90 run time: the estimate times this

    def __post_init__(self) -> None:
        def bad(name: str, reason: str) -> ValueError:
            return ValueError(f"scheduler.{name}: {reason}, got {getattr(self, name)!r}")

        if not self.round_seconds > 0:
            raise bad("round_seconds", "must be > 0")
        if not (math.isfinite(self.lambda_) and self.lambda_ >= 0):
            raise bad("lambda_", "must be a finite number >= 0")
        if not (math.isfinite(self.lambda_knee) and (self.lambda_knee == 0 or self.lambda_knee >= MIN_KNEE)):
            raise bad("lambda_knee", f"must be 0 (no knee) or a finite number >= {MIN_KNEE}")
        if not (math.isfinite(self.lambda_below) and self.lambda_below >= 0):
            raise bad("lambda_below", "must be a finite number >= 0")
        if not (math.isfinite(self.lr_hysteresis) and self.lr_hysteresis >= 0):
            raise bad("lr_hysteresis", "must be a finite number >= 0 (0 = off)")
        if not self.sigma >= 1.0:
            raise bad("sigma", "must be >= 1.0")
        if not 0 <= self.gap < 1:
            raise bad("gap", "must be in [0, 1)")
        if not self.time_limit_s > 0:
            raise bad("time_limit_s", "must be > 0")
        if self.priority not in PRIORITY_KINDS:
            raise bad("priority", f"must be one of {', '.join(PRIORITY_KINDS)}")
        if not (math.isfinite(self.lr_guard) and self.lr_guard >= 0):
            raise bad("lr_guard", "must be a number >= 0")
        if not (isinstance(self.rnum, int) and self.rnum >= 1):
            raise bad("rnum", "must be an integer >= 1")
        if not (math.isfinite(self.move_min_gain) and self.move_min_gain >= 0):
            raise bad("move_min_gain", "must be a number >= 0")
        if self.gain_base not in GAIN_BASES:
            raise bad("gain_base", f"must be one of {', '.join(GAIN_BASES)}")
        if self.speed_value not in SPEED_VALUES:
            raise bad("speed_value", f"must be one of {', '.join(SPEED_VALUES)}")
        if self.solver not in SOLVER_MODES:
            raise bad("solver", f"must be one of {', '.join(SOLVER_MODES)}")
        if not (isinstance(self.exact_max_variables, int) and self.exact_max_variables >= 0):
            raise bad("exact_max_variables", "must be an integer >= 0")
        if not (isinstance(self.profiling_iterations, int) and 10 <= self.profiling_iterations <= 50):
            raise bad("profiling_iterations", "must be an integer in [10, 50]")
        if not self.raqlr_hours > 0:
            raise bad("raqlr_hours", "must be > 0")
        if not self.min_attempt_s >= 0:
            raise bad("min_attempt_s", "must be >= 0")
        if not (math.isfinite(self.fairshare_half_life_h) and self.fairshare_half_life_h > 0):
            raise bad("fairshare_half_life_h", "must be a number of hours > 0")
        if not (math.isfinite(self.fairshare_strength) and self.fairshare_strength >= 0):
            raise bad("fairshare_strength", "must be a number >= 0")
        if not isinstance(self.fairshare_reference, str):
            raise bad("fairshare_reference", "must be a GPU type name")
        if not (isinstance(self.profiling_timeout_s, (int, float)) and self.profiling_timeout_s > 0):
            raise bad("profiling_timeout_s", "must be a number of seconds > 0")
        if not (isinstance(self.default_run_s, (int, float)) and self.default_run_s > 0):
            raise bad("default_run_s", "must be a number of seconds > 0")
        if not (isinstance(self.reserve_min_gpus, int) and self.reserve_min_gpus >= 1):
            raise bad("reserve_min_gpus", "must be an integer >= 1")
        if not (math.isfinite(self.reserve_after_lr) and self.reserve_after_lr >= 0):
            raise bad("reserve_after_lr", "must be a number >= 0")
        if not 0 <= self.reserve_share <= 1:
            raise bad("reserve_share", "must be in [0, 1]")
        if not (math.isfinite(self.backfill_p90_factor) and self.backfill_p90_factor >= 1):
            raise bad("backfill_p90_factor", "must be a number >= 1")
        if not isinstance(self.cbc_path, str) or "\0" in self.cbc_path:
            raise bad("cbc_path", "must be a path (a string without NUL)")

    @property
    def effective_gain_base(self) -> str:
        """`gain_base` with "auto" resolved: "expected" with the srtf_lr priority, else "smallest"."""
        if self.gain_base != "auto":
            return self.gain_base
        return "expected" if self.priority == "srtf_lr" else "smallest"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
