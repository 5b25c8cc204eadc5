"""The scheduler state machine: every scheduling decision of hopsmgr, sans I/O (events in, commands out).

`SchedulerMachine.handle(event, now)` applies one event to the state (hopsmgr.control.records) and
returns the commands it causes (hopsmgr.control.commands): first a `Persist` with the records to write,
then node commands, plan requests and replies. It reads no clock (`now` comes in), does no I/O and
knows nothing of asyncio, SQLite or SSH: the master and the simulator are two drivers of it. Everything
that decides lives here or below: submission limits (hopsmgr.control.admission), the job lifecycle (one
door: `_set`, through the table of hopsmgr.core.lifecycle), node health from heartbeat ages, the
profiling budget, when a fragment plan is worth making, the plan cycle (hopsmgr.control.cycle), turning
a plan into ordered stops and launches (hopsmgr.control.acting), and when a launch may go (once the
stops that free its GPUs have ended). Its settings: hopsmgr.control.settings.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from functools import partial

from hopsmgr.control import acting, admission, cycle, nodes
from hopsmgr.control import snapshot as views
from hopsmgr.control.commands import (
    AttemptRow,
    Command,
    JobChange,
    JobNote,
    LaunchAttempt,
    Persist,
    PlanSoon,
    Record,
    Reply,
    StartProfiling,
    StopAttempt,
    StopReason,
    ThroughputSample,
)
from hopsmgr.control.events import (
    AttemptEnded,
    AttemptLaunchFailed,
    AttemptProgressed,
    AttemptStarted,
    Event,
    HealthTick,
    JobCancelled,
    JobSubmitted,
    NodeBeat,
    NodeChanged,
    NodeCommandFailed,
    NodeDrained,
    NodeReported,
    PlanContinue,
    PlanReady,
    RoundTick,
    StateRestored,
)
from hopsmgr.control.records import Attempt, ControlState, EndedJob, Job, Node
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.iteration import RUN_TIME_PROFILE
from hopsmgr.core.lifecycle import LIVE, TERMINAL, JobState, transition
from hopsmgr.core.model import Calibration, Config, JobSpec, Server, TenantQuota, spans_types
from hopsmgr.core.priority import PriorityContext, expected_run_s

IDLE_RECHECK_S = 1.0
PROFILING_WAITS = 50
RECENTLY_ENDED = 256  # the latest completed jobs, kept for the forecasts' arrival process


class SchedulerMachine:
    def __init__(
        self,
        servers: tuple[Server, ...],
        tenants: tuple[TenantQuota, ...],
        settings: ControlSettings,
        estimator: Estimator | None = None,
        started: float = 0.0,
    ) -> None:
        self.settings = settings
        self.state = ControlState(
            nodes={s.id: Node(s, s.gpus) for s in servers}, tenants={t.name: t for t in tenants}
        )
        self.estimator = estimator if estimator is not None else Estimator()
        self.started = started
        self.attempt_seq = 0
        self.request_seq = 0
        self.inflight: int | None = None  # the plan request not answered yet
        self.applying: acting.PlanUnderWay | None = None  # a plan applied in slices, not finished
        self.preparing: cycle.RequestUnderWay | None = None  # a plan request prepared in steps
        self.first_due = False  # a first plan was asked for while another plan was in flight
        self.changed = True  # jobs, attempts or nodes changed since the last first plan was asked for
        self.protected_until = math.inf  # when a job the last first plan could not move becomes movable
        # the GPU types for which state.unprofiled was last trimmed (a new type: every job is again)
        self.profiled_on: frozenset[str] = frozenset()
        self.plan_soon = False  # a PlanSoon was sent and no plan tick came since
        # when a submission last found no idle GPU: the submissions right after it (no other event in
        # between, within IDLE_RECHECK_S) take the cluster as still full
        self._no_idle_at: float | None = None
        self.ended_lr: list[tuple[float, float]] = []  # (end time, latency ratio) of ended jobs, for RAQLR
        self.recently_ended: deque[EndedJob] = deque(maxlen=RECENTLY_ENDED)  # profiled, completed
        self.submissions: deque[float] = deque(maxlen=20_000)  # when accepted jobs were submitted
        # how long the latest profiled jobs' profiling took, PROFILING to QUEUED (the forecasts' hold)
        self.profiling_waits: deque[float] = deque(maxlen=PROFILING_WAITS)
        # per one-server job, the placement over several servers last refused (noted once, not per plan)
        self.spans_refused: dict[str, Config] = {}
        self._records: list[Record] = []
        self._out: list[Command] = []
        self._stimulus = ""
        self._now = 0.0
        self._handlers: dict[type, Callable[[Event], None]] = {
            JobSubmitted: self._submitted,  # type: ignore[dict-item]
            JobCancelled: self._cancelled,  # type: ignore[dict-item]
            AttemptStarted: self._started,  # type: ignore[dict-item]
            AttemptLaunchFailed: self._launch_failed,  # type: ignore[dict-item]
            AttemptProgressed: self.progressed,  # type: ignore[dict-item]
            AttemptEnded: self._ended,  # type: ignore[dict-item]
            NodeBeat: partial(nodes.on_beat, self),
            NodeReported: partial(nodes.on_reported, self),
            NodeChanged: partial(nodes.on_node_changed, self),
            StateRestored: partial(nodes.on_restored, self),
            NodeCommandFailed: partial(nodes.on_command_failed, self),
            NodeDrained: partial(nodes.on_drained, self),
            HealthTick: partial(nodes.on_health, self),
            RoundTick: partial(cycle.on_round_tick, self),
            PlanReady: partial(cycle.on_plan_ready, self),
            PlanContinue: self._plan_continue,  # type: ignore[dict-item]
        }

    # -- the one entry point ----------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        """Apply `event` at time `now`; the commands it causes, a Persist of its records first."""
        self._records, self._out = [], []
        self._stimulus, self._now = event.stimulus_id, now
        if not isinstance(
            event, (AttemptProgressed, HealthTick, RoundTick, PlanReady, PlanContinue, NodeReported)
        ):
            self.changed = True
        if not isinstance(event, JobSubmitted):
            self._no_idle_at = None  # only consecutive submissions share a count of idle GPUs
        self._handlers[type(event)](event)
        out = self._out
        if self._records:
            out = [Persist(self._stimulus, tuple(self._records)), *out]
        self._records, self._out = [], []
        return out

    def forget(self, job_id: str) -> None:
        """Undo a submission whose records could not be stored (the driver's transaction failed)."""
        job = self.state.pop_job(job_id)
        if job is not None:
            for attempt_id in list(job.profiling):
                self.state.remove_attempt(attempt_id)
            self.estimator.forget(job_id)

    # -- helpers used by acting --------------------------------------------------------------------------

    def emit(self, command: Command) -> None:
        self._out.append(command)

    def record(self, record: Record) -> None:
        self._records.append(record)

    @property
    def now(self) -> float:
        return self._now

    @property
    def stimulus(self) -> str:
        return self._stimulus

    def note(self, job: Job, kind: str, message: str) -> None:
        self._records.append(JobNote(job.id, self._now, kind, message))

    def set_state(self, job: Job, new: JobState, kind: str, message: str = "") -> None:
        """The one way a job changes state: the lifecycle table, then a record of the change."""
        old = job.state
        job.state = transition(old, new)
        if job.id in self.state.jobs:
            self.state.moved(old, new)
        job.state_since = self._now
        if new == JobState.FAILED:
            job.reason = message
        if new in (JobState.LAUNCHING, JobState.RUNNING) and job.first_start is None:
            job.first_start = self._now
        if new in TERMINAL:
            job.ended = self._now
            expected = self.expected_run_s(job)
            if expected and math.isfinite(
                expected
            ):  # RAQLR: the latency ratio (wait / age) of every job that ended
                wait = max(0.0, self._now - job.submitted - job.running_s)
                self.ended_lr.append((self._now, wait / expected))
                del self.ended_lr[:-10_000]
        self._records.append(
            JobChange(job.id, old, new, self._now, kind, message, job.counters(), job.has_checkpoint)
        )
        if new not in LIVE:
            kept = EndedJob.of(job, self.estimator) if new == JobState.COMPLETED else None
            if kept is not None:
                self.recently_ended.append(kept)
            self.state.pop_job(job.id)
            self.estimator.forget(job.id)
            self.spans_refused.pop(job.id, None)
            if new != JobState.COMPLETED:  # --after: what waits for it can never start
                for other in [j for j in self.state.jobs.values() if job.id in j.spec.after]:
                    self.cancel_job(other, f"{job.id}, which it runs after, ended {new.value}")

    def expected_run_s(self, job: Job) -> float | None:
        """The job's age (hopsmgr.core.priority.expected_run_s) with the estimator's rates: the one formula."""
        ctx = PriorityContext(
            now=self._now,
            type_share=self.state.type_share,
            rate=self.estimator.type_rate,
            total_gpus=self.state.total_gpus,
        )
        value = expected_run_s(job.spec, ctx)
        return value if math.isfinite(value) else None

    def new_attempt_id(self) -> str:
        self.attempt_seq += 1
        return f"a-{self.attempt_seq:06d}"

    def attempt_row(self, a: Attempt, **ended: object) -> AttemptRow:
        return AttemptRow(
            a.id,
            a.job_id,
            a.placement,
            a.profiling,
            a.created,
            dict(a.devices),
            a.resume,
            started=a.started,
            stopping=a.stopping,
            **ended,  # type: ignore[arg-type]
        )

    def fragment_soon(self, first: Job | None = None) -> None:
        """Ask for a fragment plan if the policy makes them and some waiting work fits the idle GPUs
        (once: until the plan asked for is made, more asking changes nothing); `first`: the job that
        just arrived (looked at before the others; a cluster found full by the submission just before,
        less than IDLE_RECHECK_S ago with no other event since, is taken as still full: a burst of
        submissions would otherwise count the idle GPUs over every node for each)."""
        if not self.settings.fragment_plans or self.plan_soon:
            return
        full_at = self._no_idle_at
        if first is not None and full_at is not None and 0.0 <= self._now - full_at < IDLE_RECHECK_S:
            return
        if self._fits_idle(first):
            self.plan_soon = True
            self.emit(PlanSoon(self._stimulus, "fragment"))

    def _fits_idle(self, first: Job | None = None) -> bool:
        idle = views.idle_gpus(self.state, self._now, self.settings.exec_error_backoff_s)
        self._no_idle_at = self._now if idle <= 0 else None
        if idle <= 0:
            return False

        def fits(j: Job) -> bool:
            return (j.state == JobState.QUEUED and j.spec.requirements.minimum <= idle) or (
                j.state == JobState.PENDING and self.settings.profiling
            )

        return (first is not None and fits(first)) or any(fits(j) for j in self.state.jobs.values())

    # -- jobs ---------------------------------------------------------------------------------------------

    def refusal(self, spec: JobSpec) -> Reply | None:
        """Why a submission of `spec` is refused (unknown tenant, more GPUs than it may ever get), or None
        (hopsmgr.control.admission)."""
        mixed_types = self.settings.scheduler.mixed_types
        return admission.refusal(self.state, spec, mixed_types=mixed_types, stimulus=self._stimulus)

    def _submitted(self, event: JobSubmitted) -> None:
        spec = event.spec
        state = self.state
        refused = self.refusal(spec)
        if refused is not None:
            self.emit(refused)
            return
        job = Job(spec, JobState.PENDING, self._now, self._now)
        waits = state.waits_for(job)
        state.add_job(job)
        self.submissions.append(self._now)  # the forecasts' arrival process
        self._records.append(
            JobChange(
                spec.id,
                None,
                JobState.PENDING,
                self._now,
                "submitted",
                event.submitted_by,
                job.counters(),
                False,
            )
        )
        for gpu_type, (profile, calibration) in event.profiles.items():
            self.estimator.add_profile(spec.id, gpu_type, profile, calibration)
        if not spec.runtime:
            self.seed_run_time(spec)
            how = "never preempted" if not spec.preemptible else "preempted with its checkpoint signal"
            self.set_state(
                job,
                JobState.QUEUED,
                "queued",
                "no profiling run (the command does not use hopsmgr.runtime): placed from the servers'"
                f" calibration and its expected run time; {how}",
            )
        elif not self.settings.profiling or state.gpu_types <= self.estimator.profiled_types(spec.id):
            self.set_state(job, JobState.QUEUED, "queued", "profiles known at submission")
        if waits:
            self.note(job, "waiting", f"runs after {', '.join(waits)} completes")
        self.emit(Reply(self._stimulus, spec.id))
        self.fragment_soon(job)

    def seed_run_time(self, spec: JobSpec) -> None:
        """A job without the runtime gets no profiling run: the run-time profile for every GPU type
        (hopsmgr.core.estimator.RUN_TIME_PROFILE, at nominal calibration: each server's own scales it)."""
        for gpu_type in sorted(self.state.gpu_types):
            if not self.estimator.has_profile(spec.id, gpu_type):
                self.estimator.add_profile(spec.id, gpu_type, RUN_TIME_PROFILE, Calibration())

    def _cancelled(self, event: JobCancelled) -> None:
        job = self.state.jobs.get(event.job_id)
        if job is None:
            self.emit(Reply(self._stimulus, event.job_id, "id", f"job {event.job_id} is not live", 409))
            return
        self.cancel_job(job, f"by {event.by}" if event.by else "")
        self.emit(Reply(self._stimulus, job.id))

    def cancel_job(self, job: Job, message: str) -> None:
        """CANCELLED, and every attempt of the job stopped."""
        if job.id not in self.state.jobs:
            return
        attempts = [a for a in self.state.attempts.values() if a.job_id == job.id]
        self.set_state(job, JobState.CANCELLED, "cancelled", message)
        for a in attempts:
            a.stop_reason = "cancelled"
            self.emit_stop(a)

    def emit_stop(self, attempt: Attempt) -> None:
        """Stop an attempt without a checkpoint; one never launched just ends (its GPUs are free now)."""
        if not attempt.launched:
            self.end_attempt(attempt, reason="cancelled", message="stopped before its launch")
            return
        if not attempt.stopping:
            attempt.stopping = True
            self._records.append(self.attempt_row(attempt))
        attempt.stop_sent = True
        reason: StopReason = "cancelled" if attempt.stop_reason == "cancelled" else "job_ended"
        self.emit(StopAttempt(self._stimulus, attempt.id, attempt.job_id, attempt.placement, reason))

    # -- attempts -------------------------------------------------------------------------------------

    def launch_ready(self, attempt: Attempt) -> None:
        """Send the launch of an attempt whose stops have all ended (or end it if it is moot now)."""
        job = self.state.jobs.get(attempt.job_id)
        if job is None:
            self.end_attempt(attempt, reason="cancelled", message="its job ended before the launch")
            return
        if attempt.profiling:
            if job.state not in (JobState.PENDING, JobState.PROFILING, JobState.QUEUED):
                self.end_attempt(attempt, reason="not_needed", message=f"job is {job.state.value}")
                return
        elif job.attempt != attempt.id:  # the second half of a move
            if job.moving_to == attempt.id:
                job.moving_to = None
            if job.state != JobState.QUEUED or job.attempt is not None:
                self.end_attempt(attempt, reason="not_needed", message=f"job is {job.state.value}")
                return
            job.attempt = attempt.id
            self.set_state(job, JobState.LAUNCHING, "launching", f"{attempt.id} on {attempt.placement}")
        attempt.launched = True
        self.state.assign_devices(attempt)
        self._records.append(self.attempt_row(attempt))
        if attempt.profiling:
            server = attempt.placement.parts[0][0]
            self.emit(
                StartProfiling(self._stimulus, attempt.id, job.id, server, attempt.gpu_type, attempt.devices)
            )
        else:
            nodes = self.state.nodes
            servers = {sid: nodes[sid].server for sid, _ in attempt.placement.parts if sid in nodes}
            shares = self.estimator.rank_shares(job.spec, attempt.placement, servers)
            self.emit(
                LaunchAttempt(
                    self._stimulus,
                    attempt.id,
                    job.id,
                    attempt.placement,
                    attempt.devices,
                    attempt.resume,
                    shares,
                )
            )

    def _started(self, event: AttemptStarted) -> None:
        attempt = self.state.attempts.get(event.attempt_id)
        if attempt is None or attempt.started is not None:
            return
        attempt.launched = True
        attempt.started = self._now
        self._records.append(self.attempt_row(attempt))
        job = self.state.jobs.get(attempt.job_id)
        if (
            job is not None
            and not attempt.profiling
            and job.state == JobState.LAUNCHING
            and job.attempt == attempt.id
        ):
            self.set_state(job, JobState.RUNNING, "started", f"{attempt.id} on {attempt.placement}")

    def _launch_failed(self, event: AttemptLaunchFailed) -> None:
        attempt = self.state.attempts.get(event.attempt_id)
        if attempt is not None:
            reason = "launch_error" if event.job_fault else "launch_failed"
            self.end_attempt(attempt, reason=reason, message=event.message)

    def progressed(self, event: AttemptProgressed) -> None:
        attempt = self.state.attempts.get(event.attempt_id)
        job = self.state.jobs.get(attempt.job_id) if attempt is not None else None
        if attempt is None or job is None or attempt.profiling:
            return
        if attempt.started is None:
            self._started(AttemptStarted(self._stimulus, attempt.id))
        if event.done_samples > job.done_samples:  # the report's progress is as of about now
            attempt.progressed_at = self._now
        job.done_samples = min(job.spec.total_samples, max(job.done_samples, event.done_samples))
        if event.samples_per_s > 0 and self._now - attempt.last_observed >= self.settings.observe_every_s:
            attempt.last_observed = self._now
            servers = {sid: self.state.nodes[sid].server for sid in attempt.placement.servers}
            expected = self.estimator.config_rate(job.spec, attempt.placement, servers)
            self.estimator.observe(job.id, attempt.placement, servers, event.samples_per_s, job=job.spec)
            self._records.append(
                ThroughputSample(job.id, self._now, attempt.placement, event.samples_per_s, expected)
            )
            if event.td_s > 0 and not spans_types(attempt.placement, servers):
                # (on a placement across types the primary's batch is its share, not the job's batch)
                gpu_type = self.state.nodes[attempt.primary].server.gpu_type
                self.estimator.observe_data_time(job.id, gpu_type, event.td_s, event.tw_s)

    def _ended(self, event: AttemptEnded) -> None:
        attempt = self.state.attempts.get(event.attempt_id)
        if attempt is None or (event.node_id is not None and event.node_id != attempt.primary):
            return
        job = self.state.jobs.get(attempt.job_id)
        if job is not None and event.done_samples is not None and not attempt.profiling:
            job.done_samples = min(job.spec.total_samples, max(job.done_samples, event.done_samples))
        reason = event.reason
        if reason == "exited" and job is None:
            reason = "cancelled"
        acting.end_attempt(
            self, attempt, reason, event.code, event.checkpointed, event.profile, event.log_tail or ""
        )

    def end_attempt(
        self, attempt: Attempt, *, reason: str, code: int | None = None, message: str = ""
    ) -> None:
        acting.end_attempt(self, attempt, reason, code, False, None, message)

    # -- plans (hopsmgr.control.cycle) --------------------------------------------------------------------

    def drop_plan_cycle(self) -> None:
        """Forget the plan request or plan under way (a driver's round failed half-way): the next
        round tick asks for a new one from the state as it is."""
        self.preparing, self.applying, self.inflight = None, None, None

    def _plan_continue(self, event: PlanContinue | None) -> None:
        (cycle.apply_next_slice if self.preparing is None else cycle.continue_request)(self)
