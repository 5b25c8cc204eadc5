"""Gavel's LP when CBC stops at its time limit: PuLP then says `status` Optimal, and only `sol_status`
tells whether the answer is a proven optimum, a feasible incumbent, or nothing at all."""

from __future__ import annotations

from typing import Any

import pulp
import pytest

from hopsmgr.policies.gavel import max_min_allocation

RATES = {"a": {"k80": 1.0, "a100": 4.0}, "b": {"k80": 1.0, "a100": 1.0}}
SIZES = {"a": 1, "b": 1}
GPUS = {"k80": 1, "a100": 1}


def stopped_on_time(monkeypatch: pytest.MonkeyPatch, sol_status: int) -> None:
    """CBC runs for real, then its answer reads as a run stopped on time (what PuLP reports then)."""
    solve = pulp.LpProblem.solve

    def stopped(self: pulp.LpProblem, *args: Any, **kwargs: Any) -> int:
        solve(self, *args, **kwargs)
        self.status, self.sol_status = pulp.LpStatusOptimal, sol_status
        if sol_status == pulp.LpSolutionNoSolutionFound:
            for var in self.variables():
                var.varValue = None
        return int(self.status)

    monkeypatch.setattr(pulp.LpProblem, "solve", stopped)


def test_a_solved_lp_is_proven() -> None:
    alloc = max_min_allocation(SIZES, {}, RATES, GPUS)
    assert alloc.proven and alloc.method == "lp-2stage" and alloc.fallback is None


def test_stopped_on_time_without_a_solution_falls_back_to_the_equal_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stopped_on_time(monkeypatch, pulp.LpSolutionNoSolutionFound)
    alloc = max_min_allocation(SIZES, {}, RATES, GPUS)
    assert alloc.method == "equal-split" and not alloc.proven
    assert all(sum(per_type.values()) > 0 for per_type in alloc.x.values())  # every job gets a share


def test_stopped_on_time_with_an_incumbent_uses_it_but_not_as_proven(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped_on_time(monkeypatch, pulp.LpSolutionIntegerFeasible)
    alloc = max_min_allocation(SIZES, {}, RATES, GPUS)
    assert alloc.method.startswith("lp") and not alloc.proven
    assert alloc.fallback is not None and "time limit" in alloc.fallback
    assert alloc.x["a"]["a100"] == pytest.approx(1.0, abs=1e-4)  # the incumbent's shares are kept
