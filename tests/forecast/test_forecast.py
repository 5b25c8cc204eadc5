"""Forecasts run the scheduler state machine forward from a captured state (hopsmgr.forecast).

The state comes from a simulation that has run for a while (real machine, real estimator, the paper
world as ground truth; tests/forecast/_forecast_helpers.py); the forecast is checked against the same
simulation run on, and for its own consistency: a queued job starts when GPUs free, a running job goes on
from its last progress, a job held for its profiling (or waiting for one that is) arrives in the futures
when that would end, a start past the horizon is not forecast before it, and the forecast modules stay
pure (no clock, no I/O). Also how `hopsmgr queue` and `explain` show a forecast. How the futures are
drawn, kept within the time budget and simulated: tests/forecast/test_forecast_futures.py."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.config import parse_cluster_config
from hopsmgr.control.events import RoundTick
from hopsmgr.control.records import Job
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.future import Future
from hopsmgr.forecast.live import capture
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.run import forecast
from hopsmgr.master.state import load_attempt
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from tests.forecast._forecast_helpers import EXACT, GREEDY, NO_PREEMPTION, started, workload
from tests.unit.test_core_purity import BANNED, clock_reads, imported_roots


def test_without_preemption_waiting_jobs_start_one_after_another_as_the_gpus_free() -> None:
    sim = started(2.0)
    state = sim.machine.state
    assert [state.jobs[j].state for j in ("j0", "j1", "j2")] == [
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.QUEUED,
    ]
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    result = forecast(live, NO_PREEMPTION, time.perf_counter)
    j0, j1, j2 = (result[j] for j in ("j0", "j1", "j2"))
    assert j0.start_p50 is None and j0.finish_p50 is not None  # it runs: only its end is forecast
    assert j1.start_p50 is not None and j2.start_p50 is not None and j1.finish_p50 is not None
    assert j1.start_p50 == j0.finish_p50  # the GPUs it needs free at that job's end, and a plan follows
    assert j2.start_p50 == j1.finish_p50
    assert j1.start_p10 == j1.start_p50 == j1.start_p90  # one exact future: no spread
    # with preemption (the default), j1's latency ratio overtakes the running j0's at a round
    preempting = forecast(live, EXACT, time.perf_counter)
    start = preempting["j1"].start_p50
    assert start is not None and start < j0.finish_p50 and (start - live.next_round) % live.round_s == 0


def test_the_forecast_is_close_to_what_then_happens() -> None:
    # the running job has reported its throughput a few times by then; no preemption in truth nor forecast
    sim = started(1000.0, keep_bonus=float("inf"))
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    result = forecast(live, NO_PREEMPTION, time.perf_counter)
    sim.advance()  # the same simulation on, at the world's true rates (the forecast knew estimates)
    # j1 waits for j0, whose rate the estimator has measured: its start is forecast closely. (j2 waits
    # for j1 too, which never ran: its forecast carries the estimator's error of an unmeasured job.)
    actual = sim.jobs["j1"].first_start
    predicted = result["j1"].start_p50
    assert actual is not None and predicted is not None
    wait, forecast_wait = actual - live.now, predicted - live.now
    assert abs(forecast_wait - wait) / wait < 0.05, (wait, forecast_wait)


def test_a_running_job_goes_on_from_its_last_progress_report_not_its_last_observation() -> None:
    # the master observes a running attempt's throughput at most every observe_every_s, but counts its
    # progress at every report: the progress since the last observation is in done_samples already
    sim = started(1000.0, keep_bonus=float("inf"))
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    (attempt,) = [a for a in live.attempts if a.job_id == "j0"]
    job = next(j for j in live.jobs if j.id == "j0")
    assert attempt.started is not None and job.done_samples > 0
    attempt.last_observed = attempt.started  # observed long ago; progress reported just now
    attempt.progressed_at = live.now
    servers = {s.id: s for s in live.servers}
    rate = Estimator.from_state(live.estimator).config_rate(job.spec, attempt.placement, servers)
    assert rate is not None
    finish = forecast(live, NO_PREEMPTION, time.perf_counter)["j0"].finish_p50
    expected = live.now + (job.spec.total_samples - job.done_samples) / rate
    assert finish == pytest.approx(expected, rel=1e-6)


def test_an_attempt_restored_from_the_store_goes_on_from_the_restore() -> None:
    # after a master restart the job's done_samples come from the store; a forecast made before the
    # node's first heartbeat must not add the attempt's whole run time to them again
    sim = started(1000.0, keep_bonus=float("inf"))
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    (attempt,) = [a for a in live.attempts if a.job_id == "j0"]
    job = next(j for j in live.jobs if j.id == "j0")
    row = {
        "id": attempt.id, "job_id": "j0", "placement": attempt.placement.as_dict(), "profiling": 0,
        "created": attempt.created, "devices": {}, "resume": 0, "started": attempt.started, "stopping": 0,
    }  # fmt: skip
    restored = load_attempt(row, live.now)
    assert restored.progressed_at == live.now and restored.last_observed == -math.inf
    live = replace(live, attempts=tuple(restored if a is attempt else a for a in live.attempts))
    servers = {s.id: s for s in live.servers}
    rate = Estimator.from_state(live.estimator).config_rate(job.spec, attempt.placement, servers)
    assert rate is not None
    finish = forecast(live, NO_PREEMPTION, time.perf_counter)["j0"].finish_p50
    assert finish == pytest.approx(live.now + (job.spec.total_samples - job.done_samples) / rate, rel=1e-6)


def test_a_job_not_yet_profiled_arrives_in_the_futures_when_its_profiling_would_end() -> None:
    # live, it is profiled first, about as long as the latest jobs' profiling took
    # (LiveState.profiling_left); in the futures it arrives then, its wait counted from its submission,
    # and takes no GPUs before: the job behind it may take them meanwhile
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    assert live.profiling_waits == ()  # no profiling run in this simulation
    pending = tuple(
        replace(j, state=JobState.PENDING, submitted=live.now, state_since=live.now) if j.id == "j1" else j
        for j in live.jobs
    )
    plain = forecast(replace(live, jobs=pending), NO_PREEMPTION, time.perf_counter)
    start = plain["j1"].start_p50  # when the running j0 ends
    assert start is not None and plain["j2"].start_p50 == plain["j1"].finish_p50  # j2 after j1
    ready = start + 3600.0  # its profiling would end an hour after the GPUs free
    took = ready - live.now  # the median of the latest profiling times
    held = forecast(
        replace(live, jobs=pending, profiling_waits=(took - 600.0, took, took + 600.0)),
        NO_PREEMPTION,
        time.perf_counter,
    )
    j1, j2 = held["j1"], held["j2"]
    assert j2.start_p50 == pytest.approx(start)  # j2 takes the GPUs j1 is not ready for
    assert j1.start_p50 is not None and j2.finish_p50 is not None
    assert j1.start_p50 == pytest.approx(max(ready, j2.finish_p50))  # then j1, no preemption here

    def profiling_since(ago: float) -> tuple[Job, ...]:
        return tuple(
            replace(j, state=JobState.PROFILING, state_since=live.now - ago) if j.id == "j1" else j
            for j in live.jobs
        )

    # a job profiling for a while arrives after what the runs that took longer still took beyond its
    # time so far: after an hour, the median of took + 600 - 3600 and took + 1200 - 3600 (the 600-s run
    # is left out)
    waits = (600.0, took + 600.0, took + 1200.0)
    begun = forecast(
        replace(live, jobs=profiling_since(3600.0), profiling_waits=waits), NO_PREEMPTION, time.perf_counter
    )
    b1, b2 = begun["j1"], begun["j2"]
    assert b1.start_p50 is not None and b2.finish_p50 is not None
    assert b2.start_p50 == pytest.approx(start)
    assert b1.start_p50 == pytest.approx(max(live.now + took - 2700.0, b2.finish_p50))
    # one profiling for longer than any run known arrives at once, as one whose run would have ended
    overdue = forecast(
        replace(live, jobs=profiling_since(took + 2000.0), profiling_waits=waits),
        NO_PREEMPTION,
        time.perf_counter,
    )
    assert overdue["j1"].start_p50 == start
    early = forecast(replace(live, jobs=pending, profiling_waits=(1.0,)), NO_PREEMPTION, time.perf_counter)
    assert early["j1"].start_p50 == start and early["j2"].start_p50 == plain["j2"].start_p50


def test_a_held_job_keeps_its_submission_time_in_the_future() -> None:
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    pending = tuple(
        replace(j, state=JobState.PENDING, state_since=live.now) if j.id == "j1" else j for j in live.jobs
    )
    submitted = next(j.submitted for j in pending if j.id == "j1")
    assert submitted < live.now
    held = replace(live, jobs=pending, profiling_waits=(500.0,))
    future = Future(held, 0, GREEDY, Estimator.from_state(held.estimator))
    assert future.held == {"j1": live.now + 500.0} and "j1" not in future.machine.state.jobs
    future.feed(RoundTick("future-fragment", "fragment"))
    future.advance(until=lambda: "j1" in future.machine.state.jobs)
    assert future.now == pytest.approx(live.now + 500.0)
    assert future.machine.state.jobs["j1"].submitted == submitted  # its wait counts from then, as live


def test_profiling_left_is_what_the_longer_runs_took_beyond_the_time_already_taken() -> None:
    live = capture(started(2.0).machine, 2.0)
    assert replace(live, profiling_waits=()).profiling_left(0.0) == 0.0
    runs = replace(live, profiling_waits=(60.0, 90.0, 120.0, 600.0))
    assert runs.profiling_left(0.0) == 105.0  # the median of all
    assert runs.profiling_left(100.0) == 260.0  # of 20 and 500
    assert runs.profiling_left(600.0) == 0.0


def test_the_forecast_modules_are_pure() -> None:
    import hopsmgr.forecast

    folder = Path(hopsmgr.forecast.__file__).resolve().parent
    for path in sorted(folder.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert not imported_roots(source) & BANNED, path.name
        assert clock_reads(source) == [], path.name


def test_queue_shows_the_forecast_as_waits_from_when_it_was_made_and_explain_from_now() -> None:
    from hopsmgr.cli.render import explain_text, queue_table

    made = 1_000_000.0
    fc = {
        "start_p10": made + 60,
        "start_p50": made + 300,
        "start_p90": made + 720,
        "futures": 8,
        "made": made,
    }
    fc |= {"finish_p10": made + 4000, "finish_p50": made + 5400, "finish_p90": None}
    job = {"id": "j-000001", "state": "QUEUED", "gpus": [1], "position": 1, "forecast": fc}
    row = queue_table([job]).splitlines()[1]
    assert "5m00s/12m00s" in row
    text = explain_text({"id": "j-000001", "forecast": fc})
    assert "forecast start:" in text and "8 sampled futures" in text

    # explain says when it was made (a forecast is renewed only while jobs wait) and counts its waits
    # from now: a forecast made a round ago must not read as current
    def shifted(made_at: float) -> dict[str, Any]:  # the same forecast, made at `made_at`
        return {k: (v - made + made_at if k != "futures" and v is not None else v) for k, v in fc.items()}

    recent = shifted(time.time() - 125.0)
    line = explain_text({"id": "j", "forecast": recent})
    assert re.search(r"in 2m5[45]s \(P10 0s, P90 9m5[45]s; 8 sampled futures, made 2m0[56]s ago\)", line), (
        line
    )
    passed = shifted(time.time() - 400.0)  # its P50 (300 s after it was made) is past
    assert re.search(
        r"made 6m4[01]s ago; its P50 passed 1m4[01]s ago\)", explain_text({"id": "j", "forecast": passed})
    )
    assert queue_table([{**job, "forecast": None}]).splitlines()[1].count("-") >= 1


def test_the_horizon_counts_from_now_and_a_start_past_it_is_not_before_it() -> None:
    # the engine counts its horizon from the last arrival; a forecast made long after the last
    # submission (no arrivals drawn) looks as far ahead from now all the same
    sim = started(1000.0, keep_bonus=float("inf"))
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    assert max(j.submitted for j in live.jobs) <= 2.0 < live.now - 900.0
    whole = forecast(live, NO_PREEMPTION, time.perf_counter)
    j0_end, j1_start = whole["j0"].finish_p50, whole["j1"].start_p50
    assert j0_end is not None and j1_start is not None and j1_start >= live.now + 600.0
    horizon_s = j1_start - live.now + 300.0  # j1 starts 300 s before the horizon, j2 after it
    short = replace(NO_PREEMPTION, future=replace(NO_PREEMPTION.future, horizon_s=horizon_s))
    result = forecast(live, short, time.perf_counter)
    assert result["j1"].start_p50 == pytest.approx(j1_start)  # (was none: the horizon ended ~998 s early)
    j2 = result["j2"]
    assert j2.start_p10 is None and j2.start_p50 is None and j2.horizon == live.now + horizon_s
    assert whole["j2"].start_p50 is not None and whole["j2"].start_p50 > live.now + horizon_s
    assert j2.as_dict()["horizon"] == live.now + horizon_s
    # the share of the futures that started each waiting job within the horizon (none for j2, every
    # one for j1), and none for a job that no longer waits
    assert j2.start_within == 0.0 and result["j1"].start_within == 1.0
    assert result["j0"].start_within is None and j2.as_dict()["start_within"] == 0.0


def test_a_job_waiting_for_a_held_job_arrives_after_it_and_starts_after_it_ends() -> None:
    # j1 has profiled for 100 s (held 260 s more: the median of 20 and 500), j2 waits for it
    # (`after`) and would be held only 105 s: it arrives just after j1, so the machine sees it wait
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)

    def waiting(job: Job) -> Job:
        if job.id == "j1":
            return replace(job, state=JobState.PROFILING, state_since=live.now - 100.0)
        spec = replace(job.spec, after=("j1",))
        return replace(job, state=JobState.PENDING, state_since=live.now, spec=spec)

    jobs = tuple(waiting(j) for j in live.jobs if j.id != "j0")  # the GPUs are free
    held = replace(live, jobs=jobs, attempts=(), profiling_waits=(60.0, 90.0, 120.0, 600.0))
    future = Future(held, 0, GREEDY, Estimator.from_state(held.estimator))
    assert future.held == {"j1": live.now + 260.0, "j2": live.now + 260.0 + 1e-3}
    result = forecast(held, NO_PREEMPTION, time.perf_counter)
    j1, j2 = result["j1"], result["j2"]
    assert j1.start_p50 == pytest.approx(live.now + 260.0)
    assert j2.start_p50 is not None and j1.finish_p50 is not None and j2.start_p50 >= j1.finish_p50


def test_a_held_job_arrives_with_the_profiles_it_has_not_one_types_on_every_type() -> None:
    # profiled on the rtx3090 only so far: it arrives with that profile alone (the other type's rate
    # stays the transfer prior's), not with the rtx3090 profile put on the gtx1080ti too
    two = parse_cluster_config(
        {
            "cluster": {"name": "two"},
            "servers": [
                {"id": "r", "gpu_type": "rtx3090", "gpus": 4, "host_model": "a"},
                {"id": "g", "gpu_type": "gtx1080ti", "gpus": 4, "host_model": "a"},
            ],
            "tenants": [{"name": "t"}],
            "scheduler": {"round_seconds": 300},
        }
    )
    sim = Simulation(
        paper_world(seed=1),
        two.servers,
        workload(),
        ForecastPolicy(two.scheduler),
        SimOptions(profiling=False, seed=1),
        time.perf_counter,
        tenants=two.tenant_map(),
    )
    sim.advance(until=lambda: sim.now >= 2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    state = dict(live.estimator)
    state["profiles"] = [
        p for p in state["profiles"] if not (p["job"] == "j2" and p["gpu_type"] == "gtx1080ti")
    ]
    jobs = tuple(
        replace(j, state=JobState.PROFILING, state_since=live.now - 10.0) if j.id == "j2" else j
        for j in live.jobs
    )
    held = replace(live, jobs=jobs, estimator=state, profiling_waits=(100.0,))
    future = Future(held, 0, GREEDY, Estimator.from_state(held.estimator))
    assert future.held == {"j2": live.now + 90.0}
    future.feed(RoundTick("future-fragment", "fragment"))
    future.advance(until=lambda: "j2" in future.machine.state.jobs)
    assert future.machine.estimator.profiled_types("j2") == {"rtx3090"}


def test_a_held_job_the_cluster_would_now_refuse_is_restored_not_submitted() -> None:
    # accepted under an older cluster file (its tenant's cap was 4 GPUs, now 2): the live machine
    # keeps it, so the futures restore it; submitting it would be refused and stop every forecast
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    jobs = tuple(
        replace(j, state=JobState.PENDING, state_since=live.now) if j.id == "j2" else j for j in live.jobs
    )
    capped = tuple(replace(t, cap_gpus=2) for t in live.tenants)
    held = replace(live, jobs=jobs, profiling_waits=(100.0,), tenants=capped)
    assert Future(held, 0, GREEDY, Estimator.from_state(held.estimator)).held == {}
    result = forecast(held, NO_PREEMPTION, time.perf_counter)
    assert result["j2"].start_p50 is None  # as the live planner: it never fits the cap
