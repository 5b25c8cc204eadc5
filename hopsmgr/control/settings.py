"""The scheduler state machine's settings (`ControlSettings`): the scheduling algorithm's own knobs
(hopsmgr.core.settings.SchedulerSettings) and what its drivers choose: whether fragment plans and
profiling runs are made, node health timeouts, how often throughput is observed, and whether plans are
applied and plan requests prepared in slices (the master) or at once (the simulator). Frozen; read by
hopsmgr.control.machine and the modules it drives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hopsmgr.core.settings import SchedulerSettings


@dataclass(frozen=True, slots=True)
class ControlSettings:
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    fragment_plans: bool = True  # the policy's: plan idle GPUs between rounds
    profiling: bool = True  # new jobs get profiling runs (off: they need profiles at submission)
    profiling_share: float = 0.25
    observe_every_s: float = 10.0  # at most one throughput observation per attempt this often
    suspect_after_s: float = 15.0
    lost_after_s: float = 60.0
    exec_error_backoff_s: float = 60.0
    heartbeat_interval_s: float = 5.0
    # apply a plan this many actions at a time, other events handled in between (ContinuePlan /
    # PlanContinue); None: at once. The master slices, so that a plan of a thousand launches does not
    # hold up heartbeats; the simulator applies at once (nothing can happen in between there)
    plan_slice: int | None = None
    # prepare a plan request in steps of this many jobs of the profiling pass, other events handled in
    # between (ContinuePlan / PlanContinue, as plan_slice); None: in one step (the simulator)
    request_slice: int | None = None
