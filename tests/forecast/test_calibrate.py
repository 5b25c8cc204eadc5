"""Start intervals widened by recent residuals (hopsmgr.forecast.calibrate)."""

from __future__ import annotations

import random
from fractions import Fraction

from hopsmgr.forecast.calibrate import FLOOR, GAMMA, TAIL, Residuals, StartTracker
from hopsmgr.forecast.live import JobForecast


def fc(made: float, p10: float | None, p50: float | None, p90: float | None) -> JobForecast:
    return JobForecast(p10, p50, p90, None, None, None, futures=4, made=made)


def test_too_few_residuals_leave_a_forecast_as_it_is_but_at_least_a_round_either_side() -> None:
    residuals = Residuals(round_s=300.0, min_count=5)
    for _ in range(4):
        residuals.add(1000.0, 3000.0)
    f = fc(0.0, 500.0, 1000.0, 2000.0)
    assert residuals.bounds() is None and residuals.widen(f) == f
    # a narrower interval is widened to a round either side of P50, never before it was made
    narrow = residuals.widen(fc(0.0, 900.0, 1000.0, 1100.0))
    assert (narrow.start_p10, narrow.start_p50, narrow.start_p90) == (700.0, 1000.0, 1300.0)
    soon = residuals.widen(fc(0.0, 100.0, 100.0, 100.0))
    assert (soon.start_p10, soon.start_p90) == (0.0, 400.0)
    open_above = residuals.widen(fc(0.0, 1000.0, 1000.0, None))
    assert (open_above.start_p10, open_above.start_p90) == (700.0, None)


def test_one_futures_point_is_shown_open_until_residuals_bound_it_and_misses_nothing() -> None:
    # a queue so large that one future is all the limit allows: P10 = P50 = P90, no interval
    made = 10_000.0
    point = JobForecast(made + 500.0, made + 500.0, made + 500.0, None, None, None, futures=1, made=made)
    tracker = StartTracker(Residuals(round_s=100.0))
    shown = tracker.residuals.widen(point)
    assert (shown.start_p10, shown.start_p50, shown.start_p90) == (made, made + 500.0, None)
    levels = (tracker.residuals.low_level, tracker.residuals.high_level)
    tracker.note({f"j{k}": point for k in range(20)})
    tracker.waiting(made + 5_000.0)  # every one past the point: none past an interval shown
    for k in range(20):
        tracker.started(f"j{k}", made + 1_000.0 + k)
    assert (tracker.residuals.low_level, tracker.residuals.high_level) == levels
    assert len(tracker.residuals.values) == 20  # their residuals count
    bounded = tracker.residuals.widen(point)  # now the residuals bound it
    assert bounded.start_p90 is not None and bounded.start_p90 > made + 500.0
    # two futures that agree: an interval of their own, a round either side of their P50
    two = JobForecast(made + 500.0, made + 500.0, made + 500.0, None, None, None, futures=2, made=made)
    shown_two = Residuals(round_s=100.0).widen(two)
    assert (shown_two.start_p10, shown_two.start_p90) == (made + 400.0, made + 600.0)


def test_intervals_widen_to_the_residuals_and_never_narrow_or_start_before_they_were_made() -> None:
    residuals = Residuals(round_s=300.0)
    for actual in (500.0, 700.0, 900.0, 1000.0, 1200.0, 1500.0, 1800.0, 2000.0, 3000.0):
        residuals.add(1000.0, actual)  # forecast 1000 each: residuals -0.5 .. 2.0
    lo, hi = residuals.bounds() or (0.0, 0.0)
    assert (lo, hi) == (-0.5, 2.0)  # nine residuals: the conformal bounds are the extremes
    made = 10_000.0
    wide = residuals.widen(fc(made, made + 950.0, made + 1000.0, made + 1050.0))
    assert wide.start_p10 == made + 1000.0 + lo * 1000.0 and wide.start_p90 == made + 1000.0 + hi * 1000.0
    already = fc(made, made + 10.0, made + 1000.0, made + 9000.0)  # wider than the residuals: kept
    assert residuals.widen(already) == already
    now = residuals.widen(fc(made, made, made, made))  # "starts now": scaled by a round, not by 0
    assert now.start_p10 == made and now.start_p90 is not None and now.start_p90 > made
    assert residuals.widen(fc(made, None, None, None)).start_p10 is None  # no start forecast: none made
    assert residuals.widen(fc(made, made + 900.0, made + 1000.0, None)).start_p90 is None  # past the horizon


