"""Tests of hopsmgr.sim.engine: the discrete-event simulator driven directly, with real policies.

The world is the "paper" one (no shared data needed) on a small 16-GPU cluster of four servers; the
Poisson workloads are scaled down so that every run takes a fraction of a second. A recording wrapper
around the policy sees every plan, and a `Simulation` subclass checks the placements after every
reconciled plan and keeps each job's state history.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from hopsmgr.control.diagram import EMITS
from hopsmgr.control.events import Event
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import TRANSITIONS, JobState
from hopsmgr.core.metrics import placeable_idle_per_round
from hopsmgr.core.model import ClusterSnapshot, Config, RequirementSet, Server, TenantQuota
from hopsmgr.core.planner import Plan, PlanKind
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import Policy, Timer
from hopsmgr.policies.fifo import FifoPolicy
from hopsmgr.policies.registry import POLICY_NAMES, make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.oracle import OracleEstimator
from hopsmgr.sim.outcome import SimResult
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions, job_key, unseen_server
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob, poisson_workload

WORLD = paper_world(seed=1)
SERVERS = (
    Server("rtx-a1", "rtx3090", 4, host_model="A", order=1),
    Server("rtx-a2", "rtx3090", 4, host_model="A", order=2),
    Server("txp-1", "titanxp", 4, order=3),
    Server("gtx-1", "gtx1080ti", 4, order=4),
)
CAPACITY = {s.id: s.gpus for s in SERVERS}
PROFILE_S = 60.0


def small_workload(
    world: World = WORLD, jobs: int = 8, rate: float = 30.0, seed: int = 2, scale: float = 0.1
) -> list[WorkloadJob]:
    """A Poisson workload with its work scaled down (every requirement fits the 16-GPU cluster)."""
    out = [
        dataclasses.replace(j, total_samples=j.total_samples * scale)
        for j in poisson_workload(world, jobs, rate, seed=seed)
    ]
    assert all(j.requirements.minimum <= 8 for j in out)
    return out


def one_job(
    job_id: str = "solo",
    model: str = "GPT-2 medium",
    gpus: int = 1,
    seconds: float = 1000.0,
    arrival: float = 0.0,
) -> WorkloadJob:
    """A rigid job with about `seconds` of work on one nominal reference GPU."""
    spec = WORLD.model(model)
    return WorkloadJob(
        job_id=job_id,
        arrival_s=arrival,
        model=spec.name,
        requirements=RequirementSet.rigid(gpus),
        total_samples=seconds * WORLD.reference_rate(spec.name, gpus),
        batch_size=spec.batch_size,
    )


# ------------------------------------------------------------------------------ instrumentation


class RecordingPolicy:
    """A real policy, wrapped: every plan call (kind, time, assignments) is recorded and checked."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.round_seconds = inner.round_seconds
        self.fragment_plans = inner.fragment_plans
        self.calls: list[tuple[PlanKind, float, dict[str, Config]]] = []
        self.problems: list[str] = []

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        plan = self.inner.plan(snapshot, estimator, kind, timer)
        self.calls.append((kind, snapshot.now, dict(plan.assignments)))
        used: Counter[str] = Counter()
        known = {v.id for v in snapshot.jobs}
        for job_id, config in plan.assignments.items():
            if job_id not in known:
                self.problems.append(f"t={snapshot.now}: plan assigns unknown job {job_id!r}")
            for sid, g in config.parts:
                used[sid] += g
        for sid, n in used.items():
            if n > snapshot.capacity.get(sid, 0):
                self.problems.append(f"t={snapshot.now} {kind}: plan gives {sid} {n} GPUs")
        return plan


