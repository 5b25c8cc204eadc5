"""Unit tests of hopsmgr.core.window: the service window and the sensitivity adjustment."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core.model import JobView
from hopsmgr.core.window import idle_backfill, mean_sensitivity, sensitivity_adjustment, service_window
from tests.helpers.builders import job_view


def ids(views: list[JobView]) -> list[str]:
    return [v.id for v in views]


# --- service window -------------------------------------------------------------------------------------

QUEUE = [
    job_view("a", 4, 8),
    job_view("b", 4),
    job_view("c", 2, 4),
    job_view("d", 8),
    job_view("e", 1),
]  # minimums 4 4 2 8 1


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (0, []),
        (1, ["a"]),
        (4, ["a"]),  # 4 reaches 4
        (5, ["a", "b"]),
        (8, ["a", "b"]),
        (9, ["a", "b", "c"]),
        (10, ["a", "b", "c"]),  # 4 + 4 + 2 = 10 reaches 10
        (11, ["a", "b", "c", "d"]),
        (18, ["a", "b", "c", "d"]),
        (19, ["a", "b", "c", "d", "e"]),
        (100, ["a", "b", "c", "d", "e"]),  # the queue ends first
    ],
)
def test_window_stops_once_minimums_reach_the_gpus(gpus: int, expected: list[str]) -> None:
    assert ids(service_window(QUEUE, gpus)) == expected


def test_window_disabled_is_everything() -> None:
    assert ids(service_window(QUEUE, 0, enabled=False)) == ids(QUEUE)
    assert ids(service_window(QUEUE, 4, enabled=False)) == ids(QUEUE)


def test_window_of_empty_queue() -> None:
    assert service_window([], 64) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 16), max_size=30), st.integers(0, 200))
def test_window_is_the_shortest_head_that_reaches(minimums: list[int], gpus: int) -> None:
    queue = [job_view(f"j{k}", m) for k, m in enumerate(minimums)]
    window = service_window(queue, gpus)
    assert window == queue[: len(window)]
    total = sum(minimums[: len(window)])
    if len(window) < len(queue):
        assert total >= gpus
    # Without its last job the window would not reach the GPUs (it is the shortest such head).
    if window:
        assert total - minimums[len(window) - 1] < gpus


# --- sensitivity adjustment -----------------------------------------------------------------------------


def test_mean_sensitivity() -> None:
    a, b = job_view("a", 1), job_view("b", 1)
    assert mean_sensitivity([], {}) == 1.0
    assert mean_sensitivity([a, b], {"a": 3.0, "b": 1.0}) == 2.0
    assert mean_sensitivity([a, b], {"a": 3.0}) == 2.0  # unknown = 1.0


def test_no_adjustment_when_window_is_not_more_sensitive() -> None:
    queue = [job_view("w", 2), job_view("x", 1), job_view("y", 1)]
    rho = {"w": 1.0, "x": 1.0, "y": 3.0}  # queue mean 5/3 > window mean 1
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=8)) == ["w"]


def test_adjustment_adds_low_rho_jobs_that_fit_and_stops_once_the_mean_drops() -> None:
    queue = [job_view("w", 2), job_view("a", 1), job_view("b", 1), job_view("h", 1), job_view("c", 1)]
    rho = {"w": 2.0, "a": 1.0, "b": 1.0, "h": 3.0, "c": 1.0}  # queue mean 8/5 = 1.6
    # Window {w}: 2.0 > 1.6, add a -> mean 1.5 <= 1.6: stop; b and c stay out.
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=8)) == ["w", "a"]


def test_adjustment_skips_jobs_that_do_not_fit_or_are_sensitive() -> None:
    queue = [job_view("w", 2), job_view("big", 4), job_view("h", 1), job_view("a", 1), job_view("b", 2)]
    rho = {"w": 3.0, "big": 1.0, "h": 2.5, "a": 1.0, "b": 1.0}  # queue mean 8.5/5 = 1.7
    # big does not fit 2 idle GPUs; h is above the queue mean; a (mean 2.0) and b (mean 5/3) are added.
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=2)) == ["w", "a", "b"]
    # With 1 idle GPU only a fits; the walk reaches the end of the queue without the mean dropping.
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=1)) == ["w", "a"]
    # Nothing fits no idle GPUs.
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=0)) == ["w"]


def test_adjustment_walks_nearest_the_boundary_first() -> None:
    queue = [job_view("w", 1), job_view("near", 1), job_view("far", 1), job_view("z", 1)]
    rho = {"w": 5.0, "near": 1.0, "far": 1.0, "z": 1.0}  # queue mean 2.0; {w, near} mean 3.0; + far 7/3
    assert ids(sensitivity_adjustment(queue[:1], queue, rho, idle_gpus=1)) == ["w", "near", "far", "z"]
    rho2 = {"w": 2.5, "near": 1.0, "far": 1.0, "z": 1.5}  # queue mean 1.5; {w, near} 1.75; + far 1.5
    assert ids(sensitivity_adjustment(queue[:1], queue, rho2, idle_gpus=1)) == ["w", "near", "far"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.floats(1.0, 5.0)), min_size=1, max_size=20),
    st.integers(0, 20),
    st.integers(0, 16),
)
def test_adjustment_properties(jobs: list[tuple[int, float]], cut: int, idle: int) -> None:
    queue = [job_view(f"j{k}", m) for k, (m, _) in enumerate(jobs)]
    rho = {f"j{k}": r for k, (_, r) in enumerate(jobs)}
    window = queue[: min(cut, len(queue))]
    result = sensitivity_adjustment(window, queue, rho, idle)
    rho_queue = mean_sensitivity(queue, rho)
    assert result[: len(window)] == window  # the window is kept, in order
    added = result[len(window) :]
    assert len({v.id for v in result}) == len(result)
    for v in added:
        assert v not in window
        assert rho[v.id] < rho_queue
        assert v.spec.requirements.minimum <= idle
    # Added jobs keep their queue order.
    position = {v.id: k for k, v in enumerate(queue)}
    assert [position[v.id] for v in added] == sorted(position[v.id] for v in added)
    # Nothing is added once the mean no longer exceeds the queue's: every prefix before the last addition
    # still had a higher mean.
    for k in range(len(added)):
        assert mean_sensitivity(window + added[:k], rho) > rho_queue


# --- idle backfill ----------------------------------------------------------------------------------------


def test_idle_backfill_adds_jobs_behind_the_window_that_fit_until_the_idle_gpus_are_spoken_for() -> None:
    # the window's head needs 8; behind it: 4 (does not fit 3 idle GPUs), 2, 2 (only 1 left), 1
    queue = [
        job_view("big", 8),
        job_view("four", 4),
        job_view("two", 2),
        job_view("two_b", 2),
        job_view("one", 1),
    ]
    assert ids(idle_backfill(queue[:1], queue, idle_gpus=3)) == ["big", "two", "one"]
    assert ids(idle_backfill(queue[:1], queue, idle_gpus=0)) == ["big"]
    assert ids(idle_backfill(queue[:1], queue, idle_gpus=8)) == ["big", "four", "two", "two_b"]
    assert ids(idle_backfill(queue, queue, idle_gpus=8)) == ids(queue)  # everything is in the window
    # a job that ran before (preempted) is not backfilled: it returns by its queue position
    ran = [queue[0], replace(queue[2], running_s=600.0), *queue[3:]]
    assert ids(idle_backfill(ran[:1], ran, idle_gpus=3)) == ["big", "two_b", "one"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=20), st.integers(0, 20), st.integers(0, 16))
def test_idle_backfill_properties(minimums: list[int], cut: int, idle: int) -> None:
    # every third job has run before (never backfilled)
    queue = [replace(job_view(f"j{k}", m), running_s=60.0 * (k % 3 == 2)) for k, m in enumerate(minimums)]
    window = queue[: min(cut, len(queue))]
    result = idle_backfill(window, queue, idle)
    assert result[: len(window)] == window  # the window is kept, in order
    added = result[len(window) :]
    assert len({v.id for v in result}) == len(result)
    assert all(v.running_s == 0 for v in added)
    assert sum(v.spec.requirements.minimum for v in added) <= idle  # never more than the idle GPUs
    assert [v.id for v in added] == [v.id for v in queue if v in added]  # in queue order
    # a job left out behind the window did not fit what was left when the walk reached it
    left = idle
    for v in queue[len(window) :]:
        if v in added:
            left -= v.spec.requirements.minimum
        else:
            assert v.spec.requirements.minimum > left or v.running_s > 0
