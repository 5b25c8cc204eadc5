"""Forecasts run the scheduler state machine forward from a captured state (hopsmgr.forecast).

The state comes from a simulation that has run for a while (real machine, real estimator, the paper
world as ground truth); the forecast is checked against the same simulation run on, and for its own
consistency: a queued job starts when GPUs free, sampled futures spread with the rates' error and not
without it, the captured state is not changed, the forecast is the same for the same seed, and the
forecast modules stay pure (no clock, no I/O)."""

from __future__ import annotations

import copy
import itertools
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
from hopsmgr.core.model import RequirementSet
from hopsmgr.core.plan import Plan, SolverStats
from hopsmgr.forecast.future import Future, FutureOptions
from hopsmgr.forecast.live import LiveState, capture
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.master.state import load_attempt
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob
from tests.unit.test_core_purity import BANNED, clock_reads, imported_roots

CLUSTER = parse_cluster_config(
    {
        "cluster": {"name": "one"},
        "servers": [{"id": "s1", "gpu_type": "rtx3090", "gpus": 4, "host_model": "a"}],
        "tenants": [{"name": "t"}],
        "scheduler": {"round_seconds": 300},
    }
)
# greedy plans only (exact_s=0): most tests here check the greedy policy's futures
GREEDY = FutureOptions(sigma=0.0, arrivals=False, exact_s=0.0)
EXACT = ForecastSettings(min_futures=1, max_futures=1, future=GREEDY)
NO_PREEMPTION = replace(EXACT, future=replace(EXACT.future, keep_bonus=float("inf")))


def workload() -> list[WorkloadJob]:
    world = paper_world(seed=1)
    model = world.models()[0].name
    return [
        WorkloadJob(f"j{i}", float(i), model, RequirementSet.of([4]), 4 * 64 * (40_000 + 20_000 * i), 64, "t")
        for i in range(3)
    ]


def started(until_s: float, keep_bonus: float = 0.0) -> Simulation:
    """The simulation with every job arrived, run to `until_s` (the first job runs, two wait)."""
    world = paper_world(seed=1)
    sim = Simulation(
        world,
        CLUSTER.servers,
        workload(),
        ForecastPolicy(CLUSTER.scheduler, keep_bonus=keep_bonus),
        SimOptions(profiling=False, seed=1),
        time.perf_counter,
        tenants=CLUSTER.tenant_map(),
    )
    sim.advance(until=lambda: sim.now >= until_s)
    return sim


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


def test_sampled_rate_errors_spread_the_forecast_and_seeds_repeat_it() -> None:
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    before = copy.deepcopy(live)
    # without preemption j2 starts when the jobs ahead end, which the rate errors move
    no_preemption = replace(GREEDY, sigma=0.3, keep_bonus=float("inf"))
    noisy = ForecastSettings(min_futures=12, max_futures=12, limit_s=math.inf, future=no_preemption)
    first = forecast(live, noisy, time.perf_counter)
    again = forecast(live, noisy, time.perf_counter)
    j2 = first["j2"]
    assert j2.futures == 12
    assert j2.start_p10 is not None and j2.start_p90 is not None and j2.start_p10 < j2.start_p90
    assert first == again  # same seeds, same futures
    assert forecast(live, replace(noisy, seed=99), time.perf_counter)["j2"] != j2
    assert live == before  # a forecast works on copies: the captured state is not changed


def test_arrivals_come_at_the_recent_rate_and_only_slow_the_queue() -> None:
    sim = started(2.0)
    quiet = capture(sim.machine, sim.now, next_round=sim.next_round)
    busy = replace(quiet, recent=tuple(float(t) for t in range(0, 3600, 60)), window_s=3600.0)
    settings = ForecastSettings(
        min_futures=4, max_futures=4, limit_s=math.inf, future=replace(GREEDY, arrivals=True)
    )
    alone = forecast(quiet, settings, time.perf_counter)["j2"]
    crowded = forecast(busy, settings, time.perf_counter)["j2"]
    assert alone.start_p50 is not None and crowded.start_p50 is not None
    assert crowded.start_p50 >= alone.start_p50


def _futures_taking(monkeypatch: pytest.MonkeyPatch, seconds: float) -> tuple[LiveState, list[float]]:
    """A live state, and a clock that each future moves on by `seconds` (the forecast's timer)."""
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    clock = [0.0]
    real_go = Future.go

    def go(self: Future, only: str | None = None) -> None:
        real_go(self, only)
        clock[0] += seconds

    monkeypatch.setattr(Future, "go", go)
    return live, clock


