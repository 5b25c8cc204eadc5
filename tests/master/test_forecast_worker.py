"""The forecast worker keeps its own copy of the master's estimator, brought up to date by the updates
since the last forecast (hopsmgr.master.forecasts, LoggedEstimator in hopsmgr.master.planner_process),
and the estimator's export reuses the rows of profiles that did not change.

The state comes from a simulation of the paper world (real machine, real estimator); the worker is a
real process. Checked: a forecast made from the copy equals one made from the whole state, the copy
follows the estimator as it learns, a replaced worker is sent the whole state again, a follower that
stops taking its updates is dropped, and an export is never changed by a later update."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import pickle
import time
from types import SimpleNamespace

import pytest

from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.future import FutureOptions
from hopsmgr.forecast.live import LiveState, capture
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.master import live_wire
from hopsmgr.master.forecasts import Forecaster
from hopsmgr.master.planner_process import LoggedEstimator, decode_update
from hopsmgr.sim.engine import Simulation
from tests.forecast._forecast_helpers import CLUSTER, started

# greedy plans only (exact_s=0): forecasts compared for equality must not depend on the wall clock
SETTINGS = ForecastSettings(
    min_futures=2,
    max_futures=2,
    limit_s=math.inf,
    future=FutureOptions(sigma=0.0, arrivals=False, exact_s=0.0),
)


def logged(sim: Simulation) -> LoggedEstimator:
    estimator = LoggedEstimator.from_state(sim.machine.estimator.export_state())
    assert isinstance(estimator, LoggedEstimator)
    sim.machine.estimator = estimator  # the simulation now teaches the logged one, as the master's is
    return estimator


def forecaster(sim: Simulation) -> Forecaster:
    config = SimpleNamespace(scheduler=CLUSTER.scheduler, master=SimpleNamespace(planner="process"))
    ctl = SimpleNamespace(
        config=config, machine=sim.machine, clock=lambda: sim.now, forecasts={}, next_round_at=None
    )
    return Forecaster(ctl, SETTINGS)  # type: ignore[arg-type]


def forecast_once(fc: Forecaster) -> None:
    """One forecast by `fc`, then its workers stopped."""

    async def scenario() -> None:
        try:
            await fc.once()
        finally:
            fc.close()

    asyncio.run(scenario())


def whole_state_forecast(sim: Simulation, fc: Forecaster) -> dict[str, object]:
    """The forecast from the whole state, shown as the master shows it (its intervals widened)."""
    raw = forecast(capture(sim.machine, sim.now), SETTINGS, time.perf_counter)
    return {job_id: fc.tracker.residuals.widen(f) for job_id, f in raw.items()}


def test_the_worker_forecasts_from_its_copy_as_from_the_whole_state_and_a_new_worker_gets_it_whole() -> None:
    sim = started(3000.0)
    estimator = logged(sim)
    fc = forecaster(sim)

    async def scenario() -> None:
        try:
            await fc.once()  # first: the whole state
            assert fc.ctl.forecasts == whole_state_forecast(sim, fc) and not fc.resend
            sampled_before = sim.machine.estimator.export_state()
            sim.advance(until=lambda: sim.now >= 6000.0)  # the running job is observed meanwhile
            updates = len(estimator.logs["forecast"])
            assert updates > 0 and estimator.export_state() != sampled_before
            await fc.once()  # the updates only
            assert estimator.logs["forecast"] == []
            assert fc.ctl.forecasts == whole_state_forecast(sim, fc)
            fc.worker.stop()  # replaced: the new worker has no copy, says so, and is sent the whole
            estimator.observe_data_time("j1", next(iter(estimator.profiled_types("j1"))), 0.5, 0.25)
            await fc.once()
            assert fc.ctl.forecasts == whole_state_forecast(sim, fc) and not fc.resend
        finally:
            fc.close()

    asyncio.run(scenario())
    assert any(j.state == JobState.QUEUED for j in sim.machine.state.jobs.values())


def test_a_follower_gets_the_updates_since_it_last_took_them_and_one_that_lags_is_dropped() -> None:
    sim = started(3000.0)
    estimator = logged(sim)
    assert estimator.take_updates("a") is None  # not following yet: it needs the whole state
    sim.advance(until=lambda: sim.now >= 6000.0)
    taken = estimator.take_updates("a")
    assert taken and {decode_update(u)[0] for u in taken} <= {
        "observe",
        "observe_data_time",
        "add_profile",
        "forget",
    }
    assert estimator.take_updates("a") == []
    estimator.MAX_LOG, estimator.PER_JOB = 3, 0
    sim.advance(until=lambda: sim.now >= 9000.0)
    assert "a" not in estimator.logs  # dropped: no memory held for a follower that stopped asking
    assert estimator.take_updates("a") is None


def test_an_export_reuses_unchanged_rows_and_is_never_changed_by_a_later_update() -> None:
    sim = started(3000.0)
    estimator = sim.machine.estimator
    first = estimator.export_state()
    kept = copy.deepcopy(first)
    job_id, gpu_type = first["profiles"][0]["job"], first["profiles"][0]["gpu_type"]
    estimator.observe_data_time(job_id, gpu_type, 0.5, 0.25)
    second = estimator.export_state()
    assert first == kept
    changed = [r for r in second["profiles"] if (r["job"], r["gpu_type"]) == (job_id, gpu_type)]
    assert changed[0]["data"] != kept["profiles"][0]["data"]
    assert all(a is b for a, b in zip(first["profiles"][1:], second["profiles"][1:], strict=True))
    assert type(estimator).from_state(second).export_state() == second


def test_the_first_forecast_sends_the_estimator_taken_at_start_and_the_updates_since_not_a_new_export() -> (
    None
):
    sim = started(3000.0)
    estimator = logged(sim)
    fc = forecaster(sim)  # takes the estimator as it is now and starts following it
    sim.advance(until=lambda: sim.now >= 6000.0)  # the estimator learns meanwhile
    assert estimator.logs["forecast"]
    exports = 0
    export = estimator.export_state

    def counted() -> dict[str, object]:
        nonlocal exports
        exports += 1
        return export()

    estimator.export_state = counted  # type: ignore[method-assign]

    forecast_once(fc)
    assert exports == 0 and fc.base is None and not fc.resend
    estimator.export_state = export  # type: ignore[method-assign]
    assert fc.ctl.forecasts == whole_state_forecast(sim, fc)


def test_the_live_state_travels_as_what_changed_since_the_workers_last_forecast() -> None:
    sim = started(3000.0)

    def live_now() -> LiveState:
        return capture(sim.machine, sim.now, copy_records=False, with_estimator=False)

    def same(a: LiveState, b: LiveState) -> bool:
        states = [[x.__getstate__() for x in s.attempts] for s in (a, b)]
        return (
            a.jobs == b.jobs
            and states[0] == states[1]
            and dataclasses.replace(a, jobs=(), attempts=()) == dataclasses.replace(b, jobs=(), attempts=())
        )

    first = live_now()
    message, held = live_wire.encode(first, {})
    whole = pickle.dumps(message)
    back, worker_held = live_wire.decode(pickle.loads(whole), {})
    assert same(back, first)
    sim.advance(until=lambda: sim.now >= 3600.0)  # some jobs change, most do not
    second = live_now()
    message, held = live_wire.encode(second, held)
    changed = message[2]
    assert 0 < len(changed) < len(second.jobs)
    back, worker_held = live_wire.decode(pickle.loads(pickle.dumps(message)), worker_held)
    assert same(back, second)
    back.jobs[0].profiling.add("x")  # the worker's records are its own: what is held stays as sent
    assert "x" not in held[back.jobs[0].id][1][live_wire._PROFILING]
    with pytest.raises(ValueError, match="holds no job"):
        live_wire.decode(pickle.loads(pickle.dumps(message)), {})


def test_a_worker_without_the_jobs_is_sent_them_ahead_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    from hopsmgr.master import forecasts

    monkeypatch.setattr(forecasts, "PRELOAD_JOBS", 2)
    sim = started(3000.0)
    logged(sim)
    fc = forecaster(sim)
    calls: list[str] = []
    call = fc.worker.call

    async def counted(fn: object, *args: object, timeout_s: float) -> object:
        calls.append(getattr(fn, "__name__", "?"))
        return await call(fn, *args, timeout_s=timeout_s)  # type: ignore[arg-type]

    fc.worker.call = counted  # type: ignore[method-assign]

    forecast_once(fc)
    jobs = len(sim.machine.state.jobs)
    assert jobs == 3 and calls.count("preload_jobs") == 2  # every job, two a call
    assert calls[-1] == "forecast_following" and len(fc.held) == jobs
    assert fc.ctl.forecasts == whole_state_forecast(sim, fc)


def test_the_futures_plan_first_at_the_round_loops_next_tick_not_a_whole_round_from_now() -> None:
    sim = started(3000.0)
    fc = forecaster(sim)
    try:
        round_s = CLUSTER.scheduler.round_seconds
        assert fc.capture(sim.now).next_round == sim.now + round_s  # no tick seen yet: a round from now
        fc.ctl.next_round_at = sim.now + 7.0
        assert fc.capture(sim.now).next_round == sim.now + 7.0
        fc.ctl.next_round_at = sim.now - 3.0  # a round running late starts as soon as it can
        assert fc.capture(sim.now).next_round == sim.now
    finally:
        fc.close()
