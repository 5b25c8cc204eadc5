"""Tests of hopsmgr.sim.engine: the discrete-event simulator driven directly, with real policies.

The world is the "paper" one (no shared data needed) on a small 16-GPU cluster of four servers; the
Poisson workloads are scaled down so that every run takes a fraction of a second. A recording wrapper
around the policy sees every plan, and a `Simulation` subclass checks the placements after every
reconciled plan and keeps each job's state history (tests/sim/_engine_helpers.py). Here: every policy on
one workload, the restart delay, determinism, the estimator's error, unseen servers and undeclared
tenants; fragment plans and idle GPUs: tests/sim/test_engine_fragments.py.
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

from hopsmgr.core.lifecycle import TRANSITIONS, JobState
from hopsmgr.core.model import Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.fifo import FifoPolicy
from hopsmgr.policies.registry import POLICY_NAMES, make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.oracle import OracleEstimator
from hopsmgr.sim.outcome import SimResult
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions, job_key, unseen_server
from hopsmgr.sim.workload import WorkloadJob
from tests.sim._engine_helpers import (
    PROFILE_S,
    SERVERS,
    WORLD,
    CheckedSimulation,
    RecordingPolicy,
    one_job,
    simulate,
    small_workload,
)


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
