"""The prior-weighted assignment program, solved with CBC (the binary PuLP bundles).

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
enough and returned. Otherwise CBC runs the MIP, warm-started from the rounded plan. No CBC run goes
past the deadline (`SolveOptions.deadline`, and `time_limit_s` from the call): hot programs are written
as MPS straight from the options and CBC is stopped from outside at the deadline (hopsmgr.cbc); the
best incumbent so far is kept. An answer is "proven" only when CBC says optimal or the rounding meets
the gap; when no solver answer is usable the plan falls back to greedy priority order and says so. The
caller injects `timer` (a monotonic clock): the core reads no clock of its own. The `Option` type, the
uncontended test and the exact search of small programs live in hopsmgr.core.assignment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pulp.apis.coin_api import pulp_cbc_path

from hopsmgr import cbc
from hopsmgr.core.assignment import Option, best_per_item, enumerate_best, fits, take


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
    deadline: float | None = None  # on `timer`'s scale: no solver runs past it (nor past time_limit_s)
    cbc_path: str | None = None  # the CBC binary (default: the one PuLP bundles)
    # Rows from this index on (tenant caps) are shared by many items and do not make a neighbourhood
    # (`_neighbourhood`); None: every row is local (a server's GPUs).
    local_rows: int | None = None
    # At most this long for the neighbourhood MIP (None: half the time left, or all without full_mip).
    neighbourhood_s: float | None = None
    # A neighbourhood with more options than this is repaired greedily without CBC: at 4,096 GPUs
    # (9,700-10,100 options) CBC's light search found no plan within its 0.5-s cap, and given 4 s a
    # plan worse than the greedy repair (docs/benchmarks.md); at 512-1,024 GPUs (1,100-3,100) it
    # finished in 0.04-0.19 s.
    neighbourhood_max: int = 6_000
    full_mip: bool = True  # after the neighbourhood, a MIP over every option if still not within the gap
    # Programs with at most this many usable options are first solved by a branch and bound in this
    # process, within `enumerate_nodes` search nodes; one that needs more goes on to the LP and CBC.
    enumerate_below: int = 48
    enumerate_nodes: int = 20_000


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
    timed_out: bool = False  # a CBC run was stopped at the deadline

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
        if fits(options[o], free):
            take(options[o], free)
            choice[item] = o
    for item in order:
        if item in choice:
            continue
        candidates = list((preferred or {}).get(item, ()))
        candidates += sorted(by_item.get(item, ()), key=lambda o: -options[o].value)
        for o in candidates:
            if options[o].value > 0 and fits(options[o], free):
                take(options[o], free)
                choice[item] = o
                break
    return choice


def solve(options: Sequence[Option], capacity: Sequence[float], opts: SolveOptions) -> Solution:
    """Solve the program; see the module docstring for the strategy."""
    timer = opts.timer or (lambda: 0.0)
    t0 = timer()
    end = t0 + opts.time_limit_s if opts.deadline is None else min(opts.deadline, t0 + opts.time_limit_s)
    items = sorted({o.item for o in options})
    order = list(opts.priority_order) or items
    if not options:
        return Solution({}, 0.0, 0.0, True, "empty", None, 0, 0, 0.0, 0.0)

    room = list(capacity)
    usable = [i for i, o in enumerate(options) if o.value > 0 and fits(o, room)]

    def optimal(choice: dict[int, int], method: str) -> Solution:
        value = objective_of(options, choice)
        return Solution(
            choice=choice,
            objective=value,
            bound=value,
            proven=True,
            method=method,
            fallback=None,
            variables=len(usable),
            constraints=len(capacity) + len(items),
            build_s=0.0,
            solve_s=timer() - t0,
            support={item: (o,) for item, o in choice.items()},
        )

    uncontended = best_per_item(options, capacity, usable)
    if uncontended is not None:
        # Every item's most valuable option fits alongside the others: no plan can do better.
        return optimal(uncontended, "uncontended")
    if len(usable) <= opts.enumerate_below:
        found = enumerate_best(options, capacity, usable, opts.enumerate_nodes)
        if found is not None:
            return optimal(found, "enumerated")
    if len(usable) <= opts.exact_below:
        opts = replace(opts, gap=0.0)
    bound: float | None = None
    best = greedy(options, capacity, order, start=_valid_start(options, opts.warm_start))
    method = "greedy"
    proven = False
    fallback: str | None = None
    support: dict[int, tuple[int, ...]] = {}
    timed_out = False
    spent = [0.0]  # time writing programs (build_s)

    mip_pool = usable
    if opts.lp_first and usable:
        lp = _run(options, capacity, usable, True, opts, end - timer(), spent=spent)
        timed_out |= lp.killed
        if lp.status == "optimal":
            lp_values = {o: lp.values[k] for k, o in enumerate(usable)}
            reduced_cost = {o: lp.reduced_costs[k] for k, o in enumerate(usable)}
            bound = sum(options[o].value * v for o, v in lp_values.items())
            for o, v in sorted(lp_values.items(), key=lambda kv: -kv[1]):
                if v > 1e-6:
                    support[options[o].item] = (*support.get(options[o].item, ()), o)
            rounded = _round(options, capacity, lp_values, order)
            if objective_of(options, rounded) >= objective_of(options, best):
                best, method = rounded, "lp-round"
            else:
                method = "greedy+lp"  # the greedy plan beat the rounding: a solver answer, not a fallback
            proven = bound <= 0 or objective_of(options, best) >= bound * (1 - opts.gap) - 1e-9
            # A program small enough to be solved exactly goes straight to the MIP over every option:
            # the neighbourhood would be one CBC start more (~10 ms each, 370 of them in a 500-job
            # simulation) for a warm start such small MIPs do not need.
            small = opts.full_mip and len(usable) <= opts.exact_below
            if opts.mip and not proven and not small:
                repaired = _neighbourhood(
                    options, capacity, lp_values, reduced_cost, bound, best, order, opts, end, timer, spent
                )
                if repaired is not None and objective_of(options, repaired) > objective_of(options, best):
                    best, method = repaired, "lp-fix"
            incumbent = objective_of(options, best)
            proven = bound <= 0 or incumbent >= bound * (1 - opts.gap) - 1e-9
            # Reduced-cost fixing: an option at 0 in the LP whose reduced cost would take the bound below
            # the incumbent cannot be part of any better plan, so the MIP needs only the others.
            mip_pool = [
                o for o in usable if lp_values[o] > 1e-6 or bound + reduced_cost[o] >= incumbent - 1e-9
            ]

    remaining = end - timer()
    if opts.mip and opts.full_mip and mip_pool and not proven and remaining > 0.05:
        warm = [k for k, o in enumerate(mip_pool) if best.get(options[o].item) == o]
        mip = _run(options, capacity, mip_pool, False, opts, remaining, warm, spent)
        timed_out |= mip.killed
        if mip.status in ("optimal", "feasible"):
            mip_choice = {options[o].item: o for k, o in enumerate(mip_pool) if mip.values[k] > 0.5}
            if (
                is_feasible(options, capacity, mip_choice)
                and objective_of(options, mip_choice) >= objective_of(options, best) - 1e-9
            ):
                best, method = mip_choice, "mip"
            # The pool lost only options that cannot beat the incumbent: optimal on it is optimal overall
            # (and the plan kept is at least as good as CBC's).
            proven = mip.status == "optimal"
        elif method == "greedy":
            fallback = "solver returned no feasible plan in time; greedy in priority order"
    elif not usable:
        proven = True
    if method == "greedy" and fallback is None and not proven:
        fallback = "no solver answer within the time limit; greedy in priority order"
    if fallback is not None and timed_out:
        fallback = f"{fallback} (CBC stopped at the deadline)"
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
        build_s=spent[0],
        solve_s=max(0.0, total - spent[0]),
        support=support,
        timed_out=timed_out,
    )


def _options_by_item(options: Sequence[Option]) -> dict[int, list[int]]:
    by_item: dict[int, list[int]] = {}
    for idx, o in enumerate(options):
        by_item.setdefault(o.item, []).append(idx)
    return by_item


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


def _neighbourhood(
    options: Sequence[Option],
    capacity: Sequence[float],
    lp_values: dict[int, float],
    reduced_cost: dict[int, float],
    bound: float,
    incumbent: dict[int, int],
    order: Sequence[int],
    opts: SolveOptions,
    end: float,
    timer: Callable[[], float],
    spent: list[float],
) -> dict[int, int] | None:
    """Keep the LP's integral choices away from its fractional ones; solve the MIP of the rest.

    A basic LP solution has no more fractional options than rows, so it is integral on most rows.
    The neighbourhood is the local rows (`SolveOptions.local_rows`: servers, not tenant caps, which
    would reach everything) a fractional option uses; items whose LP choice is integral and uses none
    of those rows keep it. Every other item may take any option that fits what they leave, except options
    that reduced-cost fixing rules out against `incumbent`. The MIP is warm-started from `incumbent`
    and stops within `opts.gap` of the whole program's LP `bound` (an absolute gap: the neighbourhood
    is a small part of the objective, and a relative gap on it would ask for far more).
    """
    usable = list(lp_values)
    local = len(capacity) if opts.local_rows is None else opts.local_rows
    near = {r for o, v in lp_values.items() if 1e-6 < v < 1 - 1e-6 for r, _ in options[o].uses if r < local}
    fixed = {
        options[o].item: o
        for o, v in lp_values.items()
        if v > 1 - 1e-6 and not any(r in near for r, _ in options[o].uses)
    }
    if not is_feasible(options, capacity, fixed):
        return None
    free = list(capacity)
    for o in fixed.values():
        take(options[o], free)
    floor = objective_of(options, incumbent)
    pool = [
        o
        for o in usable
        if options[o].item not in fixed
        and fits(options[o], free)
        and (lp_values[o] > 1e-6 or bound + reduced_cost[o] >= floor - 1e-9)
    ]
    # The repair every CBC answer must beat: the fixed choices, the rest greedily in priority order.
    repair = greedy(options, capacity, order, start=fixed)
    if not pool or len(pool) > opts.neighbourhood_max:
        return repair
    remaining = end - timer()
    if opts.neighbourhood_s is not None:
        remaining = min(remaining, opts.neighbourhood_s)
    elif opts.full_mip:
        # Half of what is left: the MIP over every option follows (its own heuristics and strong
        # branching find plans this light search may not within a long limit).
        remaining /= 2
    if remaining <= 0.05:
        return repair
    # The incumbent's choices for the free items, where they fit beside the fixed ones.
    start = [k for k, o in enumerate(pool) if incumbent.get(options[o].item) == o]
    result = _run(
        options,
        free,
        pool,
        False,
        replace(opts, gap=0.0),
        remaining,
        start,
        spent,
        abs_gap=max(opts.gap * bound, 1e-9),
        # Light search while a gap is allowed; asked for the optimum, CBC keeps its heuristics and
        # strong branching (without them a gap-0 neighbourhood of 12,000 options found nothing in 30 s).
        light=opts.gap > 0,
    )
    choice = dict(fixed)
    if result.status in ("optimal", "feasible"):
        for k, o in enumerate(pool):
            if result.values[k] > 0.5:
                choice[options[o].item] = o
    if not is_feasible(options, capacity, choice):
        return repair
    # A stopped search may hold a poor incumbent (its warm start is not always taken): keep the better.
    found = greedy(options, capacity, order, start=choice)
    return found if objective_of(options, found) > objective_of(options, repair) else repair


def _run(
    options: Sequence[Option],
    capacity: Sequence[float],
    pool: Sequence[int],
    relax: bool,
    opts: SolveOptions,
    budget_s: float,
    warm: Sequence[int] = (),
    spent: list[float] | None = None,
    abs_gap: float | None = None,
    light: bool = False,
) -> cbc.CbcResult:
    """The program restricted to the options in `pool` (column k = options[pool[k]]), solved by CBC."""
    per_item: dict[int, int] = {}
    for o in pool:
        per_item[options[o].item] = per_item.get(options[o].item, 0) + 1
    item_row: dict[int, int] = {}
    for item, n in per_item.items():
        if n > 1:
            item_row[item] = len(capacity) + len(item_row)
    rhs = [float(c) for c in capacity] + [1.0] * len(item_row)
    columns: list[cbc.Column] = []
    for o in pool:
        option = options[o]
        entries = list(option.uses)  # already one entry per resource (Option merges repeats)
        row = item_row.get(option.item)
        if row is not None:
            entries.append((row, 1.0))
        columns.append((option.value, entries))
    result = cbc.run(
        columns,
        rhs,
        integer=not relax,
        gap=opts.gap,
        budget_s=budget_s,
        warm_start=warm,
        path=opts.cbc_path or str(pulp_cbc_path),
        timer=opts.timer,
        abs_gap=abs_gap,
        light=light,
    )
    if spent is not None:
        spent[0] += result.write_s
    return result
