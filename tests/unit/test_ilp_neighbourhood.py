"""The neighbourhood MIP of hopsmgr.core.ilp: the LP's integral part away from its fractional rows is
kept, the rest is solved by CBC warm-started from the incumbent, within an absolute gap.

Instances stay tiny; the optimum is checked by brute force (tests/unit/test_ilp.py's enumerator).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr import cbc
from hopsmgr.core import ilp
from hopsmgr.core.assignment import Option
from hopsmgr.core.ilp import SolveOptions, is_feasible, objective_of
from tests.unit.test_ilp import Instance, brute_force, instances

# These tests are about the LP/CBC path: the in-process branch and bound for small programs is off.
CbcOptions = functools.partial(SolveOptions, enumerate_below=0)

# Row 0: item 0 alone, integral in the LP. Row 1: a knapsack (cap 4) where the LP takes item 1 (3 GPUs,
# 3.0) and half of item 2 (3.95); the integer optimum there is items 2 and 3 (3.8).
PROGRAM = [
    Option(0, 5.0, ((0, 4.0),)),
    Option(1, 3.0, ((1, 3.0),)),
    Option(2, 1.9, ((1, 2.0),)),
    Option(3, 1.9, ((1, 2.0),)),
]
CAPACITY = [4.0, 4.0]


def _lp(options: Sequence[Option], capacity: Sequence[float]) -> tuple[dict[int, float], dict[int, float]]:
    usable = list(range(len(options)))
    result = ilp._run(options, capacity, usable, True, CbcOptions(), 10.0)
    assert result.status == "optimal"
    return (
        {o: result.values[k] for k, o in enumerate(usable)},
        {o: result.reduced_costs[k] for k, o in enumerate(usable)},
    )


@functools.cache
def _program_lp() -> tuple[dict[int, float], dict[int, float]]:
    return _lp(PROGRAM, CAPACITY)


def _neighbourhood_of(order: list[int], opts: SolveOptions, end: float) -> dict[int, int] | None:
    """PROGRAM's neighbourhood from its LP, the rounding's {0: 0, 1: 1} as the incumbent."""
    lp_values, reduced = _program_lp()
    return ilp._neighbourhood(
        PROGRAM, CAPACITY, lp_values, reduced, 8.95, {0: 0, 1: 1}, order, opts, end, lambda: 0.0, [0.0]
    )


def test_integral_part_away_from_the_fraction_is_kept_and_the_rest_solved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lp_values, reduced = _lp(PROGRAM, CAPACITY)
    bound = sum(PROGRAM[o].value * v for o, v in lp_values.items())
    assert bound == pytest.approx(8.95)
    pools: list[list[int]] = []
    real_run = ilp._run

    def spy(options: Sequence[Option], capacity: Sequence[float], pool: Sequence[int], *a, **k):  # type: ignore[no-untyped-def]
        pools.append(list(pool))
        assert k.get("light") is True
        assert k.get("abs_gap") == pytest.approx(0.05 * bound)
        return real_run(options, capacity, pool, *a, **k)

    monkeypatch.setattr(ilp, "_run", spy)
    incumbent = {0: 0, 1: 1}  # what rounding gives: 8.0
    choice = ilp._neighbourhood(
        PROGRAM,
        CAPACITY,
        lp_values,
        reduced,
        bound,
        incumbent,
        [0, 1, 2, 3],
        CbcOptions(gap=0.05),
        end=10.0,
        timer=lambda: 0.0,
        spent=[0.0],
    )
    assert pools == [[1, 2, 3]]  # item 0 is fixed: its row has no fractional option
    assert choice == {0: 0, 2: 2, 3: 3}
    assert objective_of(PROGRAM, choice) == pytest.approx(8.8)


def test_solve_uses_the_neighbourhood_and_proves_within_the_gap() -> None:
    sol = ilp.solve(PROGRAM, CAPACITY, CbcOptions(gap=0.05, exact_below=0))
    assert sol.choice == {0: 0, 2: 2, 3: 3}
    assert sol.method == "lp-fix"
    assert sol.proven  # 8.8 >= 8.95 * 0.95
    assert sol.bound == pytest.approx(8.95)


def test_no_time_left_gives_the_greedy_completion_of_the_fixed_part() -> None:
    choice = _neighbourhood_of([3, 2, 1, 0], CbcOptions(), 0.0)
    assert choice is not None and is_feasible(PROGRAM, CAPACITY, choice)
    assert choice[0] == 0  # fixed
    assert choice == ilp.greedy(PROGRAM, CAPACITY, [3, 2, 1, 0], start={0: 0})


@settings(max_examples=40, deadline=None)
@given(instances(max_items=6), st.sampled_from([0.0, 0.02, 0.1]))
def test_answers_without_the_exact_override_are_feasible_and_honest(instance: Instance, gap: float) -> None:
    options, capacity = instance
    sol = ilp.solve(options, capacity, CbcOptions(gap=gap, exact_below=0))
    assert is_feasible(options, capacity, sol.choice)
    optimum = brute_force(options, capacity)
    assert sol.objective <= optimum + 1e-6
    if sol.proven:
        assert sol.objective >= optimum * (1 - gap) - 1e-6


def test_cbc_command_line_carries_the_absolute_gap_and_light_switches(tmp_path: Path) -> None:
    log = tmp_path / "args"
    script = tmp_path / "cbc"
    script.write_text(f'#!/bin/sh\necho "$@" > {log}\n')
    script.chmod(0o755)
    cbc.run(
        [(1.0, [(0, 1.0)])],
        [1.0],
        integer=True,
        gap=0.0,
        budget_s=5.0,
        path=str(script),
        abs_gap=2.5,
        light=True,
    )
    args = log.read_text().split()
    assert args[args.index("-allowableGap") + 1] == "2.5"
    assert args[args.index("-gomoryCuts") + 1] == "off"
    assert args[args.index("-probingCuts") + 1] == "off"
    assert args[args.index("-strongBranching") + 1] == "0"
    assert args[args.index("-heuristicsOnOff") + 1] == "off"
    cbc.run([(1.0, [(0, 1.0)])], [1.0], integer=True, gap=0.0, budget_s=5.0, path=str(script))
    plain = log.read_text().split()
    assert "-allowableGap" not in plain and "-gomoryCuts" not in plain


def test_no_full_mip_and_a_capped_neighbourhood(monkeypatch: pytest.MonkeyPatch) -> None:
    # gap 0: the neighbourhood's 8.8 is not proven against the bound 8.95, so only `full_mip` decides
    # whether a MIP over every option follows; `neighbourhood_s` caps the neighbourhood's budget.
    calls: list[tuple[bool, float, int]] = []
    real_run = ilp._run

    def spy(options, capacity, pool, relax, opts, budget_s, *a, **k):  # type: ignore[no-untyped-def]
        calls.append((relax, budget_s, len(pool)))
        return real_run(options, capacity, pool, relax, opts, budget_s, *a, **k)

    monkeypatch.setattr(ilp, "_run", spy)
    sol = ilp.solve(
        PROGRAM, CAPACITY, CbcOptions(gap=0.0, exact_below=0, full_mip=False, neighbourhood_s=0.7)
    )
    assert [relax for relax, _, _ in calls] == [True, False]
    assert calls[1][1] <= 0.7
    assert sol.choice == {0: 0, 2: 2, 3: 3}
    assert not sol.proven
    calls.clear()
    sol = ilp.solve(PROGRAM, CAPACITY, CbcOptions(gap=0.0, exact_below=0))
    assert [relax for relax, _, _ in calls] == [True, False, False]  # the full MIP proves 8.8 optimal
    assert sol.proven and sol.method == "mip"


def test_a_neighbourhood_over_its_size_limit_is_repaired_greedily_without_cbc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _program_lp()
    pools: list[int] = []
    real_run = ilp._run

    def spy(options, capacity, pool, *a, **k):  # type: ignore[no-untyped-def]
        pools.append(len(pool))
        return real_run(options, capacity, pool, *a, **k)

    monkeypatch.setattr(ilp, "_run", spy)
    order = [0, 1, 2, 3]
    choice = _neighbourhood_of(order, CbcOptions(gap=0.05, neighbourhood_max=2), 10.0)
    assert pools == []  # the pool (items 1-3: three options) is over the limit: no CBC start
    assert choice == ilp.greedy(PROGRAM, CAPACITY, order, start={0: 0})
    choice = _neighbourhood_of(order, CbcOptions(gap=0.05, neighbourhood_max=3), 10.0)
    assert pools == [3]  # at the limit: CBC solves it
    assert choice == {0: 0, 2: 2, 3: 3}


def test_a_poor_incumbent_from_a_stopped_search_loses_to_the_greedy_repair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CBC stopped with an incumbent that leaves the knapsack row half empty (item 3 alone: 1.9), while
    # the greedy repair of the fixed part in this order takes item 1 (3.0): the repair is kept.
    _program_lp()

    def stopped(options, capacity, pool, *a, **k):  # type: ignore[no-untyped-def]
        return cbc.CbcResult("feasible", [1.0 if o == 3 else 0.0 for o in pool], [], killed=True)

    monkeypatch.setattr(ilp, "_run", stopped)
    monkeypatch.setattr(ilp, "greedy", functools.partial(_greedy_no_completion, ilp.greedy))
    choice = _neighbourhood_of([0, 1, 2, 3], CbcOptions(gap=0.05), 10.0)
    assert choice == {0: 0, 1: 1}
    assert objective_of(PROGRAM, choice) == pytest.approx(8.0)


def _greedy_no_completion(real, options, capacity, order, preferred=None, start=None):  # type: ignore[no-untyped-def]
    """The greedy pass, except that it adds nothing to a start that already holds item 3 (so the
    stopped search's answer stays as CBC left it, 6.9, and must lose to the repair's 8.0)."""
    if start is not None and 3 in start:
        return dict(start)
    return real(options, capacity, order, preferred, start)
