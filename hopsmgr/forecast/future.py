"""One sampled future: the live state restored into the simulator's driver and run forward.

`LiveState` is a copy of what the master's state machine holds (jobs, open attempts, nodes, tenants,
the estimator's state) and of recent submissions, taken at `now`. `Future` is a Simulation
(hopsmgr.sim.engine) that starts from it instead of an empty cluster: healthy nodes beat, the jobs
and attempts are handed over with `StateRestored`, running attempts go on at the estimator's rate
(times this future's error, hopsmgr.forecast.world) from their progress, checkpoints being written end
after the checkpoint's fixed time, and new jobs arrive as a Poisson process at the recent rate, each
a copy of a job submitted within the window (live, or completed since: `_arrival_pool`). The machine
then runs as in any simulation; `started` and `finished` record when each job launched and completed.

What a forecast assumes: waiting jobs not yet profiled have the profile of the latest profiled job
(of the same model when there is one) and arrive in the future when their profiling would end
(`LiveState.profiling_left`), queued at once then, their waits counted from their submission; plans are made by
hopsmgr.forecast.policy (the Hops planner for the first plans, then Hops' order, greedy placement).
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hopsmgr.control.commands import JobChange, LaunchAttempt
from hopsmgr.control.events import (
    AttemptEnded,
    AttemptStarted,
    JobSubmitted,
    NodeBeat,
    RoundTick,
    StateRestored,
)
from hopsmgr.control.records import Attempt, EndedJob, Job
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import JobSpec, JobView, Server
from hopsmgr.core.priority import PriorityContext, remaining_run_s
from hopsmgr.forecast.live import WAITING, LiveState
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.world import EstimatedWorld
from hopsmgr.nodecontract import EXIT_CHECKPOINTED
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.simstate import RunEnd, SimOptions, SimRun, job_key
from hopsmgr.sim.workload import WorkloadJob

_AFTER_S = 1e-3  # a held job waiting for another held job arrives this long after it


@dataclass(frozen=True, slots=True)
class FutureOptions:
    sigma: float = 0.15  # log-normal error of the estimator's rates, drawn per job and future
    horizon_s: float = 14 * 86400.0
    arrivals: bool = True
    max_arrivals: int = 2000
    checkpoint_s: float = 5.0
    round_every: float = 1.0  # > 1: periodic rounds less often than live (faster, fewer preemptions)
    min_round_s: float = (
        60.0  # and never more often than this: a 2-s round (tests, demos) costs much, tells little
    )
    fragment_gap_s: float = 60.0  # fragment plans at most this often (fewer plans; starts up to this late)
    # rounds and fragment plans at least this fraction of the future's elapsed time apart: a start
    # forecast t ahead may come up to ~5% of t late, far inside its P10-P90 (SimOptions.round_growth)
    round_growth: float = 0.05
    keep_bonus: float = 0.0  # hopsmgr.forecast.policy: how far ahead a waiting job must be to preempt
    # wall seconds a future may spend in the Hops planner itself before it plans greedily
    exact_s: float = 0.2


class _Templates:
    """Whose profile a job not profiled yet borrows: the latest profiled job of the same model, else of
    the same user and name, else of the same user, else the latest of all (indexed once: a queue of
    thousands of unprofiled jobs would otherwise scan every profiled job for each)."""

    def __init__(self, profiled: Sequence[Job]) -> None:
        self.by_model: dict[str, Job] = {}
        self.by_name: dict[tuple[str, str], Job] = {}
        self.by_user: dict[str, Job] = {}
        self.latest: Job | None = None
        for p in profiled:
            spec = p.spec
            if spec.model:
                self._keep(self.by_model, spec.model, p)
            if spec.name:
                self._keep(self.by_name, (spec.user, spec.name), p)
            self._keep(self.by_user, spec.user, p)
            if self.latest is None or _later(p, self.latest):
                self.latest = p

    @staticmethod
    def _keep(index: dict[Any, Job], key: Any, job: Job) -> None:
        found = index.get(key)
        if found is None or _later(job, found):
            index[key] = job

    def of(self, job: Job) -> Job | None:
        spec = job.spec
        return (
            (self.by_model.get(spec.model) if spec.model else None)
            or (self.by_name.get((spec.user, spec.name)) if spec.name else None)
            or self.by_user.get(spec.user)
            or self.latest
        )


def _by_id(server: Server) -> str:
    return server.id


def _later(a: Job, b: Job) -> bool:
    return (a.submitted, a.id) > (b.submitted, b.id)


class Future(Simulation):
    def __init__(
        self,
        live: LiveState,
        seed: int,
        options: FutureOptions,
        estimator: Estimator,
        clock: Callable[[], float] | None = None,
    ) -> None:
        rng = random.Random(seed)
        jobs = copy.deepcopy(list(live.jobs))
        types = {s.gpu_type for s in live.servers}
        profiled = [j for j in jobs if estimator.profiled_types(j.id)]
        templates_of = _Templates(profiled)
        # with no live job alike, one that completed lately (an idle cluster's what-if)
        ended_of = _Templates([Job(e.spec, JobState.COMPLETED, e.submitted, e.submitted) for e in live.ended])
        ended_profiles = {e.spec.id: e.profiles for e in live.ended}
        self.forecastable: set[str] = set()
        for job in jobs:
            if not estimator.profiled_types(job.id):
                template = templates_of.of(job)
                if template is not None:
                    for gpu_type in sorted(types & estimator.profiled_types(template.id)):
                        found = estimator.profile_of(template.id, gpu_type)
                        assert found is not None
                        estimator.add_profile(job.id, gpu_type, *found)
                elif (done := ended_of.of(job)) is not None:
                    # an ended job keeps its profiles without the calibration they were measured on:
                    # the first server of the type stands for it
                    for gpu_type, profile in ended_profiles[done.id]:
                        if gpu_type in types:
                            server = min((s for s in live.servers if s.gpu_type == gpu_type), key=_by_id)
                            estimator.add_profile(job.id, gpu_type, profile, server.calibration)
                else:
                    continue  # nothing to go by: no forecast for it
            self.forecastable.add(job.id)
        templates = {j.id: j.spec for j in jobs}
        # [ours] a job not profiled yet arrives in this future when its profiling would end (it takes
        # no GPUs of the plan before then), keeping its submission time (its wait counts from it)
        self.held = _held(live, [j for j in jobs if j.id in self.forecastable])
        self._submitted = {j.id: j.submitted for j in jobs if j.id in self.held}
        workload = [_workload(j.spec, self.held.get(j.id, j.spec.submit_time), j.id) for j in jobs]
        specs = dict(templates)
        ended: list[EndedJob] = []
        if options.arrivals and profiled and live.recent:
            recent = [j for j in jobs if j.id in self.forecastable]  # profiled, or borrowing a profile
            pool, weights, ended = _arrival_pool(live, jobs, recent, profiled, types)
            templates.update((e.spec.id, e.spec) for e in ended)
            until = live.now + min(options.horizon_s, _drain_s(live, jobs, estimator))
            for w in _arrivals(live, pool, weights, rng, options, until):
                workload.append(w)
                specs[w.job_id] = replace(templates[w.model], id=w.job_id, submit_time=w.arrival_s)
        extra = {e.spec.id: {t: p for t, p in e.profiles if t in types} for e in ended}
        world = EstimatedWorld(estimator, templates, specs, live.servers, rng, options.sigma, extra)
        sim_options = SimOptions(
            profiling=False,
            observe_every_s=1e18,
            checkpoint_fixed_s=options.checkpoint_s,
            max_sim_s=options.horizon_s,
            seed=seed,
            fragment_gap_s=options.fragment_gap_s,
            round_growth=options.round_growth,
        )
        round_s = max(live.round_s * options.round_every, options.min_round_s)
        scheduler = replace(live.scheduler, round_seconds=round_s)
        policy = ForecastPolicy(
            scheduler,
            keep_bonus=options.keep_bonus,
            fixed_rates=True,
            exact_s=options.exact_s,
            clock=clock,
        )
        super().__init__(
            world,
            live.servers,
            workload,
            policy,
            sim_options,
            lambda: 0.0,
            estimator=estimator,
            tenants={t.name: t for t in live.tenants},
        )
        for job in jobs:
            if job.id not in self.held:
                continue
            if self.machine.refusal(job.spec) is not None:  # accepted under an older cluster file:
                del self.held[job.id]  # restored as it is, as the live machine keeps it
            else:  # it arrives as it is, not as the workload row would make it
                self.jobs[job.id].spec = job.spec
        self.started: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.open = {j.id for j in jobs}  # live jobs not ended yet in this future
        self.now = live.now
        for server in self.servers:
            if server.id in live.healthy:
                self.feed(NodeBeat("future-node", server.id, True, server, live.usable.get(server.id)))
        restored = []
        for job in jobs:
            if job.state in (JobState.PENDING, JobState.PROFILING):
                job.state = JobState.QUEUED  # the forecast's assumption: its profiling is done
            job.profiling = set()
            if job.id in self.forecastable and job.id not in self.held:
                restored.append(job)
        kept = {j.id for j in restored}
        attempts = [a for a in copy.deepcopy(list(live.attempts)) if not a.profiling and a.job_id in kept]
        self.feed(
            StateRestored("future-restore", tuple(restored), tuple(attempts), live.attempt_seq, live.drained)
        )
        by_id = {j.id: j for j in restored}
        for attempt in attempts:
            self._go_on(attempt, by_id[attempt.job_id], live.now)
        self.open &= kept | set(self.held)
        self._live = len(restored)
        end = live.now + options.horizon_s
        late = {j for j, at in self.held.items() if at > end}  # open, but never arrives in time
        skipped = {j.id for j in jobs} - kept - (set(self.held) - late)
        self.order = [j for j in self.order if j.spec.id not in skipped]
        if self.order:  # the engine counts its horizon from the last arrival: here it ends at the
            # forecast's own, so a job no future started was not started within it, and none later
            self.options = replace(self.options, max_sim_s=max(0.0, end - self.order[-1].w.arrival_s))
        self.resume_at(max(live.now, live.next_round), frozenset(kept))

    def _go_on(self, attempt: Attempt, job: Job, now: float) -> None:
        """A restored attempt goes on as the simulated executor would have run it so far."""
        truth = self.jobs[job.id]
        truth.done = job.done_samples
        if not attempt.launched:
            return  # the second half of a move: the machine launches it once its stop ended
        parts = [(self.by_id[s], g) for s, g in attempt.placement.parts]
        rate = self.world.true_rate(job.id, parts, job_key(job.id))
        started = attempt.started is not None
        ready = now if started else now + job.spec.restart_s
        if started and not attempt.stopping:  # progress since its last report, at the estimated rate
            # (from its last progress report, not its last throughput observation: those come at most
            # every observe_every_s, and the progress between them is in done_samples already)
            since = attempt.progressed_at if math.isfinite(attempt.progressed_at) else attempt.started
            assert since is not None
            job.done_samples = min(job.spec.total_samples, job.done_samples + rate * max(0.0, now - since))
            truth.done = job.done_samples
        run = SimRun(attempt.id, job.id, attempt.placement, rate, now, ready, job.done_samples, self._token())
        self.runs[attempt.id] = run
        if not started:  # launched, not confirmed yet: it starts now, as the simulated executor's do
            self._at(now, AttemptStarted("future-started", attempt.id))
        if attempt.stopping:  # a checkpoint being written: it ends soon, with the progress it has
            run.stopped = True
            end = AttemptEnded(
                "future-checkpointed",
                attempt.id,
                "exited",
                EXIT_CHECKPOINTED,
                True,
                done_samples=job.done_samples,
            )
            self._at(
                now + self.options.checkpoint_fixed_s,
                RunEnd(end.stimulus_id, attempt.id, token=run.token, ended=end),
            )
            return
        if rate > 0:
            finish = ready + max(0.0, job.spec.total_samples - job.done_samples) / rate
            self._at(finish, RunEnd("future-exit", attempt.id, token=run.token))

    def _launch(self, command: LaunchAttempt) -> None:
        # Started at once, within the same hand-over (the simulated executor's own start event comes
        # later and is then moot): no plan of a future sees a LAUNCHING job, which could not be stopped.
        super()._launch(command)
        self._pending.append(AttemptStarted("future-started", command.attempt_id))

    def _arrive(self, job: Any) -> None:
        if job.spec.id not in self.held:
            super()._arrive(job)
            return
        # a held live job: the estimator has its profiles (its own, or borrowed in __init__), so it
        # arrives with none (the world's would put one type's profile on every type)
        self._live += 1
        job.arrival_integral = self._live_integral
        self.feed(JobSubmitted("future-held", job.spec, "simulator", {}))
        record = self.machine.state.jobs.get(job.spec.id)
        if record is not None:
            record.submitted = self._submitted[job.spec.id]  # as live: its wait counts from then

    def _changed(self, change: JobChange) -> None:
        super()._changed(change)
        if change.new == JobState.LAUNCHING:
            self.started.setdefault(change.job_id, change.at)
        elif change.new == JobState.COMPLETED:
            self.finished[change.job_id] = change.at
        if change.new in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
            self.open.discard(change.job_id)

    @property
    def planner_fell_back(self) -> bool:
        """A plan of the Hops planner in this future came too late and was replaced (policy.py)."""
        return isinstance(self.policy, ForecastPolicy) and self.policy.exact_fell_back

    def go(self, only: str | None = None) -> None:
        """Run until every live job ended, or (`only`) until that one has."""
        # first a fragment plan now, as the live machine asks for one when work waits beside idle GPUs
        self.feed(RoundTick("future-fragment", "fragment"))
        if only is None:
            self.advance(until=lambda: not self.open)
        else:
            self.advance(until=lambda: only not in self.open)


def _held(live: LiveState, jobs: Sequence[Job]) -> dict[str, float]:
    """When each waiting job not profiled yet would arrive in a future (its profiling over, at
    `LiveState.profiling_left`), and each job that waits for a held one (`after`) just after it,
    so the machine sees it wait; the others arrive at once (not in the result)."""
    held = {
        j.id: ready
        for j in jobs
        if j.state in (JobState.PENDING, JobState.PROFILING)
        and j.spec.runtime
        and (ready := live.now + live.profiling_left(_profiling_for(j, live.now))) > live.now
    }
    waiting = [j for j in jobs if j.state in WAITING and j.spec.after]
    for _ in range(len(waiting)):  # dependencies are older jobs: no cycles; at most one pass each
        moved = False
        for j in waiting:
            after = [held[d] for d in j.spec.after if d in held]
            if after and held.get(j.id, -math.inf) <= max(after):
                held[j.id] = max(after) + _AFTER_S
                moved = True
        if not moved:
            break
    return held


def _profiling_for(job: Job, now: float) -> float:
    """How long the job's profiling has taken so far (0: a PENDING job's has not begun)."""
    return max(0.0, now - job.state_since) if job.state == JobState.PROFILING else 0.0


def _workload(spec: JobSpec, at: float, model: str, job_id: str | None = None) -> WorkloadJob:
    return WorkloadJob(
        job_id=job_id or spec.id,
        arrival_s=at,
        model=model,
        requirements=spec.requirements,
        total_samples=spec.total_samples,
        batch_size=spec.batch_size,
        tenant=spec.tenant,
    )


def _drain_s(live: LiveState, jobs: Sequence[Job], estimator: Estimator) -> float:
    """How long arrivals matter: about until the live jobs could all have run (1.5 x their GPU time
    over the cluster's GPUs, plus the longest of them), at the estimator's rates."""
    total = sum(live.usable.values()) or 1
    shares: dict[str, float] = {}
    for server in live.servers:
        shares[server.gpu_type] = shares.get(server.gpu_type, 0.0) + server.gpus / total
    ctx = PriorityContext(now=live.now, type_share=shares, rate=estimator.type_rate, total_gpus=total)
    work = 0.0
    longest = 0.0
    for job in jobs:
        view = JobView(job.spec, done_samples=job.done_samples)
        left = remaining_run_s(view, ctx)
        if math.isfinite(left):
            work += left * job.spec.requirements.minimum
            longest = max(longest, left)
    return 1.5 * (work / total + longest) + live.round_s


def _arrival_pool(
    live: LiveState,
    jobs: Sequence[Job],
    forecastable: Sequence[Job],
    profiled: Sequence[Job],
    types: set[str],
) -> tuple[list[tuple[str, JobSpec]], list[float], list[EndedJob]]:
    """What new jobs are copies of, with their weights, and the ended jobs among them: the jobs
    submitted within the window, live (`forecastable`: with a profile of their own or borrowed) or
    completed since. Live jobs alone would be a survivor's sample (the long and wide jobs stay, the
    short ones have ended): a queue that grows would be forecast to grow faster. The kept completed
    jobs (the latest 256 to complete, `SchedulerMachine.recently_ended`) stand for all the window's
    submissions that are no longer live, in equal shares. None of either: every `profiled` live job.
    """
    since = live.now - live.window_s
    recent = sum(1 for t in live.recent if since <= t <= live.now)
    live_recent = [j for j in forecastable if j.submitted >= since]
    ended_count = max(0, recent - sum(1 for j in jobs if j.submitted >= since))
    ids = {j.id for j in jobs}
    ended = [
        e
        for e in live.ended
        if ended_count
        and e.submitted >= since
        and e.spec.id not in ids
        and any(t in types for t, _ in e.profiles)
    ]
    pool = [(j.id, j.spec) for j in live_recent] + [(e.spec.id, e.spec) for e in ended]
    if not pool:
        return [(j.id, j.spec) for j in profiled], [1.0] * len(profiled), []
    weights = [1.0] * len(live_recent) + [ended_count / len(ended) if ended else 0.0] * len(ended)
    return pool, weights, ended


def _arrivals(
    live: LiveState,
    pool: Sequence[tuple[str, JobSpec]],
    weights: Sequence[float],
    rng: random.Random,
    options: FutureOptions,
    until: float,
) -> list[WorkloadJob]:
    """New jobs as a Poisson process at the recent submission rate, each a copy of a job of `pool`
    (id, spec) drawn by `weights`."""
    recent = [t for t in live.recent if live.now - live.window_s <= t <= live.now]
    if not recent:
        return []
    rate = len(recent) / live.window_s
    cumulative = list(itertools.accumulate(weights))
    out: list[WorkloadJob] = []
    t = live.now
    end = until
    while len(out) < options.max_arrivals:
        t += rng.expovariate(rate)
        if t > end:
            break
        pick = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
        template_id, spec = pool[min(pick, len(pool) - 1)]
        out.append(_workload(spec, t, template_id, f"f-{len(out) + 1:06d}"))
    return out
