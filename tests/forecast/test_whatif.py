"""What-if forecasts in the pure core (hopsmgr.forecast.whatif): a job not submitted yet, a waiting
job with other GPU counts, and futures that stop once the one job asked about has ended."""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Any

import pytest

from hopsmgr.control.records import EndedJob
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import JobSpec, RequirementSet
from hopsmgr.forecast.future import Future
from hopsmgr.forecast.live import LiveState, capture
from hopsmgr.forecast.run import forecast
from hopsmgr.forecast.whatif import (
    WHAT_IF_ID,
    NotWaiting,
    forecast_job,
    with_new_job,
    with_requirements,
)
from tests.forecast._forecast_helpers import EXACT, NO_PREEMPTION, started


def live_state() -> LiveState:
    sim = started(2.0)  # j0 runs on the four GPUs; j1 and j2 wait
    return capture(sim.machine, sim.now, next_round=sim.next_round)


def spec_like(live: LiveState, job_id: str, **changes: Any) -> JobSpec:
    found = next(j for j in live.jobs if j.id == job_id)
    return replace(found.spec, id="j-new", **changes)


def test_a_job_not_submitted_is_forecast_in_hops_order_and_nothing_live_changes() -> None:
    live = live_state()
    before = copy.deepcopy(live)
    queue = forecast(live, NO_PREEMPTION, time.perf_counter)
    # as long as the longest waiting job: submitted last, it starts after every job waiting
    long = forecast_job(
        with_new_job(live, spec_like(live, "j2")), WHAT_IF_ID, time.perf_counter, NO_PREEMPTION
    )
    assert long is not None and long.start_p50 is not None and long.finish_p50 is not None
    assert long.start_p50 == queue["j2"].finish_p50 and long.finish_p50 > long.start_p50
    # as short as the running job: its latency ratio grows fastest, so it goes first when GPUs free
    short = forecast_job(
        with_new_job(live, spec_like(live, "j0")), WHAT_IF_ID, time.perf_counter, NO_PREEMPTION
    )
    assert short is not None and short.start_p50 == queue["j0"].finish_p50
    assert live == before  # the what-ifs worked on copies
    assert long.made == short.made == live.now


def test_a_what_if_job_borrows_the_profile_of_a_job_alike() -> None:
    live = live_state()
    new = with_new_job(live, spec_like(live, "j0", model="", name="nothing-alike", user="someone-else"))
    assert forecast_job(new, WHAT_IF_ID, time.perf_counter, EXACT) is not None
    # with no profiled job at all there is nothing to take its speed from: no forecast
    empty = replace(live, jobs=(), attempts=(), estimator=Estimator().export_state())
    lone = with_new_job(empty, spec_like(live, "j0"))
    assert forecast_job(lone, WHAT_IF_ID, time.perf_counter, EXACT) is None
    # an idle cluster whose jobs completed lately: the latest alike lends its kept profiles
    estimator = Estimator.from_state(live.estimator)
    j0 = next(j for j in live.jobs if j.id == "j0")
    kept = EndedJob.of(j0, estimator)
    assert kept is not None
    idle = with_new_job(replace(empty, ended=(kept,)), spec_like(live, "j0"))
    after = forecast_job(idle, WHAT_IF_ID, time.perf_counter, EXACT)
    assert after is not None and after.start_p50 is not None and after.finish_p50 is not None


def test_other_gpu_counts_change_only_that_jobs_requirements() -> None:
    live = live_state()
    halved = with_requirements(live, "j2", RequirementSet.of([2]))
    changed = {j.id: j.spec for j in halved.jobs}
    assert changed["j2"].requirements.counts == (2,)
    assert {j: s for j, s in changed.items() if j != "j2"} == {
        j.id: j.spec for j in live.jobs if j.id != "j2"
    }
    four = forecast_job(live, "j2", time.perf_counter, NO_PREEMPTION)
    two = forecast_job(halved, "j2", time.perf_counter, NO_PREEMPTION)
    assert four is not None and two is not None
    assert four.start_p50 is not None and four.finish_p50 is not None
    assert two.start_p50 is not None and two.finish_p50 is not None
    # the same work on half the GPUs takes longer once it runs
    assert two.finish_p50 - two.start_p50 > four.finish_p50 - four.start_p50
    with pytest.raises(NotWaiting):
        with_requirements(live, "j0", RequirementSet.of([2]))  # it runs
    with pytest.raises(KeyError):
        with_requirements(live, "nope", RequirementSet.of([2]))


