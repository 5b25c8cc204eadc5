"""The discrete-event simulator: a driver of the master's own scheduler state machine (hopsmgr.control)
on a simulated clock, against a hidden ground truth (hopsmgr.sim.truth) the estimator has to learn.

Nothing here decides: arrivals become `JobSubmitted` events, the round clock `RoundTick`s, and the
machine's commands are answered by a simulated executor from the ground truth. A launch runs at the
world's true rate after the model's restart cost (checkpoint restore and warm-up), a checkpoint-and-stop
keeps its GPUs while the checkpoint is written, a profiling run holds one GPU for `profile_s` and
returns the world's profile, and plan requests are answered at once by the policy (the solver time is
measured, and can be charged to the launches of the round: `charge_solver`). Running attempts report
noisy throughput samples, which feed the estimator; its error against the truth is sampled first, for
configurations seen before and for servers a job never ran on.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hopsmgr.control import snapshot as views
from hopsmgr.control.commands import (
    CheckpointAndStop,
    Command,
    JobChange,
    LaunchAttempt,
    Persist,
    PlanRequest,
    PlanSoon,
    Reply,
    StartProfiling,
    StopAttempt,
)
from hopsmgr.control.events import (
    AttemptEnded,
    AttemptProgressed,
    AttemptStarted,
    Event,
    JobCancelled,
    JobSubmitted,
    NodeBeat,
    RoundTick,
)
from hopsmgr.control.machine import ControlSettings, SchedulerMachine
from hopsmgr.control.planning import compute_plan
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import TERMINAL, JobState
from hopsmgr.core.metrics import JobRecord, RoundRecord
from hopsmgr.core.model import Config, JobSpec, Server, TenantQuota
from hopsmgr.core.plan import Backfill
from hopsmgr.core.priority import PriorityContext, expected_run_s
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.nodecontract import EXIT_CHECKPOINTED
from hopsmgr.policies.base import Policy
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SimOptions:
    profile_s: float = 60.0
    charge_solver: bool = False
    restart_costs: bool = True  # launches pay the model's restart cost; checkpoints take time to write
    profiling: bool = True
    observe_every_s: float = 300.0
    checkpoint_bytes_per_s: float = 200e6  # checkpoint write speed (GPUs stay held meanwhile)
    checkpoint_fixed_s: float = 5.0
    # a launch's true start-up, when not the job's restart_s (the planner sees restart_s either way)
    launch_s: float | None = None
    round_phase_s: float = 0.0  # the first round this long after the first arrival (live: the master's clock)
    profile_iterations: int = 0  # > 0: a profiling run lasts profile_s + this many iterations
    max_sim_s: float = 60 * 86_400.0  # a run stops this long after the last arrival (a starving policy)
    seed: int = 0
    # > 0: fragment plans at most this often (the forecasts' futures: fewer plans; the master plans at once)
    fragment_gap_s: float = 0.0
    # > 0: rounds and fragment plans also at least this fraction of the simulated time since the run
    # started apart (the forecasts' futures: a start a day ahead needs no finer clock than its own
    # uncertainty, so a future of days makes ~100 rounds, not ~1,000)
    round_growth: float = 0.0


def job_key(job_id: str) -> int:
    """The hidden per-job-instance key of the ground truth (never 0: 0 means "the model's plain rate")."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big") or 1


@dataclass(frozen=True, slots=True)
class EstimatorSample:
    time_s: float
    ape: float
    seen: bool


@dataclass(slots=True)
class SimResult:
    policy: str
    description: str
    jobs: list[JobRecord]
    rounds: list[RoundRecord]
    estimator: list[EstimatorSample]
    timeline: list[tuple[float, float, int]]  # (time, normalised throughput, idle GPUs while jobs wait)
    preemptions: int
    migrations: int
    busy_gpu_s: float
    total_gpus: int
    span_s: float
    per_job: list[JobOutcome] = field(default_factory=list)
    backfills: list[BackfillRecord] = field(default_factory=list)
    reserved_jobs: int = 0  # jobs that got a reservation (hopsmgr.core.reserve)


