"""Tests of hopsmgr.sim.engine's fragment plans and idle GPUs: plans made within a round for GPUs freed in it,
the GPUs left idle beside waiting jobs that would fit them, and rounds skipped when nothing changed.

The world, cluster and instrumentation are those of tests/sim/test_engine.py (tests/sim/_engine_helpers.py).
"""

from __future__ import annotations

import pytest

from hopsmgr.core.metrics import placeable_idle_per_round
from hopsmgr.core.model import Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.workload import WorkloadJob
from tests.sim._engine_helpers import one_job, simulate, small_workload

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
