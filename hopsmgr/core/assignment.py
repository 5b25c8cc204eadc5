"""The assignment program's option and the parts of its solving that need no solver binary.

An `Option` is one way to serve an item (a job's configuration): its objective value and the resources
it uses. Beside it live the capacity checks every solving step shares (`fits`, `take`), the test that
each item's best option fits beside the others' (`best_per_item`: then that choice is optimal), and the
exact branch and bound that solves a small program in process (`enumerate_best`). hopsmgr.core.ilp
builds the rest of the strategy (LP, rounding, neighbourhood, CBC MIP) on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Option:
    item: int
    value: float
    uses: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        # One entry per resource: repeated entries are added up (every check below relies on it).
        uses = self.uses
        if len(uses) < 2 or (len(uses) == 2 and uses[0][0] != uses[1][0]):
            return  # (the common cases, decided without building a set)
        if len({r for r, _ in uses}) != len(uses):
            merged: dict[int, float] = {}
            for r, amount in uses:
                merged[r] = merged.get(r, 0.0) + amount
            object.__setattr__(self, "uses", tuple(merged.items()))


def fits(option: Option, free: list[float]) -> bool:
    return all(free[r] >= amount - 1e-9 for r, amount in option.uses)


def take(option: Option, free: list[float]) -> None:
    for r, amount in option.uses:
        free[r] -= amount


def best_per_item(
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


class _TooManyNodes(Exception):
    pass


def enumerate_best(
    options: Sequence[Option], capacity: Sequence[float], usable: Sequence[int], node_limit: int
) -> dict[int, int] | None:
    """[ours] The optimal choice of a small program by depth-first branch and bound, or None when the
    search would visit more than `node_limit` nodes.

    Items are taken by their best option's value, options by value; a branch is cut when its value
    plus every remaining item's best cannot beat the incumbent. A small round (a lab's cluster, most
    fragment plans) is then solved exactly without starting CBC, which costs ~10-30 ms a start.
    """
    by_item: dict[int, list[int]] = {}
    for o in usable:
        by_item.setdefault(options[o].item, []).append(o)
    for opts in by_item.values():
        opts.sort(key=lambda o: -options[o].value)
    items = sorted(by_item, key=lambda i: (-options[by_item[i][0]].value, i))
    suffix = [0.0] * (len(items) + 1)
    for k in range(len(items) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + options[by_item[items[k]][0]].value
    free = list(capacity)
    chosen: dict[int, int] = {}
    best_value = -1.0
    best: dict[int, int] = {}
    nodes = 0

    def search(k: int, value: float) -> None:
        nonlocal best_value, best, nodes
        nodes += 1
        if nodes > node_limit:
            raise _TooManyNodes
        if value > best_value + 1e-12:
            best_value, best = value, dict(chosen)
        if k == len(items) or value + suffix[k] <= best_value + 1e-12:
            return
        item = items[k]
        for o in by_item[item]:
            option = options[o]
            if value + option.value + suffix[k + 1] <= best_value + 1e-12:
                break  # options are sorted: no later one can do better
            if fits(option, free):
                take(option, free)
                chosen[item] = o
                search(k + 1, value + option.value)
                del chosen[item]
                for r, amount in option.uses:
                    free[r] += amount
        search(k + 1, value)

    try:
        search(0, 0.0)
    except _TooManyNodes:
        return None
    return best
