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

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence

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
from hopsmgr.control.planning import compute_plan
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import TERMINAL, JobState
from hopsmgr.core.metrics import RoundRecord
from hopsmgr.core.model import Config, Server, TenantQuota
from hopsmgr.core.plan import Backfill
from hopsmgr.nodecontract import EXIT_CHECKPOINTED
from hopsmgr.policies.base import Policy
from hopsmgr.sim.outcome import (
    EstimatorSample,
    SimResult,
    backfill_records,
    job_outcomes,
    job_records,
    round_record,
    true_context,
)
from hopsmgr.sim.simstate import (
    FragmentWake,
    JobTruth,
    ObserveTick,
    ProfileEnd,
    RunEnd,
    SimOptions,
    SimRun,
    job_key,
    job_truths,
    scheduler_machine,
    unseen_server,
)
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob

_EPS = 1e-9


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
        self.machine = scheduler_machine(
            self.servers, policy, options.profiling, estimator, tenants, workload
        )
        self.order = job_truths(world, workload, options.restart_costs)
        self.jobs = {job.spec.id: job for job in self.order}
        self.runs: dict[str, SimRun] = {}
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
        self._fragment_timer = False  # a FragmentWake is queued
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
                if isinstance(event, RunEnd):
                    self._end_run(event)
                elif isinstance(event, ProfileEnd):
                    self._end_profile(event)
                elif isinstance(event, FragmentWake):
                    self._fragment_timer = False
                elif isinstance(event, ObserveTick):
                    self._observe()
                    if self.runs:
                        self._at(self.now + self.options.observe_every_s, ObserveTick("observe"))
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
                    self._at(self._last_fragment + gap, FragmentWake("fragment-wake"))

    def _ended(self) -> int:
        return self._finished

    def _arrive(self, job: JobTruth) -> None:
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
        record = round_record(self.machine, self.now, self._round_solver_s, self.total_gpus)
        self.rounds.append(record)
        waiting = record.idle_gpus_after_plan if record.jobs_waiting else 0
        self.timeline.append((self.now, self._normalised_throughput(), waiting))

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
        run = SimRun(
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
            self._at(run.ready_at + self.options.observe_every_s, ObserveTick("observe"))
        self._at(self.now, AttemptStarted(self._stimulus("started"), run.attempt_id))
        finish = run.ready_at + max(0.0, job.spec.total_samples - job.done) / rate if rate > 0 else math.inf
        if math.isfinite(finish):
            self._at(finish, RunEnd(self._stimulus("exit"), run.attempt_id, token=run.token))

    def _profile(self, command: StartProfiling) -> None:
        token = self._token()
        self.profiles[command.attempt_id] = (token, command.job_id, command.server_id)
        self._at(self.now, AttemptStarted(self._stimulus("started"), command.attempt_id))
        end = ProfileEnd(self._stimulus("profiled"), command.attempt_id, token=token)
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
            write_s = self.options.checkpoint_write_s(job.spec.params_bytes)
            end = AttemptEnded(
                self._stimulus("checkpointed"),
                attempt_id,
                "exited",
                EXIT_CHECKPOINTED,
                True,
                done_samples=job.done,
            )
            self._at(self.now + write_s, RunEnd(end.stimulus_id, attempt_id, token=run.token, ended=end))
        else:
            end = AttemptEnded(self._stimulus("stopped"), attempt_id, "exited", -15, done_samples=job.done)
            self._at(self.now, RunEnd(end.stimulus_id, attempt_id, token=run.token, ended=end))

    def _plan(self, request: PlanRequest) -> None:
        ready = compute_plan(request, self.policy, self.machine.estimator, self.timer)
        self.plans.append((request.kind, self.now))
        self._promises = dict(ready.plan.backfills)
        self._reserved.update(r.job_id for r in ready.plan.reservations)
        self._round_solver_s += ready.planner_s
        self._solver_delay += ready.planner_s
        self._pending.append(ready)

    def _end_run(self, end: RunEnd) -> None:
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

    def _end_profile(self, end: ProfileEnd) -> None:
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
            other = unseen_server(self.servers, job.ran_on | here, self.rng)
            if other is not None:
                self._sample_error(job, Config.single(other.id, 1), [(other, 1)], False)
            measured = self.world.sample_rate(
                job.w.model, parts, self.rng, rng_key=job_key(job.spec.id), shares=run.shares
            )
            job.ran_on.update(run.config.servers)
            job.last_observed = self.now
            done = min(job.spec.total_samples, run.done_at(self.now))
            self.feed(AttemptProgressed(self._stimulus("progress"), run.attempt_id, done, measured))

    def _sample_error(
        self,
        job: JobTruth,
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

    def _result(self) -> SimResult:
        ctx = true_context(self.world, self.servers, self.order, self.now)
        live = self.machine.state.jobs
        span = max((j.end or 0.0) for j in self.order) - self.order[0].w.arrival_s if self.order else 0.0
        open_ = [(job, promise, launched, math.inf) for job, promise, launched in self._backfilled.values()]
        return SimResult(
            policy=self.policy.name,
            description=self.policy.description,
            jobs=job_records(self.order, ctx, live, self._live_integral, self.now),
            rounds=self.rounds,
            estimator=self.samples,
            timeline=self.timeline,
            preemptions=self.preemptions,
            migrations=self.migrations,
            busy_gpu_s=self.busy_gpu_s,
            total_gpus=self.total_gpus,
            span_s=span,
            backfills=backfill_records(
                self._ended_backfills + open_, lambda job_id: self.jobs[job_id].first_start
            ),
            reserved_jobs=len(self._reserved),
            per_job=job_outcomes(self.order, live),
        )
