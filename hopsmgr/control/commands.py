"""Commands out of the scheduler state machine: what the driver must do, in order.

`Persist` comes first in every list that changes state and holds the records to write before anything
else is acted on (the master writes them in one transaction; the simulator keeps them in memory). Node
commands name the attempt they act on; launches are emitted only once the stops they wait for have
ended, so a driver can act on each command as it comes. Every command carries the `stimulus_id` of the
event that caused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobSpec, ServerId
from hopsmgr.core.planner import PlanKind

StopReason = Literal["preempted", "migrated", "cancelled", "not_needed", "job_ended"]


@dataclass(frozen=True, slots=True)
class Command:
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class JobChange:
    """A job's state changed (through the lifecycle table), with its counters at that instant."""

    job_id: JobId
    old: JobState | None
    new: JobState
    at: float
    kind: str
    message: str
    counters: Mapping[str, float]
    has_checkpoint: bool


@dataclass(frozen=True, slots=True)
class JobNote:
    """A history line of a job that changes no state (profiled, moving, checkpoint not moved...)."""

    job_id: JobId
    at: float
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """An attempt as stored: created, started or ended (the fields that are set so far)."""

    id: str
    job_id: JobId
    placement: Config
    profiling: bool
    created: float
    devices: Mapping[ServerId, tuple[int, ...]]
    resume: bool
    started: float | None = None
    stopping: bool = False
    ended: float | None = None
    end_reason: str | None = None
    exit_code: int | None = None
    log_tail: str | None = None


@dataclass(frozen=True, slots=True)
class ThroughputSample:
    """A throughput the estimator took in, for the job's history, beside what the estimator expected
    there just before (None: it had no estimate), so the history outlives the job's estimates."""

    job_id: JobId
    at: float
    placement: Config
    samples_per_s: float
    estimated_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Every tenant's decayed use (reference-GPU-seconds) and when it was last charged (fair share)."""

    usage: tuple[tuple[str, float, float], ...]  # (tenant, used, at)


@dataclass(frozen=True, slots=True)
class ProfilingWaits:
    """The latest jobs' profiling times, PROFILING to QUEUED (seconds, oldest first), after a new one."""

    waits: tuple[float, ...]


Record = JobChange | JobNote | AttemptRow | ThroughputSample | UsageRecord | ProfilingWaits


@dataclass(frozen=True, slots=True)
class Persist(Command):
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class LaunchAttempt(Command):
    """Start a run attempt of `job_id` on `placement` (GPU indices per server in `devices`)."""

    attempt_id: str
    job_id: JobId
    placement: Config
    devices: Mapping[ServerId, tuple[int, ...]]
    resume: bool
    # Each rank's share of the global batch on a placement across GPU types (Estimator.rank_shares);
    # () = equal shares.
    shares: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class StartProfiling(Command):
    """Start a short profiling run of `job_id` on one GPU of `server_id` (of type `gpu_type`)."""

    attempt_id: str
    job_id: JobId
    server_id: ServerId
    gpu_type: GpuType
    devices: Mapping[ServerId, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class CheckpointAndStop(Command):
    """Ask the attempt to write a checkpoint and exit; its GPUs stay held until it has ended."""

    attempt_id: str
    job_id: JobId
    placement: Config
    reason: StopReason


@dataclass(frozen=True, slots=True)
class StopAttempt(Command):
    """Stop the attempt without a checkpoint (cancelled, not needed any more)."""

    attempt_id: str
    job_id: JobId
    placement: Config
    reason: StopReason


@dataclass(frozen=True, slots=True)
class PlanRequest(Command):
    """Plan over this immutable snapshot (hopsmgr.control.planning.compute_plan), then hand the answer
    back as a PlanReady event with the same `request_id`."""

    request_id: int
    kind: PlanKind
    snapshot: ClusterSnapshot
    to_profile: tuple[JobSpec, ...] = ()
    starving: frozenset[JobId] = frozenset()
    profiling_budget: int = 0
    min_attempt_s: float = 0.0  # the scheduler's: profiling for starving jobs spares protected attempts
    round_s: float = 120.0  # the scheduler's round: how long a job may starve before it takes GPUs


@dataclass(frozen=True, slots=True)
class ContinuePlan(Command):
    """Part of a plan is applied, or of a plan request prepared, and the rest waits
    (ControlSettings.plan_slice, request_slice): send PlanContinue once the driver has served whatever
    else waits (the master: its next turn of the event loop)."""


@dataclass(frozen=True, slots=True)
class PlanSoon(Command):
    """Something changed that a fragment plan may use: send RoundTick(kind) once the burst settles."""

    kind: PlanKind = "fragment"


@dataclass(frozen=True, slots=True)
class Reply(Command):
    """The answer to a request event: `error` None when it was accepted."""

    job_id: JobId | None = None
    error_field: str | None = None
    error: str | None = None
    status: int = 200


@dataclass(frozen=True, slots=True)
class NodeReply(Command):
    """The answer to a NodeReported: the attempts its agent must stop (unknown here, or of ended jobs)."""

    node_id: ServerId
    stop: tuple[str, ...] = ()


NodeCommand = LaunchAttempt | StartProfiling | CheckpointAndStop | StopAttempt
