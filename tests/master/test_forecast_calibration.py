"""The master's forecaster feeds its calibration (hopsmgr.forecast.calibrate) what it knows each round:
the jobs that started, the ones that ended without starting, and, of the rest, those already past the
P90 first shown for them (misses above, known before they start)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.calibrate import TAIL
from hopsmgr.forecast.live import JobForecast
from hopsmgr.master.forecasts import WINDOW_S, Forecaster
from hopsmgr.master.views import forecast_of


def test_each_round_reports_the_starts_then_the_waiting_jobs_past_their_p90() -> None:
    now = [1000.0]
    jobs = {
        "started": SimpleNamespace(first_start=500.0),
        "late": SimpleNamespace(first_start=None),
        "early": SimpleNamespace(first_start=None),
    }
    config = SimpleNamespace(
        scheduler=SimpleNamespace(round_seconds=100.0), master=SimpleNamespace(planner="thread")
    )
    machine = SimpleNamespace(state=SimpleNamespace(jobs=jobs), estimator=None)
    ctl = SimpleNamespace(config=config, machine=machine, clock=lambda: now[0], forecasts={})
    fc = Forecaster(ctl)  # type: ignore[arg-type]
    try:
        fc.tracker.note(
            {
                "started": JobForecast(300.0, 350.0, 400.0, None, None, None, futures=3, made=0.0),
                "late": JobForecast(500.0, 600.0, 700.0, None, None, None, futures=3, made=0.0),
                "early": JobForecast(900.0, 1100.0, 1500.0, None, None, None, futures=3, made=0.0),
                "gone": JobForecast(900.0, 1000.0, 1100.0, None, None, None, futures=3, made=0.0),
            }
        )
        fc._note_starts()
        residuals = fc.tracker.residuals
        assert list(residuals.values) == [(500.0 - 350.0) / 350.0]  # "started": its residual
        assert fc.tracker.overdue == {"late"}  # past its P90 at 1000 and still waiting; "gone" forgotten
        # "started" started above its P90 (shown as 450: a round above its P50), "late" will: two misses
        # above, none below
        assert residuals.high_level == TAIL - 2 * residuals.gamma * (1 - TAIL)
        assert residuals.censored == [(1000.0 - 600.0) / 600.0]  # "late" is past its P50; "early" is not
        fc._note_starts()  # the next round: "late" still waits, its miss is not observed again
        assert residuals.high_level == TAIL - 2 * residuals.gamma * (1 - TAIL)
    finally:
        fc.close()


def test_the_arrival_process_is_the_machines_submissions_of_the_window() -> None:
    """Every accepted submission counts, also a job that ended between two forecasts (which a look at
    the live jobs each round would miss), and only those of the last WINDOW_S."""
    submissions = deque([0.0, 10.0, 7_000.0, 9_000.0])
    config = SimpleNamespace(
        scheduler=SimpleNamespace(round_seconds=100.0), master=SimpleNamespace(planner="thread")
    )
    machine = SimpleNamespace(state=SimpleNamespace(jobs={}), estimator=None, submissions=submissions)
    ctl = SimpleNamespace(config=config, machine=machine, clock=lambda: 10.0, forecasts={})
    fc = Forecaster(ctl)  # type: ignore[arg-type]
    try:
        assert fc.observed_since == 10.0
        assert fc.recent_arrivals(12.0) == [0.0, 10.0, 7_000.0, 9_000.0]
        assert fc.recent_arrivals(10.0 + WINDOW_S) == [10.0, 7_000.0, 9_000.0]
    finally:
        fc.close()


def test_a_job_that_no_longer_waits_shows_no_start_forecast() -> None:
    # the forecast made while it waited stays until the next one; its start quantiles are history then
    made = JobForecast(1100.0, 1200.0, 1300.0, 2000.0, 2100.0, 2200.0, futures=3, made=1000.0)
    jobs = {"waits": SimpleNamespace(state=JobState.QUEUED), "runs": SimpleNamespace(state=JobState.RUNNING)}
    ctl = SimpleNamespace(state=SimpleNamespace(jobs=jobs), forecasts={"waits": made, "runs": made})
    waits, runs = forecast_of(ctl, "waits"), forecast_of(ctl, "runs")  # type: ignore[arg-type]
    assert waits is not None and (waits["start_p50"], waits["finish_p50"]) == (1200.0, 2100.0)
    assert runs is not None and runs["start_p10"] is runs["start_p50"] is runs["start_p90"] is None
    assert runs["finish_p50"] == 2100.0 and forecast_of(ctl, "none") is None  # type: ignore[arg-type]
