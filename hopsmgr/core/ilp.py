"""The prior-weighted assignment program, solved with CBC through PuLP.

The planner states a round as items (jobs) with options (configurations), each option carrying its
objective value ((prio + bias)^lambda * G, restart penalty applied) and the resources it uses (GPUs on
a server or a server class, packing slots, tenant caps). This module only solves that program:

    maximise  sum value[o] * x[o]
    s.t.      sum_{o of item i} x[o] <= 1                 for every item
              sum_o uses[o][r] * x[o] <= capacity[r]      for every resource r
              x binary

Strategy, cheapest first: if every item's most valuable option fits beside the others, that is the
optimum and no solver runs ("uncontended": most rounds of a lightly loaded cluster, and many fragment
plans). Otherwise the LP relaxation (its value is an upper bound), rounded to an integer plan
and improved greedily; if the rounded plan is within the relative gap of the bound it is proven good
enough and returned. Otherwise CBC runs the MIP, warm-started from the rounded plan, under a time limit
that respects the caller's deadline. An answer is "proven" only when CBC says so in `sol_status` or the
rounding meets the gap; when no solver answer is usable the plan falls back to greedy priority order and
says so. The caller injects `timer` (a monotonic clock): the core reads no clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pulp
from pulp.apis.coin_api import pulp_cbc_path


@dataclass(frozen=True, slots=True)
class Option:
    item: int
    value: float
    uses: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        # One entry per resource: repeated entries are added up (every check below relies on it).
        if len({r for r, _ in self.uses}) != len(self.uses):
            merged: dict[int, float] = {}
            for r, amount in self.uses:
                merged[r] = merged.get(r, 0.0) + amount
            object.__setattr__(self, "uses", tuple(merged.items()))


@dataclass(frozen=True, slots=True)
class SolveOptions:
    gap: float = 0.01
    time_limit_s: float = 5.0
    mip: bool = True
    lp_first: bool = True
    warm_start: dict[int, int] = field(default_factory=dict)
    priority_order: tuple[int, ...] = ()
    timer: Callable[[], float] | None = None
    exact_below: int = 3000  # programs this small are solved to optimality whatever `gap` says


@dataclass(frozen=True, slots=True)
class Solution:
    choice: dict[int, int]
    objective: float
    bound: float | None
    proven: bool
    method: str
    fallback: str | None
    variables: int
    constraints: int
    build_s: float
    solve_s: float
    support: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        if self.bound is None or self.bound <= 0:
            return None
        return max(0.0, (self.bound - self.objective) / self.bound)


def objective_of(options: Sequence[Option], choice: dict[int, int]) -> float:
    return sum(options[o].value for o in choice.values())


def is_feasible(options: Sequence[Option], capacity: Sequence[float], choice: dict[int, int]) -> bool:
    used = [0.0] * len(capacity)
    for item, o in choice.items():
        if options[o].item != item:
            return False
        for r, amount in options[o].uses:
            used[r] += amount
    return all(used[r] <= capacity[r] + 1e-9 for r in range(len(capacity)))


def greedy(
    options: Sequence[Option],
    capacity: Sequence[float],
    order: Sequence[int],
    preferred: dict[int, Sequence[int]] | None = None,
    start: dict[int, int] | None = None,
) -> dict[int, int]:
    """Take items in `order`; give each its best feasible option (or its `preferred` ones first)."""
    by_item = _options_by_item(options)
    free = list(capacity)
    choice: dict[int, int] = {}
    for item, o in (start or {}).items():
        if _fits(options[o], free):
            _take(options[o], free)
            choice[item] = o
    for item in order:
        if item in choice:
            continue
        candidates = list((preferred or {}).get(item, ()))
        candidates += sorted(by_item.get(item, ()), key=lambda o: -options[o].value)
        for o in candidates:
            if options[o].value > 0 and _fits(options[o], free):
                _take(options[o], free)
                choice[item] = o
                break
    return choice


def solve(options: Sequence[Option], capacity: Sequence[float], opts: SolveOptions) -> Solution:
    """Solve the program; see the module docstring for the strategy."""
    timer = opts.timer or (lambda: 0.0)
    t0 = timer()
    items = sorted({o.item for o in options})
    order = list(opts.priority_order) or items
    if not options:
        return Solution({}, 0.0, 0.0, True, "empty", None, 0, 0, 0.0, 0.0)

    usable = [i for i, o in enumerate(options) if o.value > 0 and _fits(o, list(capacity))]
    uncontended = _best_per_item(options, capacity, usable)
    if uncontended is not None:
        # Every item's most valuable option fits alongside the others: no plan can do better.
        return Solution(
            choice=uncontended,
            objective=objective_of(options, uncontended),
            bound=objective_of(options, uncontended),
            proven=True,
            method="uncontended",
            fallback=None,
            variables=len(usable),
            constraints=len(capacity) + len(items),
            build_s=0.0,
            solve_s=timer() - t0,
            support={item: (o,) for item, o in uncontended.items()},
        )
    if len(usable) <= opts.exact_below:
        opts = replace(opts, gap=0.0)
    build_s = 0.0
    bound: float | None = None
    best = greedy(options, capacity, order, start=_valid_start(options, opts.warm_start))
    method = "greedy"
    proven = False
    fallback: str | None = None
    support: dict[int, tuple[int, ...]] = {}

    mip_pool = usable
    if opts.lp_first and usable:
        tb = timer()
        problem, xs = _build(options, capacity, usable, relax=True)
        build_s += timer() - tb
        status = _run(problem, opts, relax=True, time_limit=opts.time_limit_s)
        if status == pulp.LpSolutionOptimal:
            lp_values = {usable[k]: (xs[k].value() or 0.0) for k in range(len(usable))}
            reduced_cost = {usable[k]: float(xs[k].dj or 0.0) for k in range(len(usable))}
            bound = sum(options[o].value * v for o, v in lp_values.items())
            for o, v in sorted(lp_values.items(), key=lambda kv: -kv[1]):
                if v > 1e-6:
                    support[options[o].item] = (*support.get(options[o].item, ()), o)
            rounded = _round(options, capacity, lp_values, order)
            if objective_of(options, rounded) >= objective_of(options, best):
                best, method = rounded, "lp-round"
            proven = bound <= 0 or objective_of(options, best) >= bound * (1 - opts.gap) - 1e-9
            if opts.mip and not proven:
                repaired = _fix_and_resolve(options, capacity, lp_values, order, opts, t0, timer)
                if repaired is not None and objective_of(options, repaired) > objective_of(options, best):
                    best, method = repaired, "lp-fix"
            incumbent = objective_of(options, best)
            proven = bound <= 0 or incumbent >= bound * (1 - opts.gap) - 1e-9
            # Reduced-cost fixing: an option at 0 in the LP whose reduced cost would take the bound below
            # the incumbent cannot be part of any better plan, so the MIP needs only the others.
            mip_pool = [
                o for o in usable if lp_values[o] > 1e-6 or bound + reduced_cost[o] >= incumbent - 1e-9
            ]

    remaining = opts.time_limit_s - (timer() - t0)
    if opts.mip and mip_pool and not proven and remaining > 0.05:
        tb = timer()
        problem, xs = _build(options, capacity, mip_pool, relax=False)
        for k, o in enumerate(mip_pool):
            xs[k].setInitialValue(1.0 if best.get(options[o].item) == o else 0.0)
        build_s += timer() - tb
        status = _run(problem, opts, relax=False, time_limit=max(0.1, opts.time_limit_s - (timer() - t0)))
        if status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            mip_choice = {options[o].item: o for k, o in enumerate(mip_pool) if (xs[k].value() or 0.0) > 0.5}
            if (
                is_feasible(options, capacity, mip_choice)
                and objective_of(options, mip_choice) >= objective_of(options, best) - 1e-9
            ):
                best, method = mip_choice, "mip"
            # The pool lost only options that cannot beat the incumbent: optimal on it is optimal overall.
            proven = status == pulp.LpSolutionOptimal
        elif method == "greedy":
            fallback = "solver returned no feasible plan in time; greedy in priority order"
    elif not usable:
        proven = True
    if method == "greedy" and fallback is None and not proven:
        fallback = "no solver answer within the time limit; greedy in priority order"
    total = timer() - t0
    return Solution(
        choice=best,
        objective=objective_of(options, best),
        bound=bound,
        proven=proven,
        method=method,
        fallback=fallback,
        variables=len(usable),
        constraints=len(capacity) + len(items),
        build_s=build_s,
        solve_s=max(0.0, total - build_s),
        support=support,
    )


def _best_per_item(
    options: Sequence[Option], capacity: Sequence[float], usable: Sequence[int]
) -> dict[int, int] | None:
    """Each item's most valuable usable option, if all of them fit together (else None)."""
    best: dict[int, int] = {}
    for o in usable:
        item = options[o].item
        if item not in best or options[o].value > options[best[item]].value:
            best[item] = o
    used = [0.0] * len(capacity)
    for o in best.values():
        for r, amount in options[o].uses:
            used[r] += amount
    if any(used[r] > capacity[r] + 1e-9 for r in range(len(capacity))):
        return None
    return best