def test_the_bounds_are_the_split_conformal_order_statistics() -> None:
    residuals = Residuals(round_s=100.0, min_count=1)
    for k in range(8):
        residuals.add(100.0, 100.0 + 100.0 * k)  # residuals 0, 1, ..., 7
    assert residuals.bounds() is None  # (8 + 1) * 0.9 = 8.1: no 9th smallest of eight yet
    residuals.add(100.0, 900.0)
    assert residuals.bounds() == (0.0, 8.0)  # n = 9: the 1st and the 9th smallest
    for k in range(9, 19):
        residuals.add(100.0, 100.0 + 100.0 * k)
    assert residuals.bounds() == (1.0, 17.0)  # n = 19: the 2nd and the 18th smallest


def test_calibrated_intervals_cover_about_four_in_five_of_later_starts() -> None:
    rng = random.Random(7)
    residuals = Residuals(round_s=60.0)

    def job() -> tuple[float, float]:  # forecast wait and actual wait: the futures are 40% off either way
        forecast = rng.uniform(600.0, 6000.0)
        return forecast, forecast * rng.lognormvariate(0.0, 0.4)

    for _ in range(300):
        residuals.add(*job())
    covered = raw = 0
    for _ in range(2000):
        forecast, actual = job()
        narrow = fc(0.0, 0.95 * forecast, forecast, 1.05 * forecast)  # the futures' own spread: too narrow
        wide = residuals.widen(narrow)
        assert wide.start_p10 is not None and wide.start_p90 is not None
        covered += wide.start_p10 <= actual <= wide.start_p90
        raw += 0.95 * forecast <= actual <= 1.05 * forecast
    assert 0.74 <= covered / 2000 <= 0.86, covered / 2000
    assert raw / 2000 < 0.3


def test_a_tracker_keeps_each_jobs_first_forecast_until_it_starts() -> None:
    tracker = StartTracker(Residuals(round_s=100.0, min_count=1))
    tracker.note({"a": fc(0.0, 400.0, 500.0, 600.0), "b": fc(0.0, None, None, None)})
    tracker.note({"a": fc(50.0, 50.0, 60.0, 70.0)})  # a later forecast: the first one counts
    assert tracker.first == {"a": (0.0, 500.0, 400.0, 600.0)}  # the raw P50, the interval shown
    tracker.started("a", 1000.0)
    assert list(tracker.residuals.values) == [1.0] and tracker.first == {}
    tracker.note({"c": fc(0.0, 1.0, 2.0, 3.0)})
    tracker.forget("c")
    tracker.started("c", 10.0)  # forgotten: no residual
    assert len(tracker.residuals.values) == 1


def test_a_start_before_the_forecast_was_made_is_no_residual() -> None:
    # a preempted job waits again: its forecast is of its restart, and its first start lies before it
    tracker = StartTracker(Residuals(round_s=100.0, min_count=1))
    tracker.note({"a": fc(5000.0, 5100.0, 5200.0, 5300.0)})
    tracker.started("a", 1000.0)
    assert not tracker.residuals.values and tracker.first == {}


