"""Events into the scheduler state machine (hopsmgr.control.machine): what happened, with `stimulus_id`.

Every event is a frozen dataclass. Drivers (the master, the simulator) turn what they observe (an API
call, a heartbeat, a node command's result, a timer, a finished plan) into one of these and hand it to
`SchedulerMachine.handle(event, now)`; the commands that come back carry the same `stimulus_id`, and so
do the log lines the drivers write for them, so any action can be traced back to its cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.model import Calibration, GpuType, JobId, JobSpec, Server, ServerId
from hopsmgr.core.planner import Plan, PlanKind, ProfilingRun

AttemptEndReason = Literal["exited", "vanished", "node_lost", "cancelled", "stop_failed"]


@dataclass(frozen=True, slots=True)
class Event:
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class JobSubmitted(Event):
    """A new job (already validated by the caller's schema). `profiles` may carry throughput profiles
    known in advance (the simulator without a profiling phase); with one for every GPU type the job
    skips profiling."""

    spec: JobSpec
    submitted_by: str = ""
    profiles: Mapping[GpuType, tuple[TimeProfile, Calibration]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobCancelled(Event):
    job_id: JobId
    by: str = ""


@dataclass(frozen=True, slots=True)
class AttemptStarted(Event):
    """The node confirmed the attempt's launch (or a heartbeat reported it running)."""

    attempt_id: str


@dataclass(frozen=True, slots=True)
class AttemptLaunchFailed(Event):
    """The launch did not happen. `job_fault`: the node ran the wrapper and the command could not start
    (the job fails); otherwise the node's fault (unreachable, refused): the job goes back to the queue."""

    attempt_id: str
    job_fault: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class AttemptProgressed(Event):
    """Progress of a running attempt: iterations done (of its job's per-minimum-GPU batches) and the
    measured throughput; `td_s`/`tw_s` the data-loading times when measured."""

    attempt_id: str
    done_samples: float
    samples_per_s: float = 0.0
    td_s: float = 0.0
    tw_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AttemptEnded(Event):
    """An attempt's process ended. `code` None with `reason` "vanished": nobody knows how it ended;
    negative codes are deaths by signal. `done_samples`: its job's progress at the end, when known."""

    attempt_id: str
    reason: AttemptEndReason = "exited"
    code: int | None = None
    checkpointed: bool = False
    profile: TimeProfile | None = None
    done_samples: float | None = None
    log_tail: str = ""
    node_id: ServerId | None = None  # reported by this node's agent: counts only from its primary node


@dataclass(frozen=True, slots=True)
class NodeBeat(Event):
    """A node's heartbeat: healthy or not, the server as the planner should see it (calibration
    applied), and how many GPUs it has usable now."""

    node_id: ServerId
    healthy: bool = True
    server: Server | None = None
    usable_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class RunReport:
    """One attempt a heartbeat lists as running, with its progress when the agent sent some."""

    attempt_id: str
    iteration: float | None = None  # iterations done at the job's smallest GPU count
    samples_per_s: float = 0.0  # the samples the script counted per second (its own unit)
    td_s: float = 0.0
    tw_s: float = 0.0
    measuring: bool = False  # the rate was measured in running (not profiling) mode
    iteration_s: float = 0.0  # mean seconds per recent iteration (0: not reported)
    # `iteration` is the runtime's work (an iteration on G GPUs counted as G / R1 of them); False: an
    # older runtime (no work in its progress file) reported plain iterations, each counted as one
    work_counted: bool = False


@dataclass(frozen=True, slots=True)
class NodeReported(Event):
    """What a node's agent reports running (after its finished attempts were handed over as
    AttemptEnded). `finished` lists the attempts it reported ended; `first` marks its first heartbeat
    since the machine started. The machine answers with a NodeReply naming what the agent must stop."""

    node_id: ServerId
    running: tuple[RunReport, ...] = ()
    finished: tuple[str, ...] = ()
    first: bool = False


@dataclass(frozen=True, slots=True)
class NodeChanged(Event):
    """A node's planning view changed without a heartbeat of its own (another node's calibration moved
    the median of its type), or the GPUs it can use changed."""

    node_id: ServerId
    server: Server
    usable_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class NodeCommandFailed(Event):
    """A command could not reach a node (SSH unreachable, auth, host key): no new work there a while."""

    node_id: ServerId
    message: str = ""


@dataclass(frozen=True, slots=True)
class NodeDrained(Event):
    node_id: ServerId
    drained: bool = True


@dataclass(frozen=True, slots=True)
class StateRestored(Event):
    """The live jobs and open attempts of a store, handed over once when a driver starts (a master
    restart): the machine takes them as they are, then repairs what cannot be resumed."""

    jobs: tuple[object, ...] = ()  # hopsmgr.control.records.Job
    attempts: tuple[object, ...] = ()  # hopsmgr.control.records.Attempt
    attempt_seq: int = 0
    drained: frozenset[ServerId] = frozenset()
    usage: tuple[tuple[str, float, float], ...] = ()  # each tenant's (used, at): fair share's memory
    profiling_waits: tuple[float, ...] = ()  # the latest profiling times (the forecasts' hold)


@dataclass(frozen=True, slots=True)
class HealthTick(Event):
    """Time passed: nodes silent for too long become SUSPECT, then LOST (their attempts end)."""


@dataclass(frozen=True, slots=True)
class RoundTick(Event):
    """Time for a plan: "first" every round, "fragment" when the machine asked for one (PlanSoon)."""

    kind: PlanKind = "first"


@dataclass(frozen=True, slots=True)
class PlanReady(Event):
    """The planner's answer to a PlanRequest: the plan and the profiling runs it chose."""

    request_id: int
    plan: Plan
    runs: tuple[ProfilingRun, ...] = ()
    planner_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PlanContinue(Event):
    """Take the next step of the plan request being prepared or of the plan being applied (the answer
    to a ContinuePlan command)."""