class CheckedSimulation(Simulation):
    """After every event the machine handled: no server holds more GPUs than it has and no GPU index is
    given twice, every placed job is launching or running at one of its requirement counts on known
    servers, and each job is live in the machine or ended, never both."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.violations: list[str] = []
        handle = self.machine.handle

        def checked(event: Event, now: float) -> list[Any]:
            out = handle(event, now)
            allowed = EMITS[type(event)]
            self.violations += [
                f"{type(event).__name__} -> {type(c).__name__}" for c in out if not isinstance(c, allowed)
            ]
            return out

        self.machine.handle = checked  # type: ignore[method-assign]

    def feed(self, event: Event) -> None:
        super().feed(event)
        state = self.machine.state
        used: Counter[str] = Counter(state.occupied())
        if state.held() != state.held_recount():
            self.violations.append(
                f"t={self.now}: claims kept {state.held()}, counted {state.held_recount()}"
            )
        if state.profiling_gpus != state.profiling_gpus_recount():
            self.violations.append(
                f"t={self.now}: profiling GPUs kept {state.profiling_gpus}, "
                f"counted {state.profiling_gpus_recount()}"
            )
        for sid, n in state.held().items():
            if n > self.by_id[sid].gpus:
                self.violations.append(f"t={self.now}: {sid} claimed {n} GPUs")
        devices: Counter[tuple[str, int]] = Counter()
        for attempt in state.attempts.values():
            for sid in attempt.placement.servers:
                if sid not in self.by_id:
                    self.violations.append(f"t={self.now}: {attempt.id} on unknown server {sid!r}")
            if attempt.launched and sum(len(d) for d in attempt.devices.values()) != attempt.placement.gpus:
                self.violations.append(f"t={self.now}: {attempt.id} devices {attempt.devices}")
            for sid, ds in attempt.devices.items():
                devices.update((sid, d) for d in ds)
            job = state.jobs.get(attempt.job_id)
            if job is not None and job.attempt == attempt.id and not attempt.stopping:
                if job.state not in (JobState.RUNNING, JobState.LAUNCHING):
                    self.violations.append(f"t={self.now}: {job.id} placed in state {job.state}")
                if attempt.placement.gpus not in job.spec.requirements.counts:
                    self.violations.append(f"t={self.now}: {job.id} on {attempt.placement.gpus} GPUs")
        for sid, n in used.items():
            if n > CAPACITY.get(sid, self.by_id[sid].gpus):
                self.violations.append(f"t={self.now}: {sid} holds {n} GPUs")
        self.violations += [f"t={self.now}: GPU {k} given twice" for k, n in devices.items() if n > 1]
        for job_id in state.jobs:
            if self.jobs[job_id].final is not None:
                self.violations.append(f"t={self.now}: {job_id} ended and live")

    def _round(self) -> None:
        """The round's record against a recount: the largest free block from the claims counted
        afresh over every attempt, the smallest count over the queued jobs not profiling."""
        super()._round()
        record, state = self.rounds[-1], self.machine.state
        held = state.held_recount()
        free = [n.usable_gpus - held.get(sid, 0) for sid, n in state.nodes.items()]
        queued = [j for j in state.jobs.values() if j.state == JobState.QUEUED]
        counts = [j.spec.requirements.minimum for j in queued if not (j.profiling or state.waits_for(j))]
        expected = (max([0, *free]), min(counts, default=None), sum(f for f in free if f > 0), len(queued))
        got = (
            record.largest_free_block,
            record.smallest_waiting,
            record.idle_gpus_after_plan,
            record.jobs_waiting,
        )
        if got != expected:
            self.violations.append(f"t={self.now}: round record {got}, recounted {expected}")

    @property
    def live(self) -> dict[str, Any]:
        return self.machine.state.jobs

    def histories(self) -> dict[str, list[JobState]]:
        return {job_id: truth.history for job_id, truth in self.jobs.items()}


def simulate(
    policy: Policy | str,
    workload: Sequence[WorkloadJob],
    servers: Sequence[Server] = SERVERS,
    world: World = WORLD,
    estimator: Estimator | None = None,
    **options: Any,
) -> tuple[CheckedSimulation, RecordingPolicy, SimResult]:
    inner = make_policy(policy, SchedulerSettings()) if isinstance(policy, str) else policy
    wrapped = RecordingPolicy(inner)
    options.setdefault("profile_s", PROFILE_S)
    options.setdefault("seed", 1)
    sim = CheckedSimulation(
        world, servers, workload, wrapped, SimOptions(**options), time.perf_counter, estimator
    )
    return sim, wrapped, sim.run()


@pytest.fixture(scope="module")
def by_policy() -> dict[str, tuple[CheckedSimulation, RecordingPolicy, SimResult]]:
    """Every registered policy once on the same small workload (profiling and restart costs on)."""
    workload = small_workload()
    return {name: simulate(name, workload) for name in POLICY_NAMES}


# ------------------------------------------------------------------------------ every policy


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_job_completes(
    by_policy: dict[str, tuple[CheckedSimulation, RecordingPolicy, SimResult]], name: str
) -> None:
    sim, policy, result = by_policy[name]
    assert result.policy == name
    assert len(result.jobs) == 8
    assert all(r.completed for r in result.jobs), [r.job_id for r in result.jobs if not r.completed]
    assert all(r.end_time is not None and r.first_start is not None for r in result.jobs)
    assert not sim.live
    assert result.span_s == pytest.approx(max(r.end_time or 0.0 for r in result.jobs))
    assert result.rounds and policy.calls
    assert 0 < result.busy_gpu_s <= result.total_gpus * result.span_s + 1e-6


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_plans_never_overfill_a_server(
    by_policy: dict[str, tuple[CheckedSimulation, RecordingPolicy, SimResult]], name: str
) -> None:
    sim, policy, _ = by_policy[name]
    assert sim.plans, "no plan was made"
    assert policy.problems == []
    assert sim.violations == []
    kinds = {kind for kind, _ in sim.plans}
    if not policy.fragment_plans:
        assert kinds == {"first"}  # policies without fragment plans are asked at round starts only
    # One first plan per round, except rounds where nobody waited and nothing had changed (skipped).
    firsts = sum(kind == "first" for kind, _ in sim.plans)
    assert sum(r.jobs_waiting > 0 for r in sim.rounds) <= firsts <= len(sim.rounds)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_lifecycle_follows_the_table(
    by_policy: dict[str, tuple[CheckedSimulation, RecordingPolicy, SimResult]], name: str
) -> None:
    sim, _, result = by_policy[name]
    histories = sim.histories()
    assert set(histories) == {r.job_id for r in result.jobs}
    for job_id, states in histories.items():
        assert states[0] == JobState.PENDING and states[-1] == JobState.COMPLETED, (job_id, states)
        for old, new in itertools.pairwise(states):
            assert new in TRANSITIONS[old], (job_id, old, new)
        # Profiling on: PENDING -> PROFILING -> QUEUED before the first launch.
        assert states[1:3] == [JobState.PROFILING, JobState.QUEUED], (job_id, states)
        assert JobState.LAUNCHING in states and states.index(JobState.LAUNCHING) > 2
        assert states.count(JobState.PROFILING) == 1
    for record in result.jobs:
        assert record.first_start is not None and record.end_time is not None
        assert record.first_start >= record.submit_time + PROFILE_S - 1e-6, record
        assert record.end_time > record.first_start
        assert record.waited_s >= PROFILE_S - 1e-6


def test_fifo_never_preempts(
    by_policy: dict[str, tuple[CheckedSimulation, RecordingPolicy, SimResult]],
) -> None:
    sim, _, result = by_policy["fifo"]
    assert result.preemptions == 0
    assert result.migrations == 0
    for states in sim.histories().values():
        assert JobState.CHECKPOINTING not in states
        assert states.count(JobState.LAUNCHING) == 1


def test_fifo_never_preempts_under_contention() -> None:
    # Many jobs arriving at once on half the cluster: FIFO still only ever launches, never stops.
    workload = small_workload(jobs=14, rate=600.0, seed=5, scale=0.05)
    sim, _, result = simulate("fifo", workload, servers=SERVERS[:2])
    assert all(r.completed for r in result.jobs)
    assert result.preemptions == 0 and result.migrations == 0
    assert sim.violations == []
    assert max(r.waited_s for r in result.jobs) > 2 * PROFILE_S  # there was contention


def test_lifecycle_without_profiling_skips_profiling() -> None:
    sim, _, result = simulate("hops", small_workload(jobs=5), profiling=False, restart_costs=False)
    assert all(r.completed for r in result.jobs)
    for job_id, states in sim.histories().items():
        assert states[:2] == [JobState.PENDING, JobState.QUEUED], (job_id, states)
        assert JobState.PROFILING not in states
        for old, new in itertools.pairwise(states):
            assert new in TRANSITIONS[old]


# ------------------------------------------------------------------------------ restart delay


class _Probe(CheckedSimulation):
    """Records (time, samples done) of every running attempt at every round start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress: list[tuple[float, float]] = []

    def _round(self) -> None:
        self.progress.extend((self.now, run.done_at(self.now)) for run in self.runs.values())
        super()._round()