def test_the_tails_adapt_to_the_misses_so_a_drifting_load_is_still_covered() -> None:
    # Waits that keep growing (a queue that fills): each job's actual wait is further above its
    # forecast than the last ones' were, so fixed residual bounds fall behind; the adapted upper tail
    # keeps the share of starts above the interval near 10%.
    def run(gamma: Fraction) -> float:
        tracker = StartTracker(Residuals(round_s=60.0, gamma=gamma))
        above = 0
        jobs = 600
        for k in range(jobs):
            made, forecast = float(k), 1000.0
            actual = forecast * (1.0 + k / 200.0)  # the forecast is ever more optimistic
            tracker.note({f"j{k}": fc(made, made + 0.9 * forecast, made + forecast, made + 1.1 * forecast)})
            p90 = tracker.first[f"j{k}"][3]
            above += p90 is not None and made + actual > p90
            tracker.started(f"j{k}", made + actual)
        return above / jobs

    assert run(Fraction(0)) > 0.2  # split conformal alone: the drift leaves it behind
    assert run(GAMMA) <= 0.12


def test_a_job_waiting_past_its_p90_is_a_miss_above_observed_at_once_and_only_once() -> None:
    tracker = StartTracker(Residuals(round_s=100.0, min_count=1))
    levels = lambda: (tracker.residuals.low_level, tracker.residuals.high_level)  # noqa: E731
    tracker.note({"a": fc(0.0, 400.0, 500.0, 600.0), "b": fc(0.0, 400.0, 500.0, 600.0)})
    tracker.waiting(600.0)  # at its P90: not past it yet
    assert levels() == (TAIL, TAIL) and not tracker.overdue
    tracker.waiting(601.0)
    # both jobs, once each (not below either: the low level stays at its top)
    after = (TAIL, TAIL - 2 * GAMMA * (1 - TAIL))
    assert levels() == after
    tracker.waiting(5000.0)  # still waiting: not again
    assert levels() == after
    tracker.started("a", 9000.0)  # its residual comes at its start, its miss does not come again
    assert list(tracker.residuals.values) == [17.0] and levels() == after
    tracker.forget("b")  # ended without starting: its observed miss stays, nothing more
    assert levels() == after and not tracker.overdue and not tracker.first
    # a job that starts inside its interval is observed at its start, as before
    tracker.note({"c": fc(0.0, 400.0, 500.0, 600.0)})
    shown_p90 = tracker.first["c"][3]
    assert shown_p90 is not None
    tracker.waiting(shown_p90 - 1.0)
    tracker.started("c", shown_p90 - 1.0)
    assert levels() == (TAIL, after[1] + GAMMA * TAIL)


def test_a_tail_narrows_back_to_the_split_conformal_bound_and_no_further() -> None:
    # A quiet cluster first: jobs forecast to start at once do, inside any interval. The levels stay at
    # 10%, so the bounds stay the split-conformal ones when the waits come.
    residuals = Residuals(round_s=100.0)
    for _ in range(20):
        residuals.add(0.0, 0.0)
        residuals.observe(False, False)
    assert (residuals.low_level, residuals.high_level) == (TAIL, TAIL)
    for k in range(19):
        residuals.add(100.0, 100.0 + 100.0 * k)  # residuals 0 .. 18 over 39 values
    assert residuals.bounds() == (0.0, 15.0)  # the 4th and the 36th smallest (n = 39; 21 zeros)
    residuals.observe(False, True)  # a miss above widens that side ...
    assert residuals.high_level == TAIL - GAMMA * (1 - TAIL)
    for _ in range(100):
        residuals.observe(False, False)  # ... and starts inside narrow it back to 10%, not past it
    assert residuals.high_level == TAIL


