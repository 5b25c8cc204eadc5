"""The service window and the sensitivity adjustment for fragment plans (HOPS.md section 6).

The window walks the priority-ordered queue from its head, adding each job's minimum requirement, until
the sum reaches the GPUs available; only window jobs are placed this round. For the later, fragment
plans of a round, the sensitivity adjustment pulls low-sensitivity jobs from behind the window while the
window is more sensitive on average than the whole queue: they fit fragments across servers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hopsmgr.core.model import JobId, JobView


def service_window(ordered: Sequence[JobView], gpus: int, enabled: bool = True) -> list[JobView]:
    """The head of `ordered` whose minimum requirements first reach `gpus` (all jobs if disabled)."""
    if not enabled:
        return list(ordered)
    window: list[JobView] = []
    total = 0
    for view in ordered:
        if total >= gpus:
            break
        window.append(view)
        total += view.spec.requirements.minimum
    return window


def mean_sensitivity(views: Sequence[JobView], rho: Mapping[JobId, float]) -> float:
    if not views:
        return 1.0
    return sum(rho.get(v.id, 1.0) for v in views) / len(views)


def sensitivity_adjustment(
    window: Sequence[JobView],
    ordered: Sequence[JobView],
    rho: Mapping[JobId, float],
    idle_gpus: int,
) -> list[JobView]:
    """Extend `window` with low-sensitivity jobs from behind it (nearest the boundary first).

    While the window's mean rho exceeds the queue's, walk from the window boundary towards the queue's
    tail and add jobs with rho below the queue's mean whose minimum requirement fits the idle GPUs.
    The added jobs return to their own queue positions next round (the caller recomputes the window).
    """
    rho_queue = mean_sensitivity(ordered, rho)
    result = list(window)
    in_window = {v.id for v in window}
    for view in ordered:
        if mean_sensitivity(result, rho) <= rho_queue:
            break
        if view.id in in_window:
            continue
        if rho.get(view.id, 1.0) < rho_queue and view.spec.requirements.minimum <= idle_gpus:
            result.append(view)
            in_window.add(view.id)
    return result


def idle_backfill(window: Sequence[JobView], ordered: Sequence[JobView], idle_gpus: int) -> list[JobView]:
    """[ours] Extend a fragment plan's `window` with jobs from behind it whose minimum requirement fits
    the idle GPUs, nearest the boundary first, until their minimums reach the idle GPUs: a job the
    window's jobs cannot use the idle GPUs for waits beside them no longer (the window's jobs rank
    first in the program, so they keep the GPUs they can use). Only jobs that have not run yet: one
    that ran was preempted, by a first plan that may have left its GPUs idle for a moment, and taking
    them back at once would undo that decision (a preemption cycle); it returns by its queue
    position. The added jobs return to their own queue positions next round."""
    result = list(window)
    in_window = {v.id for v in window}
    left = idle_gpus
    for view in ordered:
        if left <= 0:
            break
        if view.id in in_window:
            continue
        need = view.spec.requirements.minimum
        if need <= left and view.running_s <= 0:
            result.append(view)
            in_window.add(view.id)
            left -= need
    return result