@pytest.mark.parametrize("profiling", [False, True])
def test_launch_makes_no_progress_during_restart_delay(profiling: bool) -> None:
    server = Server("only", "rtx3090", 1, host_model="A")
    job = one_job(seconds=900.0)
    restart_s = WORLD.model(job.model).restart_s
    assert restart_s > 200  # GPT-2 medium: 25 s + 0.15 s/MB, capped at 250 s
    policy = RecordingPolicy(FifoPolicy(round_seconds=100.0))
    sim = _Probe(
        WORLD,
        [server],
        [job],
        policy,
        SimOptions(profile_s=PROFILE_S, profiling=profiling, seed=3),
        time.perf_counter,
    )
    result = sim.run()
    (record,) = result.jobs
    rate = WORLD.true_rate(job.model, [(sim.by_id["only"], 1)], job_key(job.job_id))
    assert record.first_start == pytest.approx(PROFILE_S if profiling else 0.0)
    assert record.end_time is not None and record.first_start is not None
    expected_end = record.first_start + restart_s + job.total_samples / rate
    assert record.end_time == pytest.approx(expected_end, rel=1e-9, abs=1e-6)
    ready = record.first_start + restart_s
    during = [(t, done) for t, done in sim.progress if t < ready]
    after = [(t, done) for t, done in sim.progress if t > ready]
    assert during and after
    assert all(done == 0.0 for _, done in during), during
    for t, done in after:
        assert done == pytest.approx((t - ready) * rate, rel=1e-9)