def test_known_misses_of_waiting_jobs_adapt_the_upper_tail_before_they_start() -> None:
    # A steady queue, then the waits jump to ten times the forecasts (a burst the futures do not see):
    # the jobs that miss above are the ones still waiting, for hours. Observed at their starts only,
    # the misses come too late to widen the intervals of the jobs forecast meanwhile; observed as soon
    # as a job waits past its P90, they widen them in time.
    def run(early: bool) -> float:
        rng = random.Random(3)
        tracker = StartTracker(Residuals(round_s=60.0))
        starts: dict[str, float] = {}
        above = 0
        for k in range(300):
            now = 100.0 * k
            for job_id in [j for j in tracker.first if starts[j] <= now]:
                tracker.started(job_id, starts[job_id])
            if early:
                tracker.waiting(now)
            forecast = 1000.0
            tracker.note({f"j{k}": fc(now, now + 0.9 * forecast, now + forecast, now + 1.1 * forecast)})
            p90 = tracker.first[f"j{k}"][3]
            drift = 9.0 if k >= 100 else 0.0
            starts[f"j{k}"] = now + forecast * (rng.uniform(0.7, 1.3) + drift)
            above += k >= 100 and p90 is not None and starts[f"j{k}"] > p90
        return above / 200

    late, early = run(False), run(True)
    assert late > 0.4 and early < 0.15, (early, late)


def test_jobs_waiting_past_their_p50_count_in_the_upper_bound_at_their_least_residual() -> None:
    tracker = StartTracker(Residuals(round_s=100.0))
    for k in range(9):
        tracker.residuals.add(1000.0, 1000.0 + 100.0 * k)  # residuals 0, 0.1, ..., 0.8
    assert tracker.residuals.bounds() == (0.0, 0.8)
    # ten jobs forecast at 0 to start at 1000: still waiting at 6000, each residual is at least 5
    tracker.note({f"w{k}": fc(0.0, 900.0, 1000.0, None) for k in range(10)})
    tracker.note({"young": fc(5500.0, 5900.0, 6000.0, 6100.0)})  # not past its P50: not counted
    tracker.waiting(6000.0)
    assert sorted(tracker.residuals.censored) == [5.0] * 10
    low, high = tracker.residuals.bounds() or (0.0, 0.0)
    assert low == 0.0  # the lower bound is the started jobs' alone
    assert high == 5.0  # 19 values: the 18th smallest, one of the waiting jobs' least residuals
    widened = tracker.residuals.widen(fc(10_000.0, 10_900.0, 11_000.0, 11_100.0))
    assert widened.start_p90 == 11_000.0 + 5.0 * 1000.0
    tracker.started("w0", 7000.0)  # starts: a residual of 6; the others still wait
    tracker.waiting(7000.0)
    assert len(tracker.residuals.censored) == 9 + 1  # "young" is past its P50 now: (7000 - 6000) / 500 = 2
    assert 2.0 in tracker.residuals.censored and tracker.residuals.values[-1] == 6.0


def test_thousands_of_known_misses_at_once_open_the_tail_for_a_bounded_time() -> None:
    # 7,500 waiting jobs found past their P90 in one call: one step of 7,500 observations, the upper
    # level held at FLOOR (not -335), so 50 starts in their intervals close the tail again
    tracker = StartTracker(Residuals(round_s=60.0))
    tracker.note({f"w{k}": fc(0.0, 90.0, 100.0, 110.0) for k in range(7500)})
    tracker.waiting(1000.0)
    assert tracker.residuals.high_level == FLOOR
    assert tracker.residuals.low_level == TAIL
    tracker.waiting(2000.0)  # known once: no second observation
    assert tracker.residuals.high_level == FLOOR
    for _ in range(49):
        tracker.residuals.observe(False, False)
    assert tracker.residuals.high_level < 0
    tracker.residuals.observe(False, False)
    assert tracker.residuals.high_level == 0
    tracker.residuals.observe(False, False)
    assert tracker.residuals.high_level > 0


def test_a_bulk_observation_is_the_same_as_single_ones() -> None:
    one, bulk = Residuals(round_s=60.0), Residuals(round_s=60.0)
    for _ in range(7):
        one.observe(False, True)
    bulk.observe(False, True, count=7)
    assert (one.low_level, one.high_level) == (bulk.low_level, bulk.high_level)
