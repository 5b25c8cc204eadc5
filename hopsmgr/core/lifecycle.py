"""Job states and the one table of legal transitions.

Every state change of a job, in the master and in the simulator, goes through `transition`. The
documentation's lifecycle diagram is generated from `TRANSITIONS` (see `mermaid_diagram`).
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    PROFILING = "PROFILING"
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    CHECKPOINTING = "CHECKPOINTING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class IllegalTransition(ValueError):
    def __init__(self, current: JobState, new: JobState) -> None:
        super().__init__(f"illegal job state transition {current.value} -> {new.value}")
        self.current = current
        self.new = new


TERMINAL: frozenset[JobState] = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
LIVE: frozenset[JobState] = frozenset(s for s in JobState if s not in TERMINAL)

_S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # PENDING -> QUEUED skips profiling when every GPU type already has a profile for the job.
    _S.PENDING: frozenset({_S.PROFILING, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.PROFILING: frozenset({_S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.QUEUED: frozenset({_S.LAUNCHING, _S.FAILED, _S.CANCELLED}),
    # LAUNCHING -> QUEUED: the launch failed on the node's side (node lost, command refused).
    _S.LAUNCHING: frozenset({_S.RUNNING, _S.QUEUED, _S.FAILED, _S.CANCELLED}),
    # RUNNING -> QUEUED: the node was lost; the job resumes from its last checkpoint.
    _S.RUNNING: frozenset({_S.CHECKPOINTING, _S.QUEUED, _S.COMPLETED, _S.FAILED, _S.CANCELLED}),
    # CHECKPOINTING -> COMPLETED: the job finished its work before it saw the checkpoint signal.
    _S.CHECKPOINTING: frozenset({_S.QUEUED, _S.COMPLETED, _S.FAILED, _S.CANCELLED}),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


def can_transition(current: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[current]


def transition(current: JobState, new: JobState) -> JobState:
    """Return `new` if the table allows current -> new, else raise IllegalTransition."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(current, new)
    return new


def mermaid_diagram() -> str:
    """The lifecycle as a Mermaid state diagram, drawn from TRANSITIONS."""
    lines = ["stateDiagram-v2", "    [*] --> PENDING"]
    for src in JobState:
        for dst in sorted(TRANSITIONS[src], key=lambda s: list(JobState).index(s)):
            lines.append(f"    {src.value} --> {dst.value}")
    for state in sorted(TERMINAL, key=lambda s: list(JobState).index(s)):
        lines.append(f"    {state.value} --> [*]")
    return "\n".join(lines) + "\n"
