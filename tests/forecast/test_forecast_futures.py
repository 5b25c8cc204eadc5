"""The futures a forecast samples (hopsmgr.forecast): how they are drawn, timed and simulated.

From the state of a simulation that has run for a while (tests/forecast/_forecast_helpers.py): sampled
futures spread with the rates' error and not without it, the captured state is not changed, and the
forecast is the same for the same seed; new jobs arrive at the recent rate, copied from the window's
submissions (the ended ones included), over a window cut to when submissions began to be noted; a forecast
begins a future only if it would end within the budget, and never past the hard limit; the futures plan
with the Hops planner while its allowance holds, hold fragment plans to their gap, space their rounds out,
and run a job on a GPU type it was never profiled on at the transfer prior's rate."""

from __future__ import annotations

import copy
import itertools
import math
import time
from dataclasses import replace
from typing import Any

import pytest

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import RequirementSet
from hopsmgr.core.plan import Plan, SolverStats
from hopsmgr.forecast.future import Future
from hopsmgr.forecast.live import LiveState, capture
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob
from tests.forecast._forecast_helpers import CLUSTER, EXACT, GREEDY, started


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
