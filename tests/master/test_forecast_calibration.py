"""The master's forecaster feeds its calibration (hopsmgr.forecast.calibrate) what it knows each round:
the jobs that started, the ones that ended without starting, and, of the rest, those already past the
P90 first shown for them (misses above, known before they start)."""

from __future__ import annotations

from types import SimpleNamespace

from hopsmgr.forecast.calibrate import TAIL
from hopsmgr.forecast.future import JobForecast
from hopsmgr.master.forecasts import Forecaster


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
                "started": JobForecast(300.0, 400.0, 450.0, None, None, None, futures=3, made=0.0),
                "late": JobForecast(500.0, 600.0, 700.0, None, None, None, futures=3, made=0.0),
                "early": JobForecast(900.0, 1100.0, 1500.0, None, None, None, futures=3, made=0.0),
                "gone": JobForecast(900.0, 1000.0, 1100.0, None, None, None, futures=3, made=0.0),
            }
        )
        fc._note_starts()
        residuals = fc.tracker.residuals
        assert list(residuals.values) == [(500.0 - 400.0) / 400.0]  # "started": its residual
        assert fc.tracker.overdue == {"late"}  # past its P90 at 1000 and still waiting; "gone" forgotten
        # "started" started above its P90 (450), "late" will: two misses above, none below
        assert residuals.high_level == TAIL - 2 * residuals.gamma * (1 - TAIL)
        assert residuals.censored == [(1000.0 - 600.0) / 600.0]  # "late" is past its P50; "early" is not
        fc._note_starts()  # the next round: "late" still waits, its miss is not observed again
        assert residuals.high_level == TAIL - 2 * residuals.gamma * (1 - TAIL)
    finally:
        fc.close()


def test_the_arrivals_remembered_are_the_live_jobs_only() -> None:
    """Each live job's submission is noted once; ended jobs are forgotten, so the set of seen ids does
    not grow with every job the master ever ran."""
    jobs = {f"j{k}": SimpleNamespace(id=f"j{k}", submitted=float(k)) for k in range(3)}
    config = SimpleNamespace(
        scheduler=SimpleNamespace(round_seconds=100.0), master=SimpleNamespace(planner="thread")
    )
    machine = SimpleNamespace(state=SimpleNamespace(jobs=jobs), estimator=None)
    ctl = SimpleNamespace(config=config, machine=machine, clock=lambda: 10.0, forecasts={})
    fc = Forecaster(ctl)  # type: ignore[arg-type]
    try:
        assert fc.recent_arrivals(10.0) == [0.0, 1.0, 2.0]
        del jobs["j0"], jobs["j1"]
        jobs["j3"] = SimpleNamespace(id="j3", submitted=3.0)
        assert fc.recent_arrivals(10.0) == [0.0, 1.0, 2.0, 3.0]  # j2 not noted twice, ended ones kept
        assert fc.seen == {"j2", "j3"}
    finally:
        fc.close()
