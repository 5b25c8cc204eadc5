"""The discrete-event, round-based simulator: the same policies and planner as the master, on a
simulated clock, against a hidden ground truth (hopsmgr.sim.truth) the estimator has to learn.

Events: arrivals, round starts, profiling runs finishing, job completions. At a round start, new jobs
enter the profiling queue (one short run per GPU type, `profile_s` long, in parallel) and the policy
makes its first plan; policies with fragment plans plan again whenever GPUs go idle within the round
(a completion, a profile finishing, or fragments left by the first plan). Plans are reconciled into
checkpoint-and-stop and launch actions; every job state change goes through the lifecycle table.
Costs the live system pays are charged: every launch (first or resumed) spends `restart_s` of the
model (checkpoint restore and warm-up) before it makes progress, and the measured solver time can be
charged to the launches of the round (`charge_solver`). Running jobs report noisy throughput samples,
which feed the estimator; its error against the truth is recorded for configurations seen before and
for servers a job never ran on.

Simplification (documented in docs): profiling runs do not take GPUs away from the plan.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState, transition
from hopsmgr.core.metrics import JobRecord, RoundRecord
from hopsmgr.core.model import ClusterSnapshot, Config, JobSpec, JobView, Server, TenantQuota
from hopsmgr.core.planner import Plan, PlanKind
from hopsmgr.core.reconcile import CheckpointStop, Launch, reconcile
from hopsmgr.policies.base import Policy
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SimOptions:
    profile_s: float = 60.0
    charge_solver: bool = False
    restart_costs: bool = True
    profiling: bool = True
    observe_every_s: float = 300.0
    max_sim_s: float = 60 * 86_400.0  # a run stops this long after the last arrival (a starving policy)
    seed: int = 0


@dataclass(slots=True)
class _Job:
    w: WorkloadJob
    spec: JobSpec
    state: JobState = JobState.PENDING
    done: float = 0.0
    waited: float = 0.0
    attained: float = 0.0
    running_s: float = 0.0
    config: Config | None = None
    rate: float = 0.0
    ready_at: float = 0.0
    restarts: int = 0
    first_start: float | None = None
    end: float | None = None
    profile_done_at: float | None = None
    last_observed: float = -math.inf
    active_integral: float = 0.0
    ran_on: set[str] = field(default_factory=set)
    attempt_start: float = 0.0

    def key(self) -> int:
        return job_key(self.spec.id)


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
        self.tenants = dict(tenants or {})
        # Servers as the agents would report them: calibration measured by their kernels.
        self.servers = [
            Server(s.id, s.gpu_type, s.gpus, world.calibration(s), s.host_model, s.order) for s in servers
        ]
        self.by_id = {s.id: s for s in self.servers}
        self.capacity = {s.id: s.gpus for s in self.servers}
        self.total_gpus = sum(self.capacity.values())
        self.policy = policy
        self.options = options
        self.timer = timer
        self.estimator = estimator or Estimator()
        self.rng = random.Random(options.seed)
        self.jobs: list[_Job] = []
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
            self.jobs.append(_Job(w, spec))
        self.live: list[_Job] = []
        self.rounds: list[RoundRecord] = []
        self.samples: list[EstimatorSample] = []
        self.timeline: list[tuple[float, float, int]] = []
        self.preemptions = 0
        self.migrations = 0
        self.busy_gpu_s = 0.0
        self.now = 0.0
        self._next_arrival = 0
        self._solver_debt = 0.0
        self._changed = True

    # ---- time -------------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        active = len(self.live)
        for job in self.live:
            job.active_integral += active * dt
            if job.state in (JobState.RUNNING, JobState.LAUNCHING) and job.config is not None:
                start = max(self.now, job.ready_at)
                if t > start:
                    job.done = min(job.spec.total_samples, job.done + job.rate * (t - start))
                job.running_s += dt
                job.attained += job.config.gpus * dt
                self.busy_gpu_s += job.config.gpus * dt
            else:
                job.waited += dt
        self.now = t

    def _finish_time(self, job: _Job) -> float:
        if job.config is None or job.rate <= 0:
            return math.inf
        return max(self.now, job.ready_at) + (job.spec.total_samples - job.done) / job.rate

    # ---- main loop --------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        if not self.jobs:
            return self._result()
        round_s = self.policy.round_seconds
        self.now = self.jobs[0].w.arrival_s
        next_round = self.now
        finished = 0
        while finished < len(self.jobs):
            t_arrival = (
                self.jobs[self._next_arrival].w.arrival_s if self._next_arrival < len(self.jobs) else math.inf
            )
            running = [j for j in self.live if j.config is not None]
            t_done = min((self._finish_time(j) for j in running), default=math.inf)
            t_profile = min(
                (j.profile_done_at for j in self.live if j.profile_done_at is not None), default=math.inf
            )
            t = min(t_arrival, next_round, t_done, t_profile)
            if t - self.jobs[-1].w.arrival_s > self.options.max_sim_s:
                break
            self._advance(t)
            idle_event = False
            for job in [j for j in running if self._finish_time(j) <= t + _EPS]:
                self._complete(job)
                finished += 1
                idle_event = True
            for job in [
                j for j in self.live if j.profile_done_at is not None and j.profile_done_at <= t + _EPS
            ]:
                self._profiled(job)
                idle_event = True
            while (
                self._next_arrival < len(self.jobs) and self.jobs[self._next_arrival].w.arrival_s <= t + _EPS
            ):
                self._arrive(self.jobs[self._next_arrival])
                self._next_arrival += 1
            if t >= next_round - _EPS:
                self._round_start()
                next_round = t + round_s
                finished += self._fail_stranded()
                if progress is not None:
                    progress(finished / len(self.jobs))
            elif idle_event and self.policy.fragment_plans and self._fits_idle():
                self._plan("fragment")
        return self._result()

    # ---- events -----------------------------------------------------------------------------
    def _arrive(self, job: _Job) -> None:
        self.live.append(job)
        self._changed = True
        if self.options.profiling and self._idle_gpus() > 0:
            # Idle GPUs: profile now rather than at the next round start (the plan is not disturbed).
            job.state = transition(job.state, JobState.PROFILING)
            job.profile_done_at = self.now + self.options.profile_s
        if not self.options.profiling:
            for gpu_type in sorted({s.gpu_type for s in self.servers}):
                server = next(s for s in self.servers if s.gpu_type == gpu_type)
                self.estimator.add_profile(
                    job.spec.id,
                    gpu_type,
                    self.world.profile(job.w.model, server, self.rng, rng_key=job.key()),
                    server.calibration,
                )
            job.state = transition(job.state, JobState.QUEUED)

    def _round_start(self) -> None:
        for job in self.live:
            if job.state == JobState.PENDING:
                job.state = transition(job.state, JobState.PROFILING)
                job.profile_done_at = self.now + self.options.profile_s
        self._observe()
        # Level-triggered, as the master: with nobody waiting and nothing changed since the last plan
        # (no arrival, completion, profile, launch or stop), the plan would be the same one.
        if self._changed or self._waiting():
            self._changed = False
            self._plan("first")
            if self.policy.fragment_plans and self._fits_idle():
                self._plan("fragment")
        else:
            self._last_solver_s = 0.0
        idle = self._idle_gpus()
        waiting = self._waiting()
        self.rounds.append(
            RoundRecord(
                start=self.now,
                idle_gpus_after_plan=idle,
                jobs_waiting=waiting,
                solver_s=self._last_solver_s,
                busy_gpus=self.total_gpus - idle,
                total_gpus=self.total_gpus,
            )
        )
        self.timeline.append((self.now, self._normalised_throughput(), idle if waiting else 0))

    def _fail_stranded(self) -> int:
        """Queued jobs the policy will never place: nothing runs, profiles or arrives, yet the plan
        launched nothing. They fail (the live system would report them unplaceable) so the run ends."""
        if self._next_arrival < len(self.jobs) or any(j.config is not None for j in self.live):
            return 0
        if any(j.state in (JobState.PENDING, JobState.PROFILING) for j in self.live):
            return 0
        stranded = [j for j in self.live if j.state == JobState.QUEUED]
        for job in stranded:
            job.state = transition(job.state, JobState.FAILED)
            job.end = None
            self.live.remove(job)
        return len(stranded)

    def _profiled(self, job: _Job) -> None:
        job.profile_done_at = None
        self._changed = True
        for gpu_type in sorted({s.gpu_type for s in self.servers}):
            server = self.rng.choice([s for s in self.servers if s.gpu_type == gpu_type])
            self.estimator.add_profile(
                job.spec.id,
                gpu_type,
                self.world.profile(job.w.model, server, self.rng, rng_key=job.key()),
                server.calibration,
            )
        job.state = transition(job.state, JobState.QUEUED)

    def _complete(self, job: _Job) -> None:
        self._changed = True
        job.done = job.spec.total_samples
        job.state = transition(job.state, JobState.COMPLETED)
        job.end = self.now
        job.config = None
        self.live.remove(job)
        self.estimator.forget(job.spec.id)

    # ---- planning ---------------------------------------------------------------------------
    _last_solver_s: float = 0.0

    def _snapshot(self) -> ClusterSnapshot:
        views = tuple(
            JobView(
                spec=j.spec,
                done_samples=j.done,
                waited_s=j.waited,
                attained_gpu_s=j.attained,
                running_s=j.running_s,
                current=j.config,
                restarts=j.restarts,
                attempt_s=(self.now - j.attempt_start) if j.config is not None else 0.0,
            )
            for j in self.live
            if j.state in (JobState.QUEUED, JobState.RUNNING, JobState.LAUNCHING)
        )
        return ClusterSnapshot(tuple(self.servers), dict(self.capacity), views, self.now, self.tenants)

    def _plan(self, kind: PlanKind) -> Plan:
        snapshot = self._snapshot()
        t0 = self.timer()
        plan = self.policy.plan(snapshot, self.estimator, kind, self.timer)
        solver_s = self.timer() - t0
        self._last_solver_s = solver_s if kind == "first" else self._last_solver_s + solver_s
        by_id = {j.spec.id: j for j in self.live}
        current = {j.spec.id: j.config for j in self.live if j.config is not None}
        desired = {jid: c for jid, c in plan.assignments.items() if jid in by_id}
        if kind == "fragment":
            desired = {**current, **{jid: c for jid, c in desired.items() if jid not in current}}
        delay = solver_s if self.options.charge_solver else 0.0
        for action in reconcile(current, desired, self.capacity):
            self._changed = True
            job = by_id[action.job_id]
            if isinstance(action, CheckpointStop):
                job.state = transition(job.state, JobState.CHECKPOINTING)
                job.state = transition(job.state, JobState.QUEUED)
                job.config = None
                job.rate = 0.0
                job.restarts += 1
                if action.reason == "migrated":
                    self.migrations += 1
                else:
                    self.preemptions += 1
            elif isinstance(action, Launch):
                job.state = transition(job.state, JobState.LAUNCHING)
                job.state = transition(job.state, JobState.RUNNING)
                job.config = action.config
                parts = [(self.by_id[s], g) for s, g in action.config.parts]
                job.rate = self.world.true_rate(job.w.model, parts, job.key())
                job.ready_at = self.now + job.spec.restart_s + delay
                job.attempt_start = self.now
                job.first_start = self.now if job.first_start is None else job.first_start
        return plan

    def _observe(self) -> None:
        """Running jobs report a measured throughput; the estimator's error is sampled first."""
        for job in self.live:
            if job.config is None or self.now < job.ready_at:
                continue
            if self.now - job.last_observed < self.options.observe_every_s:
                continue
            parts = [(self.by_id[s], g) for s, g in job.config.parts]
            here = set(job.config.servers)
            seen = here <= job.ran_on
            self._sample_error(job, job.config, parts, seen)
            other = self._unseen_server(job.ran_on | here)
            if other is not None:
                self._sample_error(job, Config.single(other.id, 1), [(other, 1)], False)
            measured = self.world.sample_rate(job.w.model, parts, self.rng, rng_key=job.key())
            self.estimator.observe(job.spec.id, job.config, self.by_id, measured, job=job.spec)
            job.ran_on.update(job.config.servers)
            job.last_observed = self.now

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

    def _sample_error(self, job: _Job, config: Config, parts: list[tuple[Server, int]], seen: bool) -> None:
        predicted = self.estimator.config_rate(job.spec, config, self.by_id)
        true = self.world.true_rate(job.w.model, parts, job.key())
        if predicted is not None and true > 0:
            per_gpu_error = abs(predicted - true) / true  # same GPU count: total and per-GPU errors match
            self.samples.append(EstimatorSample(self.now, per_gpu_error, seen))

    # ---- measures ---------------------------------------------------------------------------
    def _idle_gpus(self) -> int:
        return self.total_gpus - sum(j.config.gpus for j in self.live if j.config is not None)

    def _fits_idle(self) -> bool:
        """Some queued job's smallest requirement fits in the idle GPUs (worth a fragment plan)."""
        idle = self._idle_gpus()
        return idle > 0 and any(
            j.state == JobState.QUEUED and j.spec.requirements.minimum <= idle for j in self.live
        )

    def _waiting(self) -> int:
        return sum(1 for j in self.live if j.state == JobState.QUEUED)

    def _normalised_throughput(self) -> float:
        total = 0.0
        for job in self.live:
            if job.config is not None and self.now >= job.ready_at:
                total += job.rate / max(self.world.reference_rate(job.w.model, 1), _EPS)
        return total

    def _expected_run_s(self, job: _Job) -> float:
        """HOPS.md age with true speeds: sum_type P(type) * samples / (rate_type(1 GPU) * R_avg)."""
        total = 0.0
        for gpu_type in sorted({s.gpu_type for s in self.servers}):
            share = sum(s.gpus for s in self.servers if s.gpu_type == gpu_type) / self.total_gpus
            rate = self.world.reference_rate(job.w.model, 1, gpu_type)
            total += share * job.spec.total_samples / (rate * job.spec.requirements.mean)
        return total

    def _result(self) -> SimResult:
        records = []
        for job in self.jobs:
            expected = self._expected_run_s(job)
            life = (job.end if job.end is not None else self.now) - job.w.arrival_s
            contenders = job.active_integral / life if life > 0 else 1.0
            ideal = expected * max(1.0, contenders * job.spec.requirements.mean / self.total_gpus)
            records.append(
                JobRecord(
                    job_id=job.spec.id,
                    tenant=job.spec.tenant,
                    gpus_min=job.spec.requirements.minimum,
                    submit_time=job.w.arrival_s,
                    first_start=job.first_start,
                    end_time=job.end,
                    waited_s=job.waited,
                    expected_run_s=expected,
                    ideal_s=ideal,
                    completed=job.state == JobState.COMPLETED,
                )
            )
        span = (max((j.end or 0.0) for j in self.jobs) - self.jobs[0].w.arrival_s) if self.jobs else 0.0
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
        )
