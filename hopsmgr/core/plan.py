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