def test_without_restart_costs_progress_starts_at_launch() -> None:
    server = Server("only", "rtx3090", 1, host_model="A")
    job = one_job(seconds=600.0)
    _, _, result = simulate(
        FifoPolicy(round_seconds=100.0), [job], servers=[server], profiling=False, restart_costs=False
    )
    (record,) = result.jobs
    rate = WORLD.true_rate(job.model, [(server, 1)], job_key(job.job_id))
    assert record.first_start == 0.0
    assert record.end_time == pytest.approx(job.total_samples / rate, rel=1e-9)


# ------------------------------------------------------------------------------ determinism


def _oracle_run(name: str, workload: Sequence[WorkloadJob]) -> SimResult:
    world = paper_world(seed=4, per_server_sigma=0.0)
    sim_servers = {
        s.id: Server(s.id, s.gpu_type, s.gpus, world.calibration(s), s.host_model, s.order) for s in SERVERS
    }
    estimator = OracleEstimator(world, sim_servers, {w.job_id: job_key(w.job_id) for w in workload})
    _, _, result = simulate(
        name, workload, world=world, estimator=estimator, profiling=False, restart_costs=False, seed=4
    )
    return result


@pytest.mark.parametrize("name", ["hops", "gavel"])
def test_gavel_compat_runs_are_deterministic(name: str) -> None:
    workload = small_workload(paper_world(seed=4, per_server_sigma=0.0), jobs=10, rate=40.0, seed=7)
    first, second = _oracle_run(name, workload), _oracle_run(name, workload)
    assert all(r.completed for r in first.jobs)
    assert first.jobs == second.jobs
    assert (first.preemptions, first.migrations) == (second.preemptions, second.migrations)
    assert first.busy_gpu_s == second.busy_gpu_s
    assert [r.start for r in first.rounds] == [r.start for r in second.rounds]
    assert [(t, x, f) for t, x, f in first.timeline] == [(t, x, f) for t, x, f in second.timeline]
    # The oracle knows the truth: no estimator error in the loop.
    assert all(s.ape == pytest.approx(0.0, abs=1e-9) for s in first.estimator)