def test_a_future_asked_about_one_job_stops_once_it_ended() -> None:
    live = live_state()
    everything = Future(live, 0, EXACT.future, Estimator.from_state(live.estimator))
    everything.go()
    only = Future(live, 0, EXACT.future, Estimator.from_state(live.estimator))
    only.go("j1")
    assert only.finished["j1"] == everything.finished["j1"]  # the same future, cut short
    assert "j2" in everything.finished and "j2" not in only.finished
    one = forecast_job(live, "j1", time.perf_counter, EXACT)
    assert one is not None and one.finish_p50 == everything.finished["j1"]


def test_the_profile_borrowed_is_of_the_latest_job_of_the_same_model_then_name_then_user() -> None:
    from hopsmgr.control.records import Job
    from hopsmgr.core.lifecycle import JobState
    from hopsmgr.forecast.future import _Templates

    base = live_state().jobs[0].spec

    def job(job_id: str, at: float, **spec: Any) -> Job:
        return Job(replace(base, id=job_id, **spec), JobState.QUEUED, at, at)

    profiled = [
        job("m-old", 1, model="resnet", name="a", user="ana"),
        job("m-new", 2, model="resnet", name="b", user="bo"),
        job("name", 3, model="bert", name="sweep", user="ana"),
        job("user", 4, model="gpt", name="other", user="ana"),
        job("latest", 5, model="vit", name="x", user="cy"),
    ]
    of = _Templates(profiled).of
    assert of(job("q1", 9, model="resnet", name="sweep", user="ana")).id == "m-new"  # the model first
    assert of(job("q2", 9, model="", name="sweep", user="ana")).id == "name"  # then user and name
    assert of(job("q3", 9, model="lstm", name="new", user="ana")).id == "user"  # then the user's latest
    assert of(job("q4", 9, model="lstm", name="new", user="dee")).id == "latest"  # then anyone's latest
    assert _Templates([]).of(job("q5", 9)) is None


def test_the_forecasts_greedy_plan_keeps_a_job_for_one_server_on_one() -> None:
    from hopsmgr.core.model import Calibration, ClusterSnapshot, JobView, Server
    from hopsmgr.core.settings import SchedulerSettings
    from hopsmgr.forecast.policy import ForecastPolicy

    profile = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)
    servers = (Server("a", "A", 4, Calibration(), order=0), Server("b", "A", 4, Calibration(), order=1))
    estimator = Estimator()
    estimator.add_profile("j", "A", profile, Calibration())
    for one_server, placed in ((True, {"a": 4}), (False, {"a": 4, "b": 4})):
        spec = JobSpec("j", RequirementSet.of((4, 8)), 1e7, 32, one_server=one_server)
        snap = ClusterSnapshot(servers, {"a": 4, "b": 4}, (JobView(spec, waited_s=10.0),), 100.0, {})
        plan = ForecastPolicy(SchedulerSettings(), fixed_rates=True).plan(
            snap, estimator, "first", lambda: 0.0
        )
        assert plan.assignments["j"].as_dict() == placed


def test_a_what_if_job_is_held_back_for_its_profiling_unless_it_has_no_runtime() -> None:
    # as the machine takes a submission: a job with the runtime is profiled first (the forecast holds
    # it back by the latest profiling time), one without is queued at once and not held
    live = replace(live_state(), profiling_waits=(1e6,))  # longer than any wait here: the hold shows
    profiled = with_new_job(live, spec_like(live, "j2"))
    plain = with_new_job(live, spec_like(live, "j2", runtime=False))
    assert profiled.jobs[-1].state == JobState.PENDING and plain.jobs[-1].state == JobState.QUEUED
    held = forecast_job(profiled, WHAT_IF_ID, time.perf_counter, NO_PREEMPTION)
    assert held is not None and held.start_p50 == pytest.approx(live.now + 1e6)
    queued = forecast_job(plain, WHAT_IF_ID, time.perf_counter, NO_PREEMPTION)
    assert queued is not None and queued.start_p50 is not None and queued.start_p50 < live.now + 1e6
    # held past the futures' 14-day horizon: not within it, and no future runs past it
    later = with_new_job(replace(live, profiling_waits=(1e7,)), spec_like(live, "j2"))
    beyond = forecast_job(later, WHAT_IF_ID, time.perf_counter, NO_PREEMPTION)
    assert beyond is not None and beyond.start_p50 is None and beyond.horizon == live.now + 14 * 86400
