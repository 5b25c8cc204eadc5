"""What a plan is: the value the planner returns, with the solver's statistics and per-job explanations.

Kept apart from the planner so the solver models (hopsmgr.core.planner, hopsmgr.core.classes) and the
code that reads plans (master, policies, simulator) share these types without importing each other.
`hopsmgr.core.planner` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hopsmgr.core.model import Config, GpuType, JobId, ServerId

PlanKind = Literal["first", "fragment"]


@dataclass(frozen=True, slots=True)
class ProfilingRun:
    job_id: JobId
    server_id: ServerId
    gpu_type: GpuType


@dataclass(frozen=True, slots=True)
class SolverStats:
    method: str = "none"
    model: str = "none"
    variables: int = 0
    constraints: int = 0
    config_s: float = 0.0
    build_s: float = 0.0
    solve_s: float = 0.0
    map_s: float = 0.0
    total_s: float = 0.0
    objective: float = 0.0
    bound: float | None = None
    gap: float | None = None
    proven: bool = True
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class CandidateView:
    config: str
    rate: float
    value: float


@dataclass(frozen=True, slots=True)
class JobExplain:
    position: int
    priority: float
    weight: float
    in_window: bool
    sensitivity: float
    may_span: bool
    candidates: tuple[CandidateView, ...] = ()
    chosen: str | None = None
    note: str = ""  # why the job was not a candidate of the program, when it was not


@dataclass(frozen=True, slots=True)
class Reservation:
    """Servers held for one waiting job: the placement it will start on and when that is expected."""

    job_id: JobId
    config: Config
    start_s: float  # when the reserved GPUs are expected to be free (running jobs' estimated ends)
    since_s: float  # when the job first got a reservation (kept across plans)
    due_s: float = 0.0  # the soonest start estimated so far: past it by a round, overrunning jobs may go


@dataclass(frozen=True, slots=True)
class Backfill:
    """A job started on reserved GPUs because its P90 finish falls before the reservation's start."""

    reserved_for: JobId
    until_s: float
    finish_p90_s: float


@dataclass(frozen=True, slots=True)
class Plan:
    kind: PlanKind
    now: float
    assignments: dict[JobId, Config]
    window: tuple[JobId, ...] = ()
    order: tuple[JobId, ...] = ()
    priorities: dict[JobId, float] = field(default_factory=dict)
    unplaceable: dict[JobId, str] = field(default_factory=dict)
    explain: dict[JobId, JobExplain] = field(default_factory=dict)
    stats: SolverStats = field(default_factory=SolverStats)
    idle_gpus: int = 0
    reservations: tuple[Reservation, ...] = ()  # hopsmgr.core.reserve
    backfills: dict[JobId, Backfill] = field(default_factory=dict)
