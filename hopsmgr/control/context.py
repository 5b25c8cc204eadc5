"""What the machine's helper modules use of the scheduler state machine, as a Protocol.

`MachineCore` is the part of `SchedulerMachine` (hopsmgr.control.machine) that hopsmgr.control.nodes,
limits, usage, cycle and acting work through: its state, settings and estimator, the event's time and
stimulus, and its doors for records, commands and state changes. They annotate with it instead of
importing the machine (which imports them); the machine satisfies it structurally (mypy checks that
where it hands itself to them). The plan cycle's own bookkeeping is hopsmgr.control.cycle.PlanCycle.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from hopsmgr.control.commands import AttemptRow, Command, Record
from hopsmgr.control.events import AttemptProgressed
from hopsmgr.control.records import Attempt, ControlState, Job
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobSpec


class MachineCore(Protocol):
    """The scheduler state machine as its helper modules see it (see the module)."""

    attempt_seq: int  # the highest attempt number given (raised by a restore)

    @property
    def state(self) -> ControlState: ...

    @property
    def settings(self) -> ControlSettings: ...

    @property
    def estimator(self) -> Estimator: ...

    @property
    def started(self) -> float: ...

    @property
    def now(self) -> float: ...

    @property
    def stimulus(self) -> str: ...

    @property
    def profiling_waits(self) -> deque[float]: ...

    @property
    def spans_refused(self) -> dict[str, Config]: ...

    def emit(self, command: Command) -> None: ...

    def record(self, record: Record) -> None: ...

    def note(self, job: Job, kind: str, message: str) -> None: ...

    def set_state(self, job: Job, new: JobState, kind: str, message: str = "") -> None: ...

    def new_attempt_id(self) -> str: ...

    def attempt_row(self, a: Attempt, **ended: object) -> AttemptRow: ...

    def fragment_soon(self, first: Job | None = None) -> None: ...

    def seed_run_time(self, spec: JobSpec) -> None: ...

    def emit_stop(self, attempt: Attempt) -> None: ...

    def launch_ready(self, attempt: Attempt) -> None: ...

    def progressed(self, event: AttemptProgressed) -> None: ...

    def end_attempt(
        self, attempt: Attempt, *, reason: str, code: int | None = None, message: str = ""
    ) -> None: ...