def _options_by_item(options: Sequence[Option]) -> dict[int, list[int]]:
    by_item: dict[int, list[int]] = {}
    for idx, o in enumerate(options):
        by_item.setdefault(o.item, []).append(idx)
    return by_item


def _fits(option: Option, free: list[float]) -> bool:
    return all(free[r] >= amount - 1e-9 for r, amount in option.uses)


def _take(option: Option, free: list[float]) -> None:
    for r, amount in option.uses:
        free[r] -= amount


def _valid_start(options: Sequence[Option], start: dict[int, int]) -> dict[int, int]:
    return {i: o for i, o in start.items() if 0 <= o < len(options) and options[o].item == i}


def _round(
    options: Sequence[Option], capacity: Sequence[float], lp_values: dict[int, float], order: Sequence[int]
) -> dict[int, int]:
    """Round an LP solution: items by their largest fractional value, then greedy fill in `order`."""
    preferred: dict[int, list[int]] = {}
    strength: dict[int, float] = {}
    for o, v in lp_values.items():
        if v > 1e-6:
            item = options[o].item
            preferred.setdefault(item, []).append(o)
            strength[item] = max(strength.get(item, 0.0), v)
    for opts in preferred.values():
        opts.sort(key=lambda o: (-lp_values[o], -options[o].value))
    rank = {item: k for k, item in enumerate(order)}
    lp_order = sorted(preferred, key=lambda i: (-strength[i], rank.get(i, math.inf)))
    first = greedy(options, capacity, lp_order, preferred={i: preferred[i] for i in preferred})
    # The greedy pass above may fall back to non-LP options; fill what remains in priority order.
    return greedy(options, capacity, order, start=first)


