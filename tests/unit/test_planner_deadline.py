"""The planner's deadline: a CBC that stalls is stopped at the deadline and the plan says what it used.

The fake CBC is a shell script that sleeps far past the time limit; it is handed to the planner through
the `cbc_path` setting. Wall-clock bounds here are generous (they catch a planner that waits for the
stalled process, not a slow machine).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from hopsmgr import cbc
from hopsmgr.core import classes as class_model
from hopsmgr.core import ilp
from hopsmgr.core.assignment import Option
from hopsmgr.core.ilp import SolveOptions
from hopsmgr.core.planner import plan_fragments, plan_round
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from tests.helpers.fakes import stalling_cbc as fake_cbc

# These tests are about the LP/CBC path: the in-process branch and bound for small programs is off.
CbcOptions = functools.partial(SolveOptions, enumerate_below=0)

# A contended program: the LP bound (3.95) is not reached by rounding, so the MIP is needed.
KNAPSACK = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]


@pytest.fixture
def stalling_cbc(tmp_path: Path) -> str:
    return fake_cbc(tmp_path)


def test_stalled_cbc_is_killed_and_the_answer_is_the_greedy_fallback(stalling_cbc: str) -> None:
    start = time.perf_counter()
    sol = ilp.solve(
        KNAPSACK,
        [4.0],
        CbcOptions(gap=0.0, time_limit_s=0.5, timer=time.perf_counter, cbc_path=stalling_cbc),
    )
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0, f"waited {elapsed:.1f} s for a stalled CBC (limit 0.5 s)"
    assert sol.method == "greedy"
    assert not sol.proven
    assert sol.timed_out
    assert sol.fallback is not None and "deadline" in sol.fallback
    assert sol.choice == ilp.greedy(KNAPSACK, [4.0], [0, 1, 2])


def test_deadline_before_the_call_runs_no_solver(stalling_cbc: str) -> None:
    # The deadline (on the injected timer) has already passed: CBC is not even started.
    sol = ilp.solve(
        KNAPSACK, [4.0], CbcOptions(gap=0.0, timer=lambda: 100.0, deadline=99.0, cbc_path=stalling_cbc)
    )
    assert sol.method == "greedy"
    assert sol.fallback is not None
    assert not sol.proven


def test_missing_cbc_binary_falls_back(tmp_path: Path) -> None:
    sol = ilp.solve(KNAPSACK, [4.0], CbcOptions(gap=0.0, cbc_path=str(tmp_path / "no-such-cbc")))
    assert sol.method == "greedy"
    assert sol.fallback is not None
    assert not sol.proven


def test_the_real_cbc_is_proven_within_the_same_settings() -> None:
    # The control: the bundled binary solves the same program to optimality.
    sol = ilp.solve(KNAPSACK, [4.0], CbcOptions(gap=0.0, time_limit_s=5.0, timer=time.perf_counter))
    assert sol.proven
    assert sol.choice == {1: 1, 2: 2}
    assert not sol.timed_out


def test_cbc_run_reports_a_kill(stalling_cbc: str) -> None:
    result = cbc.run([(1.0, ((0, 1.0),))], [1.0], integer=True, gap=0.0, budget_s=0.3, path=stalling_cbc)
    assert result.status == "none"
    assert result.killed


@pytest.mark.parametrize("solver", ["exact", "classes"])
def test_plan_under_a_stalled_cbc_is_the_greedy_fallback_and_says_so(
    stalling_cbc: str, solver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The class LP runs only when the refinement would not cover every server anyway: force that.
    monkeypatch.setattr(class_model, "SMALL_PROGRAM", 0)
    inst = busy_instance(7, 96, 60)
    settings = SchedulerSettings(solver=solver, time_limit_s=1.0, cbc_path=stalling_cbc)  # type: ignore[arg-type]
    start = time.perf_counter()
    plan = plan_round(inst.snapshot, inst.estimator, settings, time.perf_counter)
    elapsed = time.perf_counter() - start
    assert elapsed < 15.0, f"the plan took {elapsed:.1f} s with a 1-s limit"
    assert plan.stats.fallback is not None, plan.stats
    assert "greedy" in plan.stats.fallback
    if solver == "classes":
        assert (
            "class LP" in plan.stats.fallback
        )  # the class LP's failure is reported, not only the refinement's
    assert not plan.stats.proven
    # Still a feasible plan that places jobs.
    used: dict[str, int] = {}
    for config in plan.assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    assert all(n <= inst.snapshot.capacity[sid] for sid, n in used.items())
    assert plan.assignments
    # The same instance with the real CBC is not a fallback.
    real = plan_round(inst.snapshot, inst.estimator, SchedulerSettings(solver=solver), time.perf_counter)  # type: ignore[arg-type]
    assert real.stats.fallback is None


def test_fragment_plan_under_a_stalled_cbc(stalling_cbc: str) -> None:
    inst = busy_instance(11, 64, 60)
    settings = SchedulerSettings(solver="exact", time_limit_s=0.8, cbc_path=stalling_cbc)
    plan = plan_fragments(inst.snapshot, inst.estimator, settings, time.perf_counter)
    assert plan.stats.proven or plan.stats.fallback is not None
    assert not (plan.stats.proven and plan.stats.fallback is not None)