def test_a_forecast_begins_a_future_only_if_it_is_expected_to_end_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live, clock = _futures_taking(monkeypatch, 1.0)
    runs = {}
    for budget in (0.5, 2.5, 3.0, 4.9):
        settings = ForecastSettings(budget_s=budget, min_futures=2, max_futures=50)
        clock[0] = 0.0
        runs[budget] = forecast(live, settings, lambda: clock[0])["j2"].futures
        assert clock[0] <= max(budget, 2.0)  # never past the budget, but for the two it must run
    assert runs == {0.5: 2, 2.5: 2, 3.0: 3, 4.9: 4}


@pytest.mark.parametrize("field", ["budget_s", "limit_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_forecast_settings_refuse_a_time_that_is_no_bound(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a number > 0, got {value!r}"):
        ForecastSettings(**{field: value})
    assert getattr(ForecastSettings(**{field: math.inf}), field) == math.inf  # no bound, said so


def test_the_minimum_of_futures_yields_to_the_hard_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # each future "takes" 2 s: the third of the three asked for would end at 6 s, past the 5-s limit;
    # the first is begun whatever it takes
    live, clock = _futures_taking(monkeypatch, 2.0)
    for limit, expected in ((5.0, 2), (6.0, 3), (1.0, 1)):
        clock[0] = 0.0
        settings = ForecastSettings(budget_s=1.0, min_futures=3, max_futures=50, limit_s=limit)
        assert forecast(live, settings, lambda: clock[0])["j2"].futures == expected
        assert clock[0] <= max(limit, 2.0)


def test_futures_plan_with_the_hops_planner_while_its_allowance_holds_another_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = started(2.0)
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    clock = [0.0]
    real_plan = HopsPolicy.plan
    limits: list[float] = []

    def plan(self: HopsPolicy, *args: Any) -> Any:
        limits.append(self.settings.time_limit_s)
        clock[0] += 0.1  # each of the planner's plans "takes" 0.1 s
        return real_plan(self, *args)

    monkeypatch.setattr(HopsPolicy, "plan", plan)

    def future(exact_s: float) -> Future:
        options = replace(GREEDY, exact_s=exact_s)
        f = Future(live, 0, options, Estimator.from_state(live.estimator), lambda: clock[0])
        f.go()
        assert not f.open  # every job ran to its end
        return f

    greedy = future(0.0)
    assert isinstance(greedy.policy, ForecastPolicy) and greedy.policy.exact_made == 0 and not limits
    exact = future(0.25)
    # a plan is begun only while what is left (0.25, 0.15, 0.05) is at least what the last took (0.1)
    assert isinstance(exact.policy, ForecastPolicy) and exact.policy.exact_made == 2
    # each solve within what is left of the allowance (and never past the master's own limit)
    assert limits == pytest.approx([0.25, 0.15])
    assert {"j1", "j2"} <= set(exact.started) & set(greedy.started)  # both started the waiting jobs

    # a plan the planner could not finish in time (a fallback that places nothing) is not used: the
    # greedy plan takes its place, and the rest of that future plans greedily
    late_calls: list[float] = []

    def late(self: HopsPolicy, snapshot: Any, *args: Any) -> Plan:
        late_calls.append(snapshot.now)
        clock[0] += 0.01
        return Plan("first", snapshot.now, {}, stats=SolverStats(method="none", fallback="deadline"))

    monkeypatch.setattr(HopsPolicy, "plan", late)
    fell_back = future(10.0)
    assert isinstance(fell_back.policy, ForecastPolicy) and fell_back.policy.exact_made == 1
    assert fell_back.started == greedy.started  # as if it had planned greedily from the start
    assert fell_back.planner_fell_back and not greedy.planner_fell_back
    # and a forecast's later futures do not ask the planner again
    late_calls.clear()
    three = replace(EXACT, min_futures=3, max_futures=3, future=replace(GREEDY, exact_s=10.0))
    assert forecast(live, three, lambda: clock[0])["j2"].futures == 3
    assert len(late_calls) == 1  # the first future's first plan only


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


def test_futures_hold_fragment_plans_to_their_gap() -> None:
    world = paper_world(seed=1)
    model = world.models()[0].name
    many = [
        WorkloadJob(f"s{i}", 10.0 * i, model, RequirementSet.of([1]), 64 * (2_000 + 500 * i), 64, "t")
        for i in range(12)
    ]

    def fragments(gap: float) -> list[float]:
        sim = Simulation(
            world,
            CLUSTER.servers,
            many,
            ForecastPolicy(CLUSTER.scheduler),
            SimOptions(profiling=False, seed=1, fragment_gap_s=gap),
            time.perf_counter,
            tenants=CLUSTER.tenant_map(),
        )
        sim.advance()
        assert all(sim.jobs[w.job_id].first_start is not None for w in many)  # every job still ran
        rounds = {t for kind, t in sim.plans if kind == "first"}  # a round's own fragment plan is not held
        return [t for kind, t in sim.plans if kind == "fragment" and t not in rounds]

    eager, held = fragments(0.0), fragments(120.0)
    assert len(held) < len(eager)
    assert all(b - a >= 120.0 - 1e-6 for a, b in itertools.pairwise(held))


def test_futures_space_their_rounds_out_as_they_go_on() -> None:
    world = paper_world(seed=1)
    model = world.models()[0].name
    long = [
        WorkloadJob(f"l{i}", 10.0 * i, model, RequirementSet.of([2]), 64 * 400_000, 64, "t") for i in range(6)
    ]

    def rounds(growth: float) -> tuple[list[float], Simulation]:
        sim = Simulation(
            world,
            CLUSTER.servers,
            long,
            ForecastPolicy(CLUSTER.scheduler),
            SimOptions(profiling=False, seed=1, round_growth=growth),
            time.perf_counter,
            tenants=CLUSTER.tenant_map(),
        )
        sim.advance()
        return sorted({t for kind, t in sim.plans if kind == "first"}), sim

    fixed, plain = rounds(0.0)
    grown, spaced = rounds(0.2)
    round_s = CLUSTER.scheduler.round_seconds
    assert all(b - a >= round_s - 1e-6 for a, b in itertools.pairwise(fixed))
    assert len(grown) < len(fixed) / 3
    start = grown[0]
    assert all(b - a >= max(round_s, 0.2 * (a - start)) - 1e-6 for a, b in itertools.pairwise(grown))
    # every job still ran; each started at most a round gap (20% of the elapsed time) later
    for w in long:
        first, later = plain.jobs[w.job_id].first_start, spaced.jobs[w.job_id].first_start
        assert first is not None and later is not None
        assert first - 1e-6 <= later <= first + max(round_s, 0.2 * (later - start)) + 1e-6


def test_a_job_placed_on_a_type_it_was_never_profiled_on_runs_there_in_the_futures() -> None:
    """The planner places a queued job on a GPU type it has no profile on through the transfer prior
    (hopsmgr.core.transfer); the futures' world runs it there at that rate, not at none (which left
    the job running forever in every future, with no finish forecast)."""
    from random import Random

    from hopsmgr.core.estimator import TimeProfile
    from hopsmgr.core.model import Calibration, JobSpec, Server
    from hopsmgr.core.transfer import with_transfer
    from hopsmgr.forecast.world import EstimatedWorld
    from hopsmgr.sim.simstate import job_key

    fast, slow = Server("v1", "v100", 2), Server("k1", "k80", 2)
    estimator = Estimator()
    both = TimeProfile(tf_s=0.02, tb_s=0.04, tu_s=0.005, td_hit_s=0.001, td_miss_s=0.001)
    for job_id in ("old-1", "old-2"):  # profiled on both types: the types' ratio
        estimator.add_profile(job_id, "v100", both, Calibration())
        estimator.add_profile(job_id, "k80", replace(both, tf_s=0.06, tb_s=0.12), Calibration())
    spec = JobSpec("new", RequirementSet.of([1]), 1e6, 32)
    estimator.add_profile("new", "k80", replace(both, tf_s=0.06, tb_s=0.12), Calibration())
    world = EstimatedWorld(estimator, {"new": spec}, {"new": spec}, (fast, slow), Random(0), 0.0)
    prior = with_transfer(estimator).per_gpu_rate(spec, fast, 1)
    assert prior is not None and prior > 0
    on_fast = world.true_rate("new", [(fast, 1)], job_key("new"))
    on_slow = world.true_rate("new", [(slow, 1)], job_key("new"))
    assert on_fast == pytest.approx(prior) and on_fast > on_slow > 0


def test_futures_draw_new_jobs_from_recent_submissions_ended_ones_included() -> None:
    """Live jobs alone are a survivor's sample (short jobs end, long ones stay): a future's new jobs
    copy the jobs submitted within the window, the completed ones kept by the machine included, each
    standing for its share of the window's ended submissions."""
    sim = started(0.0)
    sim.advance(until=lambda: sim.jobs["j0"].final is not None)  # j0 completed: j1 runs, j2 waits
    assert list(sim.machine.submissions) == [0.0, 1.0, 2.0]  # the master's arrival process
    ended = list(sim.machine.recently_ended)
    assert [e.spec.id for e in ended] == ["j0"] and {t for t, _ in ended[0].profiles} == {"rtx3090"}
    live = capture(sim.machine, sim.now, next_round=sim.next_round)
    assert [e.spec.id for e in live.ended] == ["j0"]
    options = replace(GREEDY, arrivals=True)

    def copied(state: Any) -> dict[str, float]:
        drawn: list[str] = []
        for seed in range(1000):  # the futures' new jobs (each future draws a dozen or so)
            future = Future(state, seed, options, Estimator.from_state(state.estimator))
            drawn += [j.w.model for j in future.order if j.w.job_id.startswith("f-")]
            if len(drawn) >= 2000:
                return {m: drawn.count(m) / len(drawn) for m in set(drawn)}
        raise AssertionError(f"the futures drew {len(drawn)} new jobs")

    # the window holds the three submissions: j0 (ended), j1 and j2 (live), a third each
    window = replace(live, recent=(0.0, 1.0, 2.0), window_s=sim.now + 1.0)
    shares = copied(window)
    assert set(shares) == {"j0", "j1", "j2"} and all(0.28 < s < 0.39 for s in shares.values()), shares
    # 58 submissions ended within the window, j0 the one kept: it stands for all 58
    many = replace(window, recent=(0.0, 1.0, 2.0, *(3.0 + i for i in range(55))))
    assert copied(many)["j0"] > 0.93
    # two kept: they share the ended submission's third; one submitted before the window: left out
    twin = replace(ended[0], spec=replace(ended[0].spec, id="j0-twin"))
    old = replace(ended[0], spec=replace(ended[0].spec, id="j0-old"), submitted=-10.0)
    shares = copied(replace(window, ended=(ended[0], twin, old)))
    assert set(shares) == {"j0", "j0-twin", "j1", "j2"}, shares
    assert 0.12 < shares["j0"] < 0.22 and 0.12 < shares["j0-twin"] < 0.22 and shares["j1"] > 0.28, shares
    # none kept (a master just restarted): the live jobs, as before
    assert set(copied(replace(window, ended=()))) == {"j1", "j2"}


def test_the_arrival_window_is_cut_to_when_submissions_began_to_be_noted() -> None:
    """Submissions noted for an hour and a half, spread over a six-hour window, would be a quarter of
    the rate: the window is cut to when noting began (not below an hour: a few submissions over
    minutes would give a rate as wrong the other way). The master cuts it at its forecaster's start,
    bench/forecast.py at the replay's."""
    sim = started(2.0)
    now = 20_000.0
    recent = tuple(now - 5400.0 + 60.0 * k for k in range(90))  # one a minute for an hour and a half

    def window(since: float | None) -> float:
        return capture(sim.machine, now, recent, next_round=now, observed_since=since).window_s

    assert window(None) == 6 * 3600.0
    assert window(now - 5400.0) == 5400.0
    assert window(now - 600.0) == 3600.0
    assert window(now - 30 * 3600.0) == 6 * 3600.0
    settings = ForecastSettings(min_futures=1, max_futures=1, future=replace(GREEDY, arrivals=True))
    cut = capture(sim.machine, now, recent, next_round=now, observed_since=now - 5400.0)
    whole = capture(sim.machine, now, recent, next_round=now)
    drawn = {}
    for name, live in (("cut", cut), ("whole", whole)):
        future = Future(live, 0, settings.future, Estimator.from_state(live.estimator))
        arrivals = sorted(j.w.arrival_s for j in future.order if j.w.job_id.startswith("f-"))
        drawn[name] = sum(1 for t in arrivals if t <= now + 3600.0)  # in the next hour: ~60 and ~15
    assert drawn["cut"] > 40 and drawn["whole"] < 30, drawn


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