# ------------------------------------------------------------------------------ estimator error


def test_estimator_error_samples_are_finite_seen_and_unseen() -> None:
    workload = small_workload(jobs=12, rate=20.0, seed=3, scale=0.3)
    _, _, result = simulate("hops", workload)
    assert all(r.completed for r in result.jobs)
    samples = result.estimator
    assert len(samples) > 20
    assert all(math.isfinite(s.ape) and s.ape >= 0 for s in samples)
    assert all(math.isfinite(s.time_s) for s in samples)
    assert [s.time_s for s in samples] == sorted(s.time_s for s in samples)
    flags = Counter(s.seen for s in samples)
    assert flags[True] > 0 and flags[False] > 0, flags
    # A learnt estimator is mostly right, and better where it has measured.
    seen = [s.ape for s in samples if s.seen]
    assert sum(seen) / len(seen) < 0.5


# ------------------------------------------------------------------------------ fragment plans


def _two_short_jobs() -> list[WorkloadJob]:
    return [one_job("a", "ResNet18", seconds=50.0), one_job("b", "ResNet18", seconds=70.0)]


@pytest.mark.parametrize("name", ["hops", "fifo", "gavel"])
def test_fragment_plans_fill_gpus_freed_within_the_round(name: str) -> None:
    server = Server("only", "rtx3090", 1, host_model="A")
    sim, policy, result = simulate(
        name, _two_short_jobs(), servers=[server], profiling=False, restart_costs=False
    )
    round_s = policy.round_seconds
    assert all(r.completed for r in result.jobs)
    first, second = sorted(result.jobs, key=lambda r: r.first_start or 0.0)
    assert first.first_start == 0.0 and first.end_time is not None and second.first_start is not None
    assert first.end_time < round_s  # the GPU goes idle within the first round
    if policy.fragment_plans:
        assert name != "gavel"
        assert second.first_start == pytest.approx(first.end_time)
        assert any(k == "fragment" and t == pytest.approx(first.end_time) for k, t in sim.plans)
    else:
        assert name == "gavel"
        assert second.first_start == pytest.approx(round_s)  # waits for the next round boundary
        assert all(kind == "first" for kind, _ in sim.plans)
        assert all(t == pytest.approx(round(t / round_s) * round_s) for t in (c[1] for c in policy.calls))


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_hops_leaves_no_waiting_job_beside_free_gpus_it_fits(seed: int) -> None:
    # 30 jobs on 16 GPUs: a queue most of the run. After each round's planning, no job that waits (and
    # is not profiling) would fit by its smallest count in one server's free GPUs under Hops, but on
    # seed 4 (2 GPUs idle beside 1-GPU jobs behind the window), which `idle_backfill` fills; FIFO,
    # which waits for its head, leaves such GPUs idle (the measure sees it).
    workload = small_workload(jobs=30, rate=60, seed=seed)
    rounds = {}
    policies = {
        "hops": make_policy("hops", SchedulerSettings()),
        "backfill": make_policy("hops", SchedulerSettings(idle_backfill=True)),
        "fifo": make_policy("fifo", SchedulerSettings()),
    }
    for name, policy in policies.items():
        sim, _, result = simulate(policy, workload)
        assert sim.violations == [] and all(r.completed for r in result.jobs)
        assert sum(r.jobs_waiting > 0 for r in result.rounds) >= 10  # a queue for much of the run
        rounds[name] = result.rounds
    hops = placeable_idle_per_round(rounds["hops"])
    assert hops is not None and (hops > 0.0) is (seed == 4)
    assert placeable_idle_per_round(rounds["backfill"]) == 0.0
    fifo = placeable_idle_per_round(rounds["fifo"])
    assert fifo is not None and fifo > 0.0


