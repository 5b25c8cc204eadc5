"""Unit tests of hopsmgr.core.metrics on hand-built records with hand-computed values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopsmgr.core.metrics import (
    JobRecord,
    RoundRecord,
    cdf,
    fragments_per_round,
    fragments_per_waiting_round,
    ftf_rhos,
    jct_s,
    latency_ratios,
    makespan_s,
    mean,
    percentile,
    placeable_idle_per_round,
    summary,
    utilisation,
    waits_s,
)

RECORDS = [
    # jct 4200, LR 600/3600, rho 4200/3600
    JobRecord(
        "r1",
        "t",
        1,
        submit_time=0.0,
        first_start=600.0,
        end_time=4200.0,
        waited_s=600.0,
        expected_run_s=3600.0,
    ),
    # jct 7200, LR 0, rho 7200/3600 (ideal given)
    JobRecord("r2", "t", 2, 1800.0, 1800.0, 9000.0, waited_s=0.0, expected_run_s=7200.0, ideal_s=3600.0),
    # jct 8400 (two queue periods, 5400 s in all), LR 1.8, rho 8400/3000
    JobRecord("r3", "t", 1, 3600.0, 7200.0, 12000.0, waited_s=5400.0, expected_run_s=3000.0),
    # still queued when the run stopped: LR 2.5, no jct, no rho
    JobRecord("r4", "u", 4, 5400.0, None, None, waited_s=9000.0, expected_run_s=3600.0, completed=False),
    # failed at 12600: ends the makespan, LR 1/60, no jct, no rho
    JobRecord("r5", "u", 8, 600.0, 1200.0, 12600.0, waited_s=600.0, expected_run_s=36000.0, completed=False),
]

ROUNDS = [
    # a waiting job of 1 GPU beside a free block of 2: placeable
    RoundRecord(0.0, 2, 3, solver_s=0.5, busy_gpus=6, total_gpus=8, largest_free_block=2, smallest_waiting=1),
    RoundRecord(300.0, idle_gpus_after_plan=4, jobs_waiting=0, solver_s=1.5, busy_gpus=4, total_gpus=8),
    RoundRecord(600.0, idle_gpus_after_plan=0, jobs_waiting=5, solver_s=2.5, busy_gpus=8, total_gpus=8),
    # 3 idle GPUs, one per server, and the one waiting job needs 2 on a server: not placeable
    RoundRecord(
        900.0, 3, 1, solver_s=0.1, busy_gpus=5, total_gpus=8, largest_free_block=1, smallest_waiting=2
    ),
]


def test_job_metrics() -> None:
    assert makespan_s(RECORDS) == pytest.approx(12600.0)
    assert jct_s(RECORDS) == pytest.approx([4200.0, 7200.0, 8400.0])
    assert waits_s(RECORDS) == pytest.approx([600.0, 0.0, 5400.0, 9000.0, 600.0])
    assert latency_ratios(RECORDS) == pytest.approx([1 / 6, 0.0, 1.8, 2.5, 1 / 60])
    assert ftf_rhos(RECORDS) == pytest.approx([4200 / 3600, 2.0, 2.8])


def test_empty_inputs_give_none() -> None:
    assert makespan_s([]) is None
    assert makespan_s([RECORDS[3]]) is None  # nothing ended
    assert mean([]) is None
    assert percentile([], 50) is None
    assert fragments_per_round([]) is None
    assert utilisation([RoundRecord(0.0, 0, 0)]) is None
    assert cdf([]) == []


def test_unknown_age_skipped() -> None:
    rec = JobRecord("x", "t", 1, 0.0, 0.0, 10.0, waited_s=5.0, expected_run_s=float("inf"))
    assert latency_ratios([rec]) == []
    assert ftf_rhos([rec]) == []


def test_fragments_per_round_counts_only_rounds_with_waiting_jobs() -> None:
    # (2 + 0 [nobody waiting] + 0 + 3) / 4
    assert fragments_per_round(ROUNDS) == pytest.approx(1.25)


def test_fragments_per_waiting_round_and_placeable_idle() -> None:
    assert fragments_per_waiting_round(ROUNDS) == pytest.approx(5 / 3)  # (2 + 0 + 3) over 3 rounds
    assert placeable_idle_per_round(ROUNDS) == pytest.approx(2 / 4)  # only the first round's 2
    assert fragments_per_waiting_round([ROUNDS[1]]) is None
    assert placeable_idle_per_round([]) is None
    # a block exactly the waiting job's size counts; no waiting job, nothing to place
    exact = RoundRecord(0.0, 4, 1, largest_free_block=4, smallest_waiting=4)
    empty = RoundRecord(0.0, 4, 0, largest_free_block=4, smallest_waiting=None)
    assert placeable_idle_per_round([exact, empty]) == pytest.approx(2.0)


def test_utilisation() -> None:
    assert utilisation(ROUNDS) == pytest.approx(23 / 32)


def test_percentile_linear_interpolation() -> None:
    data = [4.0, 1.0, 3.0, 2.0]
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 4.0
    assert percentile(data, 50) == pytest.approx(2.5)
    assert percentile(data, 25) == pytest.approx(1.75)
    assert percentile([7.0], 90) == 7.0
    for bad in (-1.0, 100.5, float("nan")):
        with pytest.raises(ValueError):
            percentile(data, bad)


def test_cdf_merges_ties() -> None:
    assert cdf([3.0, 1.0, 1.0, 2.0]) == [(1.0, 0.5), (2.0, 0.75), (3.0, 1.0)]


def test_summary_hand_computed() -> None:
    s = summary(iter(RECORDS), iter(ROUNDS))
    assert s["jobs"] == 5
    assert s["completed"] == 3
    assert s == pytest.approx(
        {
            "jobs": 5,
            "completed": 3,
            "makespan_h": 3.5,
            "avg_jct_h": 6600 / 3600,  # (4200 + 7200 + 8400) / 3
            "p50_jct_h": 2.0,
            "p90_jct_h": 8160 / 3600,  # position 1.8: 7200 + 0.8 * 1200
            "p99_jct_h": 8376 / 3600,  # position 1.98
            "avg_wait_h": 3120 / 3600,  # 15600 / 5
            "max_lr": 2.5,
            "mean_lr": (1 / 6 + 0 + 1.8 + 2.5 + 1 / 60) / 5,
            "max_ftf": 2.8,
            "frags_per_round": 1.25,
            "frags_per_waiting_round": 5 / 3,
            "placeable_idle_per_round": 0.5,
            "utilisation": 23 / 32,
            "solver_p95_s": 2.35,  # sorted 0.1, 0.5, 1.5, 2.5; position 2.85
        }
    )


def test_summary_of_nothing() -> None:
    s = summary([], [])
    assert s["jobs"] == 0
    assert s["completed"] == 0
    assert all(s[k] is None for k in s if k not in ("jobs", "completed"))


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=30), finite.map(abs).map(lambda x: x % 100), st.floats(0, 100))
def test_percentile_monotone_in_q(values: list[float], q1: float, q2: float) -> None:
    low, high = sorted((q1, q2))
    p_low = percentile(values, low)
    p_high = percentile(values, high)
    assert p_low is not None and p_high is not None
    assert min(values) <= p_low <= p_high + 1e-9 * (1 + abs(p_high))
    assert p_high <= max(values)


@given(st.lists(finite, max_size=30))
def test_cdf_is_a_step_function_ending_at_one(values: list[float]) -> None:
    points = cdf(values)
    xs = [x for x, _ in points]
    fractions = [f for _, f in points]
    assert xs == sorted(set(values))
    assert fractions == sorted(fractions)
    if values:
        assert fractions[-1] == 1.0