def _fix_and_resolve(
    options: Sequence[Option],
    capacity: Sequence[float],
    lp_values: dict[int, float],
    order: Sequence[int],
    opts: SolveOptions,
    t0: float,
    timer: Callable[[], float],
) -> dict[int, int] | None:
    """Keep the LP's integral choices, then solve the small MIP of the remaining items exactly.

    The LP relaxation of these programs is tight and mostly integral: at most one item per capacity
    row is fractional, so the residual MIP is small and CBC solves it quickly.
    """
    fixed = {options[o].item: o for o, v in lp_values.items() if v > 1 - 1e-6}
    if not is_feasible(options, capacity, fixed):
        return None
    free = list(capacity)
    for o in fixed.values():
        _take(options[o], free)
    residual = [k for k, o in enumerate(options) if o.item not in fixed and o.value > 0 and _fits(o, free)]
    if not residual:
        return fixed
    remaining = opts.time_limit_s - (timer() - t0)
    if remaining <= 0.05:
        return greedy(options, capacity, order, start=fixed)
    problem, xs = _build(options, free, residual, relax=False)
    # The residual program is small: solve it tighter than the caller's gap.
    status = _run(problem, replace(opts, gap=opts.gap / 10), relax=False, time_limit=remaining)
    choice = dict(fixed)
    if status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        for k, o in enumerate(residual):
            if (xs[k].value() or 0.0) > 0.5:
                choice[options[o].item] = o
    if not is_feasible(options, capacity, choice):
        return None
    return greedy(options, capacity, order, start=choice)


def _build(
    options: Sequence[Option], capacity: Sequence[float], usable: Sequence[int], relax: bool
) -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    problem = pulp.LpProblem("hops", pulp.LpMaximize)
    cat = pulp.LpContinuous if relax else pulp.LpBinary
    xs = [problem.add_variable(f"x{k}", 0, 1, cat) for k in range(len(usable))]
    problem.setObjective(pulp.LpAffineExpression([(xs[k], options[o].value) for k, o in enumerate(usable)]))
    per_item: dict[int, list[pulp.LpVariable]] = {}
    per_resource: dict[int, dict[int, float]] = {}
    for k, o in enumerate(usable):
        per_item.setdefault(options[o].item, []).append(xs[k])
        for r, amount in options[o].uses:
            column = per_resource.setdefault(r, {})
            column[k] = column.get(k, 0.0) + amount  # merge repeats: PuLP keeps only the last pair
    for item, vars_ in per_item.items():
        if len(vars_) > 1:
            problem.addConstraint(
                pulp.LpConstraint(
                    pulp.LpAffineExpression([(v, 1.0) for v in vars_]), pulp.LpConstraintLE, f"one{item}", 1.0
                )
            )
    for r, column in per_resource.items():
        problem.addConstraint(
            pulp.LpConstraint(
                pulp.LpAffineExpression([(xs[k], a) for k, a in column.items()]),
                pulp.LpConstraintLE,
                f"cap{r}",
                float(capacity[r]),
            )
        )
    return problem, xs


def _run(problem: pulp.LpProblem, opts: SolveOptions, relax: bool, time_limit: float) -> int:
    # No `threads` option: CBC's threaded search (even with one thread) was seen to idle until the time
    # limit on tiny programs.
    solver = pulp.COIN_CMD(
        path=pulp_cbc_path,
        msg=False,
        mip=not relax,
        timeLimit=max(1, math.ceil(time_limit)),
        gapRel=opts.gap,
        warmStart=not relax,
        options=[] if relax else ["preprocess off"],
    )
    try:
        problem.solve(solver)
    except pulp.PulpSolverError:
        return pulp.LpSolutionNoSolutionFound
    return int(problem.sol_status)