def test_quiet_rounds_are_not_replanned() -> None:
    # One long job alone: once it runs, no one waits and nothing changes, so rounds skip planning;
    # its completion is still reached and recorded.
    sim, _, result = simulate("hops", [one_job(seconds=20_000.0, model="ResNet18")])
    firsts = [kind for kind, _ in sim.plans].count("first")
    assert result.jobs[0].completed
    assert len(sim.rounds) > 10
    assert firsts < len(sim.rounds) / 2, (firsts, len(sim.rounds))


# ------------------------------------------------------------------------------ unseen servers


def test_unseen_server_draws_uniformly_outside_the_excluded_set() -> None:
    sim, _, _ = simulate("fifo", [])
    ids = [s.id for s in sim.servers]
    for excluded in (set(), {ids[0]}, set(ids[:3])):  # rejection sampling and the explicit list
        counts = Counter(unseen_server(sim.servers, excluded, sim.rng).id for _ in range(4000))  # type: ignore[union-attr]
        assert set(counts) == set(ids) - excluded
        expected = 4000 / len(set(ids) - excluded)
        assert all(abs(n - expected) < 0.15 * expected for n in counts.values()), counts
    assert unseen_server(sim.servers, set(ids), sim.rng) is None


def test_error_over_time_bins_seen_and_unseen_samples() -> None:
    from hopsmgr.sim.outcome import EstimatorSample, error_over_time

    samples = [
        EstimatorSample(1000.0 + 600, 0.10, True),
        EstimatorSample(1000.0 + 1200, 0.30, True),
        EstimatorSample(1000.0 + 1800, 0.50, False),
        EstimatorSample(1000.0 + 3 * 3600 + 5, 0.02, True),
    ]
    result = SimResult("p", "", [], [], samples, [(1000.0, 0.0, 0)], 0, 0, 0.0, 1, 0.0)
    assert error_over_time(result) == [
        {"hour": 0.0, "seen": pytest.approx(0.2), "unseen": pytest.approx(0.5)},
        {"hour": 3.0, "seen": pytest.approx(0.02), "unseen": None},
    ]
    # Long runs: about `bins` bins of whole hours.
    assert [b["hour"] for b in error_over_time(result, bins=2)] == [0.0, 2.0]
    assert error_over_time(SimResult("p", "", [], [], [], [], 0, 0, 0.0, 1, 0.0)) == []


def test_tenants_of_a_trace_need_not_be_declared() -> None:
    """Philly's virtual clusters arrive as tenants the cluster file does not name: they run with the
    default quota beside the declared ones (the live master would refuse them at submission)."""
    workload = [dataclasses.replace(j, tenant=f"vc{k % 3}") for k, j in enumerate(small_workload(jobs=6))]
    sim = Simulation(
        WORLD,
        SERVERS,
        workload,
        make_policy("hops", SchedulerSettings()),
        SimOptions(profile_s=PROFILE_S, seed=1),
        time.perf_counter,
        tenants={"declared": TenantQuota("declared", guaranteed_gpus=4)},
    )
    result = sim.run()
    assert all(r.completed for r in result.jobs)
    assert {r.tenant for r in result.jobs} == {"vc0", "vc1", "vc2"}
    assert set(sim.machine.state.tenants) == {"declared", "vc0", "vc1", "vc2"}
