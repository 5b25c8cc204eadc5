"""Unit tests of hopsmgr.core.ilp: optimality against brute force, greedy, the fallback path, edge cases.

CBC is called through PuLP; instances stay tiny so the suite is fast.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core import ilp
from hopsmgr.core.assignment import Option, enumerate_best
from hopsmgr.core.ilp import SolveOptions, greedy, is_feasible, objective_of, solve

# These tests are about the LP/CBC path: the in-process branch and bound for small programs is off.
CbcOptions = functools.partial(SolveOptions, enumerate_below=0)

Instance = tuple[list[Option], list[float]]


@st.composite
def instances(draw: st.DrawFn, max_items: int = 5, max_options: int = 4, max_resources: int = 3) -> Instance:
    n_res = draw(st.integers(1, max_resources))
    capacity = [float(draw(st.integers(0, 6))) for _ in range(n_res)]
    n_items = draw(st.integers(2, max_items))
    options: list[Option] = []
    for item in range(n_items):
        for _ in range(draw(st.integers(1, max_options))):
            resources = draw(st.lists(st.integers(0, n_res - 1), min_size=1, max_size=n_res, unique=True))
            uses = tuple((r, float(draw(st.integers(1, 4)))) for r in sorted(resources))
            value = draw(
                st.one_of(
                    st.floats(0.1, 10.0, allow_nan=False, allow_infinity=False),
                    st.sampled_from([0.0, -1.0, 1.0, 2.0]),
                )
            )
            options.append(Option(item, value, uses))
    return options, capacity


def brute_force(options: Sequence[Option], capacity: Sequence[float]) -> float:
    """The optimum by enumerating every assignment (None = item left out)."""
    by_item: dict[int, list[int | None]] = {}
    for k, o in enumerate(options):
        by_item.setdefault(o.item, [None]).append(k)
    items = sorted(by_item)
    best = 0.0
    for combo in itertools.product(*(by_item[i] for i in items)):
        choice = {i: o for i, o in zip(items, combo, strict=True) if o is not None}
        if is_feasible(options, capacity, choice):
            best = max(best, objective_of(options, choice))
    return best


def check_solution(options: Sequence[Option], capacity: Sequence[float], sol: ilp.Solution) -> None:
    """What every answer must satisfy, whatever path produced it."""
    assert is_feasible(options, capacity, sol.choice)
    for item, o in sol.choice.items():
        assert options[o].item == item
    assert sol.objective == pytest.approx(objective_of(options, sol.choice), abs=1e-9)
    if sol.bound is not None:
        assert sol.objective <= sol.bound + 1e-6
    if sol.fallback is not None:
        assert sol.method == "greedy"
        assert not sol.proven
    if sol.method == "greedy" and not sol.proven:
        assert sol.fallback is not None


def solve_proven(options: Sequence[Option], capacity: Sequence[float], opts: SolveOptions) -> ilp.Solution:
    """`solve`, asked again (up to three times) while the answer is not proven.

    CBC run with a `threads` option used to stall now and then for 10 s and report a feasible, unproven
    answer even for three variables. test_tiny_mip_is_proven_without_stalling guards against that; the
    tests that need a proven answer ask again rather than fail for the same cause too.
    """
    sol = solve(options, capacity, opts)
    for _ in range(2):
        if sol.proven:
            break
        sol = solve(options, capacity, opts)
    return sol


def jumping_clock(step: float) -> Callable[[], float]:
    """A fake monotonic clock that advances `step` seconds at every reading."""
    now = [0.0]

    def read() -> float:
        now[0] += step
        return now[0]

    return read


# --- optimality -----------------------------------------------------------------------------------------

CBC_INCREMENT = 1e-5  # CBC's default cutoff increment (`cbc` then `increment??` prints it)


@settings(max_examples=60, deadline=None)
@given(instances())
def test_gap_zero_is_optimal(instance: Instance) -> None:
    options, capacity = instance
    sol = solve_proven(options, capacity, CbcOptions(gap=0.0))
    check_solution(options, capacity, sol)
    optimum = brute_force(options, capacity)
    # CBC's "optimal" is optimal up to its cutoff increment: it prunes a node that cannot beat the
    # incumbent by that much, so two plans 1e-5 apart may come out either way (a generated instance
    # did: 5.0 against 5.00001). Plans never differ meaningfully by that little.
    assert sol.objective == pytest.approx(optimum, abs=2 * CBC_INCREMENT)
    assert sol.proven
    assert sol.fallback is None
    if sol.bound is not None:
        assert sol.bound >= optimum - 1e-6


@settings(max_examples=25, deadline=None)
@given(instances(), st.sampled_from([0.05, 0.2]), st.booleans())
def test_positive_gap_is_within_the_gap(instance: Instance, gap: float, lp_first: bool) -> None:
    options, capacity = instance
    sol = solve_proven(options, capacity, CbcOptions(gap=gap, lp_first=lp_first))
    check_solution(options, capacity, sol)
    optimum = brute_force(options, capacity)
    assert sol.objective <= optimum + 1e-6
    assert sol.proven
    assert sol.objective >= optimum * (1 - gap) - 1e-6


def test_knapsack_needs_the_mip() -> None:
    # cap 4: A (3 GPUs, 3.0), B and C (2 GPUs, 1.9 each). LP bound 3.95 (A + B/2); integer optimum B + C.
    options = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]
    sol = solve_proven(options, [4.0], CbcOptions(gap=0.0))
    check_solution(options, [4.0], sol)
    assert sol.choice == {1: 1, 2: 2}
    assert sol.objective == pytest.approx(3.8)
    assert sol.proven
    assert sol.bound == pytest.approx(3.95)


def test_uncontended_program_needs_no_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each item's best option fits beside the others: that is the optimum, and CBC is never started.
    import hopsmgr.core.ilp as ilp_module

    def no_solver(*_: object, **__: object) -> int:
        raise AssertionError("CBC ran on an uncontended program")

    monkeypatch.setattr(ilp_module, "_run", no_solver)
    monkeypatch.setattr(ilp_module.cbc, "run", no_solver)
    options = [
        Option(0, 2.0, ((0, 2.0),)),
        Option(0, 3.0, ((1, 4.0),)),
        Option(1, 1.0, ((0, 4.0),)),
        Option(1, 1.5, ((0, 2.0),)),
    ]
    sol = solve(options, [4.0, 4.0], CbcOptions(gap=0.0))
    check_solution(options, [4.0, 4.0], sol)
    assert sol.method == "uncontended"
    assert sol.proven
    assert sol.choice == {0: 1, 1: 3}
    assert sol.objective == pytest.approx(brute_force(options, [4.0, 4.0]))


def test_contended_program_is_not_taken_for_uncontended() -> None:
    # Both items' best options want the same 4 GPUs: the shortcut must not fire.
    options = [Option(0, 3.0, ((0, 4.0),)), Option(0, 1.0, ((1, 4.0),)), Option(1, 2.5, ((0, 4.0),))]
    sol = solve(options, [4.0, 4.0], CbcOptions(gap=0.0))
    check_solution(options, [4.0, 4.0], sol)
    assert sol.method != "uncontended"
    assert sol.objective == pytest.approx(3.5)


def test_tiny_mip_is_proven_without_stalling() -> None:
    # A three-variable MIP solves in milliseconds. CBC must neither stall (the process waits far past the
    # time limit) nor come back unproven; 60 tries catch an intermittent stall with high probability.
    options = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]
    for attempt in range(60):
        start = time.perf_counter()
        sol = solve(options, [4.0], CbcOptions(gap=0.0, time_limit_s=1.0, lp_first=False))
        elapsed = time.perf_counter() - start
        assert elapsed < 3.0, f"attempt {attempt}: a 3-variable MIP took {elapsed:.1f} s (time limit 1 s)"
        assert sol.proven, f"attempt {attempt}: not proven ({sol.method})"
        assert sol.choice == {1: 1, 2: 2}


def test_one_option_per_item() -> None:
    # Item 0 has two options on different resources; taking both would be worth more but is not allowed.
    options = [Option(0, 5.0, ((0, 1.0),)), Option(0, 4.0, ((1, 1.0),)), Option(1, 1.0, ((1, 1.0),))]
    sol = solve(options, [1.0, 1.0], CbcOptions(gap=0.0))
    assert sol.choice == {0: 0, 1: 2}
    assert sol.objective == pytest.approx(6.0)


# --- greedy ---------------------------------------------------------------------------------------------


def test_greedy_follows_order_not_value() -> None:
    # One resource of 2; both items need all of it. The first in `order` wins, whatever its value.
    options = [Option(0, 10.0, ((0, 2.0),)), Option(1, 1.0, ((0, 2.0),))]
    assert greedy(options, [2.0], [1, 0]) == {1: 1}
    assert greedy(options, [2.0], [0, 1]) == {0: 0}


def test_greedy_takes_best_fitting_option_and_skips_non_positive() -> None:
    options = [
        Option(0, 9.0, ((0, 5.0),)),  # does not fit
        Option(0, 3.0, ((0, 2.0),)),
        Option(0, 4.0, ((0, 3.0),)),  # best that fits
        Option(1, 0.0, ((0, 1.0),)),  # worthless: never taken
        Option(2, -1.0, ((0, 1.0),)),
    ]
    assert greedy(options, [4.0], [0, 1, 2]) == {0: 2}


def test_greedy_preferred_and_start() -> None:
    options = [Option(0, 5.0, ((0, 2.0),)), Option(0, 1.0, ((0, 1.0),)), Option(1, 2.0, ((0, 2.0),))]
    # Preferred options are tried first even if worth less.
    assert greedy(options, [3.0], [0, 1], preferred={0: [1]}) == {0: 1, 1: 2}
    # A start choice is kept and its resources are taken before the order is walked.
    assert greedy(options, [3.0], [0, 1], start={1: 2}) == {1: 2, 0: 1}
    # A start choice that does not fit is dropped.
    assert greedy(options, [1.0], [0, 1], start={1: 2}) == {0: 1}


@settings(max_examples=150, deadline=None)
@given(instances(max_items=6), st.randoms(use_true_random=False))
def test_greedy_is_feasible_and_maximal(instance: Instance, rnd: object) -> None:
    options, capacity = instance
    order = sorted({o.item for o in options})
    rnd.shuffle(order)  # type: ignore[attr-defined]
    choice = greedy(options, capacity, order)
    assert is_feasible(options, capacity, choice)
    assert all(options[o].value > 0 for o in choice.values())
    free = list(capacity)
    for o in choice.values():
        for r, a in options[o].uses:
            free[r] -= a
    # Maximal: no item left out has a positive option that still fits.
    for k, left_out in enumerate(options):
        if left_out.item not in choice and left_out.value > 0:
            assert any(free[r] < a - 1e-9 for r, a in left_out.uses), (k, left_out, free)
    # The first item in order gets its best option among those that fit the empty cluster.
    head = order[0]
    fitting = [
        o for o in options if o.item == head and o.value > 0 and all(capacity[r] >= a for r, a in o.uses)
    ]
    if fitting:
        assert options[choice[head]].value == max(o.value for o in fitting)
    else:
        assert head not in choice


# --- the fallback path ----------------------------------------------------------------------------------


def test_no_time_left_falls_back_to_greedy() -> None:
    options = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]
    opts = CbcOptions(gap=0.0, time_limit_s=0.5, lp_first=False, timer=jumping_clock(1.0))
    sol = solve(options, [4.0], opts)
    check_solution(options, [4.0], sol)
    assert sol.method == "greedy"
    assert not sol.proven
    assert sol.fallback is not None and "greedy" in sol.fallback
    assert sol.choice == greedy(options, [4.0], [0, 1, 2])


def test_no_time_for_the_mip_after_the_lp() -> None:
    # The LP runs, its rounding (A) is not within the gap, and no time is left for the MIP: the answer is
    # feasible and honestly not proven.
    # The clock jumps 0.6 s per reading: the LP starts with about 1.4 s left, the MIP check comes too late.
    options = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]
    opts = CbcOptions(gap=0.0, time_limit_s=2.0, timer=jumping_clock(0.6))
    sol = solve(options, [4.0], opts)
    check_solution(options, [4.0], sol)
    assert not sol.proven
    assert sol.bound == pytest.approx(3.95)
    assert sol.gap is not None and sol.gap > 0
    assert sol.objective < 3.8


@settings(max_examples=30, deadline=None)
@given(instances(), st.booleans(), st.sampled_from([0.0, 0.1]), st.sampled_from([0.02, 1.0]))
def test_tiny_budget_is_feasible_and_consistent(
    instance: Instance, lp_first: bool, gap: float, step: float
) -> None:
    options, capacity = instance
    opts = CbcOptions(gap=gap, time_limit_s=0.05, lp_first=lp_first, timer=jumping_clock(step))
    sol = solve(options, capacity, opts)
    check_solution(options, capacity, sol)
    optimum = brute_force(options, capacity)
    assert sol.objective <= optimum + 1e-6
    if sol.proven:
        assert sol.objective >= optimum * (1 - gap) - 1e-6


# --- edge cases -----------------------------------------------------------------------------------------


def test_empty_options() -> None:
    sol = solve([], [4.0], CbcOptions())
    assert sol.choice == {}
    assert sol.objective == 0.0
    assert sol.proven
    assert sol.fallback is None
    assert greedy([], [4.0], []) == {}


def test_nothing_usable_is_proven_empty() -> None:
    options = [Option(0, 5.0, ((0, 9.0),)), Option(1, -2.0, ((0, 1.0),)), Option(2, 0.0, ((0, 1.0),))]
    sol = solve(options, [4.0], CbcOptions())
    assert sol.choice == {}
    assert sol.objective == 0.0
    assert sol.proven
    assert sol.fallback is None


def test_is_feasible_and_objective_of() -> None:
    options = [Option(0, 2.0, ((0, 2.0), (1, 1.0))), Option(1, 3.0, ((0, 2.0),))]
    assert objective_of(options, {0: 0, 1: 1}) == 5.0
    assert is_feasible(options, [4.0, 1.0], {0: 0, 1: 1})
    assert not is_feasible(options, [3.0, 1.0], {0: 0, 1: 1})
    assert not is_feasible(options, [4.0, 0.0], {0: 0})
    # An option filed under the wrong item is not a valid choice.
    assert not is_feasible(options, [4.0, 1.0], {1: 0})


def test_warm_start_is_validated() -> None:
    options = [Option(0, 1.0, ((0, 1.0),)), Option(1, 5.0, ((0, 1.0),))]
    opts = CbcOptions(gap=0.0, warm_start={0: 1, 7: 99, 1: 1})  # first two are nonsense
    sol = solve(options, [1.0], opts)
    check_solution(options, [1.0], sol)
    assert sol.choice == {1: 1}


# --- repeated resources in `uses` -------------------------------------------------------------------------


def test_is_feasible_merges_repeated_resources() -> None:
    options = [Option(0, 5.0, ((0, 2.0), (0, 2.0)))]
    assert not is_feasible(options, [3.0], {0: 0})
    assert is_feasible(options, [4.0], {0: 0})


def test_program_merges_repeated_resources() -> None:
    # X uses (0, 1) twice = 2 GPUs; with Y (1 GPU) that is 3 > 2. Were only the last pair kept (the PuLP
    # pitfall), the LP would take both (bound 3.5); merged, the LP bound is 2.5 and the optimum X alone.
    options = [Option(0, 2.0, ((0, 1.0), (0, 1.0))), Option(1, 1.5, ((0, 1.0),))]
    sol = solve(options, [2.0], CbcOptions(gap=0.0))
    assert sol.bound == pytest.approx(2.5)  # the LP saw both entries
    check_solution(options, [2.0], sol)
    assert sol.choice == {0: 0}


def test_greedy_merges_repeated_resources() -> None:
    options = [Option(0, 5.0, ((0, 2.0), (0, 2.0))), Option(1, 1.0, ((0, 1.0),))]
    choice = greedy(options, [3.0], [0, 1])
    assert is_feasible(options, [3.0], choice)
    assert choice == {1: 1}


@pytest.mark.parametrize("lp_first", [True, False])
def test_solve_merges_repeated_resources(lp_first: bool) -> None:
    # Option 0 needs 4 of the 3 GPUs in total: it can never be chosen.
    options = [Option(0, 5.0, ((0, 2.0), (0, 2.0))), Option(1, 1.0, ((0, 1.0),))]
    sol = solve(options, [3.0], CbcOptions(gap=0.0, lp_first=lp_first))
    assert is_feasible(options, [3.0], sol.choice)
    assert sol.choice == {1: 1}
    assert sol.objective == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(instances(max_items=4, max_options=3), st.data())
def test_split_uses_solve_like_merged_uses(instance: Instance, data: st.DataObject) -> None:
    # Splitting an amount into two entries for the same resource must not change the program.
    options, capacity = instance
    split = []
    for o in options:
        uses: list[tuple[int, float]] = []
        for r, a in o.uses:
            if a >= 2 and data.draw(st.booleans()):
                uses += [(r, 1.0), (r, a - 1.0)]
            else:
                uses.append((r, a))
        split.append(Option(o.item, o.value, tuple(uses)))
    merged = solve_proven(options, capacity, CbcOptions(gap=0.0))
    separate = solve_proven(split, capacity, CbcOptions(gap=0.0))
    assert is_feasible(options, capacity, separate.choice)
    assert separate.objective == pytest.approx(merged.objective, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(instances(max_items=6, max_options=4))
def test_the_branch_and_bound_finds_the_optimum(instance: Instance) -> None:
    options, capacity = instance
    sol = ilp.solve(options, capacity, SolveOptions(gap=0.0))
    check_solution(options, capacity, sol)
    assert sol.objective == pytest.approx(brute_force(options, capacity), abs=1e-6)
    assert sol.proven
    assert sol.method in ("empty", "uncontended", "enumerated")


def test_the_branch_and_bound_gives_way_to_cbc_past_its_node_limit() -> None:
    # The knapsack again: two nodes are not enough for the search, so the LP and the MIP solve it.
    options = [Option(0, 3.0, ((0, 3.0),)), Option(1, 1.9, ((0, 2.0),)), Option(2, 1.9, ((0, 2.0),))]
    assert enumerate_best(options, [4.0], range(3), node_limit=2) is None
    sol = ilp.solve(options, [4.0], SolveOptions(gap=0.0, enumerate_nodes=2))
    assert sol.method == "mip"
    assert sol.choice == {1: 1, 2: 2}
    enumerated = ilp.solve(options, [4.0], SolveOptions(gap=0.0))
    assert enumerated.method == "enumerated"
    assert enumerated.choice == {1: 1, 2: 2}