@dataclass(frozen=True, slots=True)
class BackfillRecord:
    """One attempt started on reserved GPUs: the reservation's start it promised to end by, and when it
    left them. `late`: still there after the promised start, its reserved job not yet started."""

    job_id: str
    reserved_for: str
    until_s: float
    launched_s: float
    left_s: float
    late: bool


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job beyond its JobRecord: its requirement set, the GPU types it ran on, how
    often it was preempted and moved (the rows of `hopsmgr simulate --out`'s jobs.csv)."""

    job_id: str
    gpus: tuple[int, ...]
    gpu_types: tuple[str, ...]
    preemptions: int
    moves: int


@dataclass(slots=True)
class _Run:
    """What the ground truth knows of a run attempt: its true rate and when it makes progress."""

    attempt_id: str
    job_id: str
    config: Config
    rate: float
    launched: float
    ready_at: float
    base: float  # samples done when it launched
    token: int  # a scheduled end carries it; a stop changes it (the end is then void)
    stopped: bool = False
    shares: tuple[float, ...] = ()  # each rank's share of the global batch, as the launch gave them

    def done_at(self, t: float) -> float:
        return self.base + self.rate * max(0.0, t - self.ready_at)


@dataclass(slots=True)
class _JobTruth:
    w: WorkloadJob
    spec: JobSpec
    done: float = 0.0
    first_start: float | None = None
    end: float | None = None
    final: JobState | None = None
    running_s: float = 0.0
    arrival_integral: float = 0.0
    end_integral: float | None = None
    last_observed: float = -math.inf
    ran_on: set[str] = field(default_factory=set)
    history: list[JobState] = field(default_factory=list)
    gpu_types: set[str] = field(default_factory=set)
    preemptions: int = 0
    moves: int = 0


class Simulation:
    def __init__(
        self,
        world: World,
        servers: Sequence[Server],
        workload: Sequence[WorkloadJob],
        policy: Policy,
        options: SimOptions,
        timer: Callable[[], float],
        estimator: Estimator | None = None,
        tenants: Mapping[str, TenantQuota] | None = None,
    ) -> None:
        self.world = world
        # Servers as the agents would report them: calibration measured by their kernels.
        self.servers = [
            Server(s.id, s.gpu_type, s.gpus, world.calibration(s), s.host_model, s.order) for s in servers
        ]
        self.by_id = {s.id: s for s in self.servers}
        self.total_gpus = sum(s.gpus for s in self.servers)
        self.policy = policy
        self.options = options
        self.timer = timer
        self.rng = random.Random(options.seed)
        base = getattr(policy, "settings", None)
        scheduler = base if isinstance(base, SchedulerSettings) else SchedulerSettings()
        settings = ControlSettings(
            scheduler=replace(scheduler, round_seconds=policy.round_seconds),
            fragment_plans=policy.fragment_plans,
            profiling=options.profiling,
            observe_every_s=0.0,  # the simulator reports every observe_every_s itself
        )
        # A trace's tenants (Philly's virtual clusters) need not be declared in the cluster file: those
        # it does not name get the defaults (no guarantee, no cap, weight 1), as they would be declared.
        quotas = dict(tenants or {})
        if quotas:
            for w in workload:
                quotas.setdefault(w.tenant, TenantQuota(w.tenant))
        self.machine = SchedulerMachine(
            tuple(self.servers), tuple(quotas.values()), settings, estimator, started=0.0
        )
        self.jobs: dict[str, _JobTruth] = {}
        self.order: list[_JobTruth] = []
        for w in sorted(workload, key=lambda w: (w.arrival_s, w.job_id)):
            model = world.model(w.model)
            spec = JobSpec(
                id=w.job_id,
                requirements=w.requirements,
                total_samples=w.total_samples,
                batch_size=w.batch_size,
                tenant=w.tenant,
                model=w.model,
                params_bytes=model.params_bytes,
                submit_time=w.arrival_s,
                restart_s=model.restart_s if options.restart_costs else 0.0,
            )
            truth = _JobTruth(w, spec)
            self.jobs[w.job_id] = truth
            self.order.append(truth)
        self.runs: dict[str, _Run] = {}
        self.profiles: dict[str, tuple[int, str, str]] = {}  # attempt -> (token, job, server)
        self.rounds: list[RoundRecord] = []
        self.samples: list[EstimatorSample] = []
        self.timeline: list[tuple[float, float, int]] = []
        self.changes: list[JobChange] = []
        self.plans: list[tuple[str, float]] = []
        self._promises: dict[str, Backfill] = {}  # the last plan's backfills
        self._backfilled: dict[str, tuple[str, Backfill, float]] = {}  # attempt -> (job, promise, launched)
        self._ended_backfills: list[tuple[str, Backfill, float, float]] = []
        self._reserved: set[str] = set()
        self.preemptions = 0
        self.migrations = 0
        self.busy_gpu_s = 0.0
        self.now = 0.0
        self._live_integral = 0.0
        self._live = 0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = 0
        self._pending: deque[Event] = deque()
        self._fragment_wanted = False
        self._fragment_timer = False  # a _FragmentWake is queued
        self._last_fragment = -math.inf
        self._round_solver_s = 0.0
        self._solver_delay = 0.0
        self._stim = 0
        self._tokens = 0
        self._finished = 0
        self._observing = False
        self._resume: tuple[float, frozenset[str]] | None = None
        self.next_round = 0.0  # when the next first-plan round is due

    # ---- plumbing ---------------------------------------------------------------------------------------
    def _stimulus(self, what: str) -> str:
        self._stim += 1
        return f"sim-{what}-{self._stim}"

    def _token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _at(self, t: float, event: Event) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, event))

    def feed(self, event: Event) -> None:
        """Hand one event to the machine now, and every event its commands cause, until quiet."""
        self._pending.append(event)
        while self._pending:
            for command in self.machine.handle(self._pending.popleft(), self.now):
                self._do(command)

    def _advance(self, t: float) -> None:
        if t > self.now:
            self._live_integral += self._live * (t - self.now)
            self.now = t

    # ---- main loop --------------------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        if not self.order:
            return self._result()
        self.advance(progress)
        return self._result()

    def resume_at(self, next_round: float, arrived: frozenset[str]) -> None:
        """Go on from a state handed to the machine already (a forecast from the live state): the next
        round at `next_round`, and the jobs in `arrived` already live (they do not arrive again)."""
        self._resume = (next_round, arrived)

    def advance(
        self, progress: Callable[[float], None] | None = None, until: Callable[[], bool] | None = None
    ) -> None:
        """The main loop: until every job ended, the run passed `max_sim_s`, or `until()` says so."""
        if not self.order:
            return
        if self._resume is None:
            self.now = self.order[0].w.arrival_s
            for server in self.servers:
                self.feed(NodeBeat(self._stimulus("node"), server.id, True, server, server.gpus))
            self.next_round = self.now + self.options.round_phase_s
            arrivals = deque(self.order)
        else:
            self.next_round, arrived = self._resume
            arrivals = deque(j for j in self.order if j.spec.id not in arrived)
        round_s = self.policy.round_seconds
        growth, started = self.options.round_growth, self.now
        last_arrival = self.order[-1].w.arrival_s
        while self._ended() < len(self.order):
            if until is not None and until():
                break
            t_arrival = arrivals[0].w.arrival_s if arrivals else math.inf
            t_event = self._heap[0][0] if self._heap else math.inf
            t = min(t_arrival, t_event, self.next_round)
            if t - last_arrival > self.options.max_sim_s:
                break
            self._advance(t)
            while self._heap and self._heap[0][0] <= t + _EPS:
                event = heapq.heappop(self._heap)[2]
                if isinstance(event, _RunEnd):
                    self._end_run(event)
                elif isinstance(event, _ProfileEnd):
                    self._end_profile(event)
                elif isinstance(event, _FragmentWake):
                    self._fragment_timer = False
                elif isinstance(event, _ObserveTick):
                    self._observe()
                    if self.runs:
                        self._at(self.now + self.options.observe_every_s, _ObserveTick("observe"))
                    else:
                        self._observing = False
                else:
                    self.feed(event)
            while arrivals and arrivals[0].w.arrival_s <= t + _EPS:
                self._arrive(arrivals.popleft())
            if t >= self.next_round - _EPS:
                self.next_round = t + max(round_s, growth * (t - started))
                self._round()
                if not arrivals:
                    self._cancel_stranded()
                if progress is not None:
                    progress(self._ended() / len(self.order))
            elif self._fragment_wanted:
                # the gap as of the last fragment plan, so that the wake set for its end stays due
                since = self._last_fragment - started if math.isfinite(self._last_fragment) else 0.0
                gap = max(self.options.fragment_gap_s, growth * since)
                if gap <= 0 or t >= self._last_fragment + gap - _EPS:
                    self._fragment_wanted = False
                    self._last_fragment = t
                    self.feed(RoundTick(self._stimulus("fragment"), "fragment"))
                elif not self._fragment_timer:  # wake at the gap's end (nothing else may happen before)
                    self._fragment_timer = True
                    self._at(self._last_fragment + gap, _FragmentWake("fragment-wake"))

    def _ended(self) -> int:
        return self._finished

    def _arrive(self, job: _JobTruth) -> None:
        self._live += 1
        job.arrival_integral = self._live_integral
        profiles = {}
        if not self.options.profiling:
            for gpu_type in sorted({s.gpu_type for s in self.servers}):
                server = next(s for s in self.servers if s.gpu_type == gpu_type)
                profile = self.world.profile(job.w.model, server, self.rng, rng_key=job_key(job.spec.id))
                profiles[gpu_type] = (profile, server.calibration)
        self.feed(JobSubmitted(self._stimulus("submit"), job.spec, "simulator", profiles))

    def _round(self) -> None:
        self._round_solver_s = 0.0
        self._solver_delay = 0.0
        self.feed(RoundTick(self._stimulus("round"), "first"))
        if self._fragment_wanted:
            self._fragment_wanted = False
            self._last_fragment = self.now
            self.feed(RoundTick(self._stimulus("fragment"), "fragment"))
        state = self.machine.state
        free = views.free_gpus_by_server(state, self.now, self.machine.settings.exec_error_backoff_s)
        idle = sum(free.values())
        queued = [j for j in state.jobs.values() if j.state == JobState.QUEUED]
        # a job still profiling on some type, or waiting for another to complete, is not planned now
        counts = [j.spec.requirements.minimum for j in queued if not j.profiling and not state.waits_for(j)]
        self.rounds.append(
            RoundRecord(
                start=self.now,
                idle_gpus_after_plan=idle,
                jobs_waiting=len(queued),
                solver_s=self._round_solver_s,
                busy_gpus=self.total_gpus - idle,
                total_gpus=self.total_gpus,
                largest_free_block=max(free.values(), default=0),
                smallest_waiting=min(counts, default=None),
            )
        )
        self.timeline.append((self.now, self._normalised_throughput(), idle if queued else 0))

    def _cancel_stranded(self) -> None:
        """Queued jobs the policy will never place: nothing runs, profiles or is scheduled, yet the plan
        launched nothing. They end (the live system would show them unplaceable) so the run ends."""
        state = self.machine.state
        if state.attempts or self._heap or self.machine.inflight is not None:
            return
        if any(j.state in (JobState.PENDING, JobState.PROFILING) for j in state.jobs.values()):
            return
        for job_id in sorted(state.jobs):
            self.feed(JobCancelled(self._stimulus("stranded"), job_id, "simulator: no plan placed it"))

    # ---- the simulated executor ----------------------------------------------------------------------
    def _do(self, command: Command) -> None:
        if isinstance(command, Persist):
            for record in command.records:
                if isinstance(record, JobChange):
                    self._changed(record)
        elif isinstance(command, LaunchAttempt):
            self._launch(command)
        elif isinstance(command, StartProfiling):
            self._profile(command)
        elif isinstance(command, CheckpointAndStop):
            self._stop(command.attempt_id, checkpoint=True)
            if command.reason == "migrated":
                self.migrations += 1
            else:
                self.preemptions += 1
        elif isinstance(command, StopAttempt):
            self._stop(command.attempt_id, checkpoint=False)
        elif isinstance(command, PlanRequest):
            self._plan(command)
        elif isinstance(command, PlanSoon):
            self._fragment_wanted = True
        elif isinstance(command, Reply) and command.error is not None and command.error_field != "id":
            raise ValueError(f"simulated submission refused: {command.error_field}: {command.error}")

    def _changed(self, change: JobChange) -> None:
        self.changes.append(change)
        job = self.jobs[change.job_id]
        job.history.append(change.new)
        if change.new == JobState.LAUNCHING and job.first_start is None:
            job.first_start = change.at
        if change.new in TERMINAL:
            job.preemptions = int(change.counters["preemptions"])
            job.moves = int(change.counters["migrations"])
            job.final = change.new
            job.end = change.at if change.new == JobState.COMPLETED else None
            job.running_s = change.counters["running_s"]
            job.end_integral = self._live_integral
            self._live -= 1
            self._finished += 1

    def _launch(self, command: LaunchAttempt) -> None:
        job = self.jobs[command.job_id]
        parts = [(self.by_id[s], g) for s, g in command.placement.parts]
        job.gpu_types.update(server.gpu_type for server, _ in parts)
        rate = self.world.true_rate(job.w.model, parts, job_key(job.spec.id), command.shares)
        start_s = job.spec.restart_s if self.options.launch_s is None else self.options.launch_s
        delay = start_s + (self._solver_delay if self.options.charge_solver else 0.0)
        run = _Run(
            command.attempt_id,
            job.spec.id,
            command.placement,
            rate,
            self.now,
            self.now + delay,
            job.done,
            self._token(),
            shares=command.shares,
        )
        self.runs[run.attempt_id] = run
        promise = self._promises.pop(job.spec.id, None)
        if promise is not None:
            self._backfilled[run.attempt_id] = (job.spec.id, promise, self.now)
        if not self._observing:  # running attempts report every observe_every_s (as agents do)
            self._observing = True
            self._at(run.ready_at + self.options.observe_every_s, _ObserveTick("observe"))
        self._at(self.now, AttemptStarted(self._stimulus("started"), run.attempt_id))
        finish = run.ready_at + max(0.0, job.spec.total_samples - job.done) / rate if rate > 0 else math.inf
        if math.isfinite(finish):
            self._at(finish, _RunEnd(self._stimulus("exit"), run.attempt_id, token=run.token))

    def _profile(self, command: StartProfiling) -> None:
        token = self._token()
        self.profiles[command.attempt_id] = (token, command.job_id, command.server_id)
        self._at(self.now, AttemptStarted(self._stimulus("started"), command.attempt_id))
        end = _ProfileEnd(self._stimulus("profiled"), command.attempt_id, token=token)
        duration = self.options.profile_s
        if self.options.profile_iterations > 0:
            job = self.jobs[command.job_id]
            rate = self.world.true_rate(
                job.w.model, [(self.by_id[command.server_id], 1)], job_key(job.spec.id)
            )
            # one GPU: each of its iterations takes the per-GPU batch (the world's rate counts G x batch)
            duration += self.options.profile_iterations * job.spec.batch_size / rate
        self._at(self.now + duration, end)

    def _stop(self, attempt_id: str, *, checkpoint: bool) -> None:
        run = self.runs.get(attempt_id)
        if run is None:
            if self.profiles.pop(attempt_id, None) is not None:
                self._pending.append(AttemptEnded(self._stimulus("stopped"), attempt_id, "exited", -15))
            return
        job = self.jobs[run.job_id]
        job.done = min(job.spec.total_samples, run.done_at(self.now))
        run.token, run.stopped = self._token(), True
        if checkpoint:
            write_s = 0.0
            if self.options.restart_costs:
                write_s = (
                    self.options.checkpoint_fixed_s
                    + job.spec.params_bytes / self.options.checkpoint_bytes_per_s
                )
            end = AttemptEnded(
                self._stimulus("checkpointed"),
                attempt_id,
                "exited",
                EXIT_CHECKPOINTED,
                True,
                done_samples=job.done,
            )
            self._at(self.now + write_s, _RunEnd(end.stimulus_id, attempt_id, token=run.token, ended=end))
        else:
            end = AttemptEnded(self._stimulus("stopped"), attempt_id, "exited", -15, done_samples=job.done)
            self._at(self.now, _RunEnd(end.stimulus_id, attempt_id, token=run.token, ended=end))

    def _plan(self, request: PlanRequest) -> None:
        ready = compute_plan(request, self.policy, self.machine.estimator, self.timer)
        self.plans.append((request.kind, self.now))
        self._promises = dict(ready.plan.backfills)
        self._reserved.update(r.job_id for r in ready.plan.reservations)
        self._round_solver_s += ready.planner_s
        self._solver_delay += ready.planner_s
        self._pending.append(ready)

    def _end_run(self, end: _RunEnd) -> None:
        run = self.runs.get(end.attempt_id)
        if run is None or run.token != end.token:
            return
        del self.runs[end.attempt_id]
        job = self.jobs[run.job_id]
        backfilled = self._backfilled.pop(end.attempt_id, None)
        if backfilled is not None:
            self._ended_backfills.append((*backfilled, self.now))
        self.busy_gpu_s += run.config.gpus * (self.now - run.launched)
        if end.ended is not None:
            self.feed(end.ended)
            return
        job.done = job.spec.total_samples
        self.feed(AttemptEnded(end.stimulus_id, run.attempt_id, "exited", 0, done_samples=job.done))

    def _end_profile(self, end: _ProfileEnd) -> None:
        entry = self.profiles.get(end.attempt_id)
        if entry is None or entry[0] != end.token:
            return
        del self.profiles[end.attempt_id]
        _, job_id, server_id = entry
        job = self.jobs[job_id]
        profile = self.world.profile(job.w.model, self.by_id[server_id], self.rng, rng_key=job_key(job_id))
        self.feed(AttemptEnded(end.stimulus_id, end.attempt_id, "exited", 0, profile=profile))

    # ---- observations -----------------------------------------------------------------------------------
    def _observe(self) -> None:
        """Running attempts report a measured throughput; the estimator's error is sampled first."""
        for run in list(self.runs.values()):
            if run.stopped or self.now < run.ready_at:
                continue
            job = self.jobs[run.job_id]
            if self.now - job.last_observed < self.options.observe_every_s:
                continue
            parts = [(self.by_id[s], g) for s, g in run.config.parts]
            here = set(run.config.servers)
            self._sample_error(job, run.config, parts, here <= job.ran_on, run.shares)
            other = self._unseen_server(job.ran_on | here)
            if other is not None:
                self._sample_error(job, Config.single(other.id, 1), [(other, 1)], False)
            measured = self.world.sample_rate(
                job.w.model, parts, self.rng, rng_key=job_key(job.spec.id), shares=run.shares
            )
            job.ran_on.update(run.config.servers)
            job.last_observed = self.now
            done = min(job.spec.total_samples, run.done_at(self.now))
            self.feed(AttemptProgressed(self._stimulus("progress"), run.attempt_id, done, measured))

    def _unseen_server(self, excluded: set[str]) -> Server | None:
        """A server drawn uniformly from those not in `excluded` (None if there is none)."""
        if len(excluded) >= len(self.servers):
            return None
        if len(excluded) * 2 < len(self.servers):  # rejection sampling: on average < 2 draws
            while True:
                server = self.servers[self.rng.randrange(len(self.servers))]
                if server.id not in excluded:
                    return server
        unseen = [s for s in self.servers if s.id not in excluded]
        return self.rng.choice(unseen) if unseen else None

    def _sample_error(
        self,
        job: _JobTruth,
        config: Config,
        parts: list[tuple[Server, int]],
        seen: bool,
        shares: tuple[float, ...] = (),
    ) -> None:
        predicted = self.machine.estimator.config_rate(job.spec, config, self.by_id)
        true = self.world.true_rate(job.w.model, parts, job_key(job.spec.id), shares)
        if predicted is not None and true > 0:
            self.samples.append(EstimatorSample(self.now, abs(predicted - true) / true, seen))

    # ---- measures -----------------------------------------------------------------------------------
    def _normalised_throughput(self) -> float:
        total = 0.0
        for run in self.runs.values():
            if not run.stopped and self.now >= run.ready_at:
                model = self.jobs[run.job_id].w.model
                total += run.rate / max(self.world.reference_rate(model, 1), _EPS)
        return total

    def _true_context(self) -> PriorityContext:
        shares: dict[str, float] = {}
        for s in self.servers:
            shares[s.gpu_type] = shares.get(s.gpu_type, 0.0) + s.gpus / self.total_gpus
        models = {j.spec.id: j.w.model for j in self.order}
        return PriorityContext(
            now=self.now,
            type_share=shares,
            rate=lambda spec, gpu_type: self.world.reference_rate(models[spec.id], 1, gpu_type),
            total_gpus=self.total_gpus,
        )

    def _result(self) -> SimResult:
        ctx = self._true_context()
        records = []
        for job in self.order:
            expected = expected_run_s(job.spec, ctx)  # the one formula, with the world's true speeds
            end_or_now = job.end if job.end is not None else self.now
            life = end_or_now - job.w.arrival_s
            integral = (
                job.end_integral if job.end_integral is not None else self._live_integral
            ) - job.arrival_integral
            contenders = integral / life if life > 0 else 1.0
            ideal = expected * max(1.0, contenders * job.spec.requirements.mean / self.total_gpus)
            live = self.machine.state.jobs.get(job.spec.id)
            running = job.running_s if live is None else live.running_s
            records.append(
                JobRecord(
                    job_id=job.spec.id,
                    tenant=job.spec.tenant,
                    gpus_min=job.spec.requirements.minimum,
                    submit_time=job.w.arrival_s,
                    first_start=job.first_start,
                    end_time=job.end,
                    waited_s=max(0.0, life - running),
                    expected_run_s=expected,
                    ideal_s=ideal,
                    completed=job.final == JobState.COMPLETED,
                )
            )
        span = max((j.end or 0.0) for j in self.order) - self.order[0].w.arrival_s if self.order else 0.0
        return SimResult(
            policy=self.policy.name,
            description=self.policy.description,
            jobs=records,
            rounds=self.rounds,
            estimator=self.samples,
            timeline=self.timeline,
            preemptions=self.preemptions,
            migrations=self.migrations,
            busy_gpu_s=self.busy_gpu_s,
            total_gpus=self.total_gpus,
            span_s=span,
            backfills=self._backfill_records(),
            reserved_jobs=len(self._reserved),
            per_job=[
                JobOutcome(
                    j.spec.id,
                    j.spec.requirements.counts,
                    tuple(sorted(j.gpu_types)),
                    j.preemptions if j.final is not None else self._live_counter(j.spec.id, "preemptions"),
                    j.moves if j.final is not None else self._live_counter(j.spec.id, "migrations"),
                )
                for j in self.order
            ],
        )

    def _backfill_records(self) -> list[BackfillRecord]:
        out = []
        open_ = [(job, promise, launched, math.inf) for job, promise, launched in self._backfilled.values()]
        for job_id, promise, launched, left in self._ended_backfills + open_:
            first = self.jobs[promise.reserved_for].first_start
            waiting = first is None or first > promise.until_s
            late = left > promise.until_s + 1.0 and waiting
            out.append(BackfillRecord(job_id, promise.reserved_for, promise.until_s, launched, left, late))
        return out

    def _live_counter(self, job_id: str, name: str) -> int:
        job = self.machine.state.jobs.get(job_id)
        return int(job.counters()[name]) if job is not None else 0


@dataclass(frozen=True, slots=True)
class _RunEnd(Event):
    """The simulator's own timer: a run attempt's true end (void when its token is stale)."""

    attempt_id: str = ""
    token: int = 0
    ended: AttemptEnded | None = None


@dataclass(frozen=True, slots=True)
class _FragmentWake(Event):
    """The simulator's own timer: a fragment plan held back by `fragment_gap_s` may run now."""


@dataclass(frozen=True, slots=True)
class _ObserveTick(Event):
    """The simulator's own timer: running attempts report their throughput (every observe_every_s)."""


@dataclass(frozen=True, slots=True)
class _ProfileEnd(Event):
    attempt_id: str = ""
    token: int = 0
