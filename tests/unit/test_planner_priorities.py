"""Unit tests of hopsmgr.core.planner on hand-built rounds: the priorities that order the queue and decide
preemptions.

A preemption must pay for the victim's checkpoint and restart; the projected latency ratio and the
srtf_lr guard count what a preemption would add; the critical path lifts the running job that sets the
backlog's makespan (weighed by its tenant; never a queued job); gain_base sets the rate that a
configuration's value is divided by. CBC is called through PuLP on tiny snapshots
(tests/unit/_planner_helpers.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from hopsmgr.core.model import JobSpec, JobView, RequirementSet, Server, TenantQuota
from hopsmgr.core.planner import plan_round
from hopsmgr.core.quota import GUARANTEE_BOOST
from hopsmgr.core.settings import SchedulerSettings
from tests.unit._planner_helpers import C, profiled, snapshot, spec, srv


@pytest.mark.parametrize(
    ("preemption_cost", "wait", "kept"), [(True, 350.0, True), (False, 350.0, False), (True, 460.0, False)]
)
def test_a_preemption_must_pay_for_the_victims_checkpoint_and_restart(
    preemption_cost: bool, wait: float, kept: bool
) -> None:
    # One GPU; r runs (an old attempt), q waits 350 s. Horizon H = max(120, 0 + 2 x 60) = 120 s; r's
    # preemption would cost it c = 5 + 60 s. Projected priorities: r (0 + H + c) = 185, q (350 + H) = 470
    # (over the same age). q's launch is worth 470 x (1 - 60/120) = 235: more than r's 185, not more than
    # r's 185 x (1 + 65/120) = 285 once the cost of the preemption counts. After 460 s q's 290 pays.
    servers = [srv("a0", 1, 1.0)]
    running = JobView(spec("r", 1), current=C(a0=1), running_s=1000.0, attempt_s=1000.0)
    queued = JobView(spec("q", 1), waited_s=wait)
    settings_ = SchedulerSettings(  # the latency ratios are 0.03 apart: the cost alone decides without
        solver="exact",  # the hysteresis (which would keep r, tested below)
        gap=0.0,
        round_seconds=120.0,
        min_attempt_s=0.0,
        preemption_cost=preemption_cost,
        lr_hysteresis=0.0,
    )
    plan = plan_round(snapshot(servers, [running, queued]), profiled(running, queued), settings_)
    assert plan.assignments == ({"r": C(a0=1)} if kept else {"q": C(a0=1)})


@pytest.mark.parametrize(("projected", "first"), [(True, "r"), (False, "q")])
def test_the_projected_latency_ratio_counts_what_a_preemption_would_add(projected: bool, first: str) -> None:
    # r runs having waited 50 s; q has waited 100 s. Plain ratios: q ahead. Projected over the horizon
    # (120 s), r also counting its checkpoint and restart (65 s): r 235, q 220: r ahead.
    servers = [srv("a0", 1, 1.0)]
    running = JobView(spec("r", 1), current=C(a0=1), waited_s=50.0, running_s=500.0, attempt_s=500.0)
    queued = JobView(spec("q", 1), waited_s=100.0)
    settings_ = SchedulerSettings(
        solver="exact", round_seconds=120.0, min_attempt_s=0.0, projected_priority=projected
    )
    plan = plan_round(snapshot(servers, [running, queued]), profiled(running, queued), settings_)
    assert plan.order[0] == first


@pytest.mark.parametrize("projected", [True, False])
def test_the_srtf_lr_guard_reads_the_projected_latency_ratio(projected: bool) -> None:
    # q has waited 200 s less than its age: below the guard (1) on its plain ratio, past it once
    # projected over the horizon (min_attempt_s 300 + 2 x restart 60 = 420 s); r runs and also counts
    # what a preemption would add (its checkpoint and restart).
    from hopsmgr.core.priority import expected_run_s, remaining_run_s
    from hopsmgr.core.program import preemption_cost_s
    from hopsmgr.core.queueorder import priority_context

    servers = [srv("a0", 1, 1.0)]
    probe = JobView(spec("q", 1))
    est = profiled(probe, JobView(spec("r", 1)))
    ctx = priority_context(snapshot(servers, [probe]), est)
    age = expected_run_s(probe.spec, ctx)
    queued = JobView(spec("q", 1), waited_s=(age - 200.0))
    running = JobView(
        spec("r", 1),
        current=C(a0=1),
        waited_s=(age - 200.0),
        done_samples=5e5,
        running_s=500.0,
        attempt_s=500.0,
    )
    settings_ = SchedulerSettings(
        solver="exact", priority="srtf_lr", projected_priority=projected, lr_guard=1.0
    )
    plan = plan_round(snapshot(servers, [running, queued]), est, settings_)

    def srtf(view: JobView) -> float:
        return 1.0 / (1.0 + remaining_run_s(view, ctx) / 3600.0)

    if projected:
        ahead = 420.0
        assert plan.priorities["q"] == pytest.approx(srtf(queued) + ((age - 200.0) + ahead) / age - 1.0)
        ahead_r = ahead + preemption_cost_s(running.spec)
        assert plan.priorities["r"] == pytest.approx(srtf(running) + ((age - 200.0) + ahead_r) / age - 1.0)
    else:
        assert plan.priorities == pytest.approx({"q": srtf(queued), "r": srtf(running)})


def makespan_round(q_waited_s: float, r_tenant: str = "default") -> tuple[list[Server], list[JobView]]:
    """Two GPUs: r (10.4 h left) and x (2.6 h left) run, q (0.26 h) has waited `q_waited_s`. The
    remaining work drains in 6.6 h, so r alone sets the backlog's makespan."""

    def job(jid: str, samples: float, tenant: str = "default") -> JobSpec:
        return JobSpec(jid, RequirementSet.of((1,)), samples, 32, tenant=tenant, restart_s=0.0)

    r = JobView(job("r", 4e6, r_tenant), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    x = JobView(job("x", 1e6), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    q = JobView(job("q", 1e5), waited_s=q_waited_s)
    return [srv("a0", 2)], [r, x, q]


@pytest.mark.parametrize("critical_path", [False, True])
def test_srtf_lr_with_critical_path_keeps_the_job_that_sets_the_makespan(critical_path: bool) -> None:
    # Shortest-remaining order preempts r (the longest) for q; on the critical path r ranks as if one
    # past its guard, and x, the next longest, makes room instead.
    servers, jobs = makespan_round(60.0)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, priority="srtf_lr", critical_path=critical_path)
    plan = plan_round(snapshot(servers, jobs), profiled(*jobs), settings_)
    assert "q" in plan.assignments
    kept = "r" if critical_path else "x"
    assert set(plan.assignments) == {"q", kept}
    assert plan.assignments[kept] == C(a0=1)
    plain = plan_round(snapshot(servers, jobs), profiled(*jobs), replace(settings_, critical_path=False))
    lift = 1.0 if critical_path else 0.0  # r ranks as if one past its guard; q, queued, is never lifted
    assert plan.priorities == pytest.approx({**plain.priorities, "r": plain.priorities["r"] + lift})


@pytest.mark.parametrize("critical_path", [False, True])
def test_the_critical_path_job_ranks_high_enough_to_grow_over_shorter_ones(critical_path: bool) -> None:
    # r (2 or 4 GPUs, 20.8 h left) sets the makespan; x and y (1 GPU, 2.6 h) share the server with it
    # and nothing waits. Lifted, r's value makes 4 GPUs worth more than x and y (what shortens the
    # makespan, and what costs average JCT on a small cluster: docs/results.md).
    def job(jid: str, samples: float, *counts: int) -> JobSpec:
        return JobSpec(jid, RequirementSet.of(counts), samples, 32, restart_s=0.0)

    servers = [srv("a0", 4)]
    r = JobView(job("r", 8e6, 2, 4), current=C(a0=2), running_s=2e4, attempt_s=2e4)
    x = JobView(job("x", 1e6, 1), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    y = JobView(job("y", 1e6, 1), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, priority="srtf_lr", critical_path=critical_path)
    plan = plan_round(snapshot(servers, [r, x, y]), profiled(r, x, y), settings_)
    if critical_path:
        assert plan.assignments == {"r": C(a0=4)}
    else:
        assert plan.assignments == {"r": C(a0=2), "x": C(a0=1), "y": C(a0=1)}


def test_the_critical_path_lift_is_weighed_by_the_tenant_like_the_guard() -> None:
    # r (10.4 h left) sets the makespan; its tenant weighs 0.5: its whole value, lift included, halves
    def job(jid: str, samples: float, tenant: str = "default") -> JobSpec:
        return JobSpec(jid, RequirementSet.of((1,)), samples, 32, tenant=tenant, restart_s=0.0)

    servers = [srv("a0", 2)]
    r = JobView(job("r", 4e6, "half"), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    x = JobView(job("x", 1e6), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    tenants = {"half": TenantQuota("half", weight=0.5)}
    settings_ = SchedulerSettings(
        solver="exact", gap=0.0, priority="srtf_lr", critical_path=True, fairshare=False
    )
    lifted = plan_round(snapshot(servers, [r, x], tenants=tenants), profiled(r, x), settings_)
    plain = plan_round(
        snapshot(servers, [r, x], tenants=tenants), profiled(r, x), replace(settings_, critical_path=False)
    )
    assert lifted.priorities["r"] == pytest.approx(plain.priorities["r"] + 0.5)
    assert lifted.priorities["x"] == pytest.approx(plain.priorities["x"])


@pytest.mark.parametrize(
    ("priority", "gain_base", "divides_by"),
    [
        ("srtf_lr", "smallest", "smallest"),
        ("srtf_lr", "expected", "expected"),
        ("srtf_lr", "auto", "expected"),
        ("latency_ratio", "auto", "smallest"),
        ("latency_ratio", "expected", "expected"),
    ],
)
def test_gain_base_divides_a_configuration_rate_by_the_rate_the_expected_run_time_assumes(
    priority: str, gain_base: str, divides_by: str
) -> None:
    # e asks for 1 or 2 GPUs (R_avg 1.5) on one type: its smallest configuration runs at the per-GPU
    # rate p, its expected run time assumes 1.5 p. G = rate / p ("smallest") or rate / (1.5 p).
    from hopsmgr.core.priority import expected_run_s
    from hopsmgr.core.queueorder import priority_context

    servers = [srv("a0", 2, 1.0)]
    e = JobView(JobSpec("e", RequirementSet.of([1, 2]), 1e6, 32, restart_s=0.0))
    est = profiled(e)
    settings_ = SchedulerSettings(solver="exact", priority=priority, gain_base=gain_base)  # type: ignore[arg-type]
    plan = plan_round(snapshot(servers, [e]), est, settings_)
    ctx = priority_context(snapshot(servers, [e]), est)
    expected_rate = e.spec.total_samples / expected_run_s(e.spec, ctx)
    per_gpu = est.type_rate(e.spec, "A")
    assert per_gpu is not None and expected_rate == pytest.approx(1.5 * per_gpu)
    base = expected_rate if divides_by == "expected" else per_gpu
    weight = plan.explain["e"].weight
    candidates = {cand.config: cand.value for cand in plan.explain["e"].candidates}
    assert set(candidates) == {str(C(a0=1)), str(C(a0=2))}
    for gpus in (1, 2):
        rate = est.config_rate(e.spec, C(a0=gpus), {s.id: s for s in servers})
        assert rate is not None
        assert candidates[str(C(a0=gpus))] == pytest.approx(weight * rate / base)


def test_a_queued_job_on_the_critical_path_is_not_lifted() -> None:
    # L, queued, is the longest job (10.4 h) and alone sets the backlog's makespan; only running jobs
    # are lifted, so its value is the plain one
    def job(jid: str, samples: float) -> JobSpec:
        return JobSpec(jid, RequirementSet.of((1,)), samples, 32, restart_s=0.0)

    servers = [srv("a0", 2)]
    x = JobView(job("x", 1e5), current=C(a0=1), running_s=2e4, attempt_s=2e4)
    long_ = JobView(job("L", 4e6), waited_s=60.0)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, priority="srtf_lr", critical_path=True)
    lifted = plan_round(snapshot(servers, [x, long_]), profiled(x, long_), settings_)
    plain = plan_round(
        snapshot(servers, [x, long_]), profiled(x, long_), replace(settings_, critical_path=False)
    )
    assert lifted.priorities == pytest.approx(plain.priorities)


@pytest.mark.parametrize(("speed_value", "gets_eight"), [("priority", "s"), ("neutral", "l")])
def test_speed_above_the_expected_rate_goes_where_it_gains_the_most_per_gpu_with_speed_value_neutral(
    speed_value: str, gets_eight: str
) -> None:
    """s (short, so a high srtf_lr weight) scales worse than l (it all-reduces 200 MB); both ask for 1,
    2, 4 or 8 GPUs of the 12. Valued at each job's own weight, s takes 8 GPUs; valued at one weight above
    the rate their expected run times assume (both gain over it on 4 GPUs or 8), the 4 extra GPUs go to
    l, which gains more from them."""
    servers = [srv("a0", 12, 1.0)]
    counts = RequirementSet.of([1, 2, 4, 8])
    short = JobView(JobSpec("s", counts, 1e5, 32, restart_s=0.0, params_bytes=2e8))
    long_ = JobView(JobSpec("l", counts, 1e8, 32, restart_s=0.0))
    settings_ = SchedulerSettings(solver="exact", gap=0.0, priority="srtf_lr", speed_value=speed_value)  # type: ignore[arg-type]
    plan = plan_round(snapshot(servers, [short, long_]), profiled(short, long_), settings_)
    assert plan.explain["s"].weight > 10 * plan.explain["l"].weight
    assert plan.assignments[gets_eight] == C(a0=8)
    assert sum(config.gpus for config in plan.assignments.values()) == 12


def test_weighted_gain_values_speed_above_the_expected_rate_at_the_one_weight() -> None:
    from hopsmgr.core.program import weighted_gain

    assert weighted_gain(3.0, None, 2.0, 1.5) == 6.0  # "priority": w x G
    assert weighted_gain(3.0, 0.5, 1.0, 1.5) == 3.0  # at or below the expected rate: w x G
    assert weighted_gain(3.0, 0.5, 2.0, 1.5) == pytest.approx(3.0 * 1.5 + 0.5 * 0.5)


def test_speed_value_must_be_one_of_its_names() -> None:
    with pytest.raises(ValueError, match="speed_value"):
        SchedulerSettings(speed_value="fast")  # type: ignore[arg-type]


def test_with_the_latency_ratio_priority_speed_is_neutral_only_above_the_expected_rate() -> None:
    """The default priority divides by the smallest configuration (gain_base "smallest"), so G at the
    rate a job's expected run time assumes is E = R_avg / R1 = 3.75 here: up to it a configuration is
    worth w x G, above it w x E + w_median x (G - E). Two queued jobs that waited differently (their
    latency ratios, so their weights, differ); explanations show the estimator's rates."""
    from hopsmgr.core.priority import expected_run_s
    from hopsmgr.core.queueorder import priority_context

    servers = [srv("a0", 12, 1.0)]
    counts = RequirementSet.of([1, 2, 4, 8])
    early = JobView(JobSpec("e", counts, 1e6, 32, restart_s=0.0, submit_time=0.0), waited_s=1000.0)
    late = JobView(JobSpec("l", counts, 1e6, 32, restart_s=0.0, submit_time=900.0), waited_s=100.0)
    est = profiled(early, late)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, speed_value="neutral")
    snap = snapshot(servers, [early, late])
    plan = plan_round(snap, est, settings_)
    weights = {j: plan.explain[j].weight for j in ("e", "l")}
    assert weights["e"] > 1.5 * weights["l"]
    median = (weights["e"] + weights["l"]) / 2
    ctx = priority_context(snap, est)
    by_id = {s.id: s for s in servers}
    checked = 0
    for view in (early, late):
        per_gpu = est.type_rate(view.spec, "A")
        assert per_gpu is not None
        expected_gain = view.spec.total_samples / expected_run_s(view.spec, ctx) / per_gpu
        assert expected_gain == pytest.approx(3.75)
        w = weights[view.id]
        for cand in plan.explain[view.id].candidates:
            gpus = int(cand.config.split(":")[1].strip(" }"))
            rate = est.config_rate(view.spec, C(a0=gpus), by_id)
            assert rate is not None and cand.rate == pytest.approx(rate)
            gain = rate / per_gpu
            want = w * gain if gain <= expected_gain else w * expected_gain + median * (gain - expected_gain)
            assert cand.value == pytest.approx(want)
            checked += gain > expected_gain
    assert checked >= 2  # the 4- and 8-GPU configurations of both lie above E


def test_the_planner_weighs_jobs_with_the_knee_of_its_settings() -> None:
    """Two queued jobs that waited differently (latency ratios below and above a knee of 1): the plan's
    weights are the knee's curve of their priorities, not the paper's single exponent."""
    from hopsmgr.core.priority import ilp_weights

    servers = [srv("a0", 4, 1.0)]
    counts = RequirementSet.of([1, 2, 4])
    early = JobView(JobSpec("e", counts, 1e6, 32, restart_s=0.0, submit_time=0.0), waited_s=4000.0)
    late = JobView(JobSpec("l", counts, 1e6, 32, restart_s=0.0, submit_time=900.0), waited_s=100.0)
    est = profiled(early, late)
    snap = snapshot(servers, [early, late])
    paper = plan_round(snap, est, SchedulerSettings(solver="exact", gap=0.0))
    knee = plan_round(
        snap, est, SchedulerSettings(solver="exact", gap=0.0, lambda_knee=1.0, lambda_below=0.25)
    )
    assert knee.priorities == pytest.approx(paper.priorities)
    prio = paper.priorities
    assert prio["l"] < 1.0 < prio["e"]  # one below the knee, one above
    want = ilp_weights(prio, 1.0, knee=1.0, below=0.25)  # not ilp_weights' default 0.5
    assert {j: knee.explain[j].weight for j in ("e", "l")} == pytest.approx(want)
    assert {j: paper.explain[j].weight for j in ("e", "l")} == pytest.approx(ilp_weights(prio, 1.0))
    assert knee.explain["l"].weight > paper.explain["l"].weight  # flatter below the knee


@pytest.mark.parametrize("field", ["lambda_knee", "lambda_below"])
def test_the_knee_settings_refuse_negative_values_naming_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=f"scheduler.{field}"):
        SchedulerSettings(**{field: -0.5})  # type: ignore[arg-type]


def test_a_knee_too_small_to_mean_anything_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"scheduler.lambda_knee: must be 0 \(no knee\) or a finite number >= 0.001"
    ):
        SchedulerSettings(lambda_knee=1e-300)
    assert SchedulerSettings(lambda_knee=0.001).lambda_knee == 0.001


def near_tie_settings(hysteresis: float, **more: bool) -> SchedulerSettings:
    """Exact plans on plain latency ratios, no minimum attempt: near ties of the hysteresis tests."""
    exact = SchedulerSettings(solver="exact", gap=0.0, min_attempt_s=0.0, projected_priority=False)
    return replace(exact, lr_hysteresis=hysteresis, **more)


@pytest.mark.parametrize(
    ("ahead", "hysteresis", "kept"), [(0.05, 0.0, False), (0.05, 0.1, True), (0.15, 0.1, False)]
)
def test_a_waiting_job_within_the_hysteresis_of_a_running_one_does_not_take_its_gpus(
    ahead: float, hysteresis: float, kept: bool
) -> None:
    # One GPU, equal throughput, no restart costs: only the weights decide. r runs with a latency ratio
    # of 0; q has waited `ahead` of its expected run time. Without hysteresis q's higher weight wins;
    # with 0.1, a ratio 0.05 above r's counts as equal and r keeps the GPU; 0.15 above it, q wins.
    servers = [srv("a0", 1, 1.0)]
    age = 1e6 / (32 / 0.3)  # the jobs' expected run time: 1e6 samples at 32 per 0.3 s
    running = JobView(spec("r", 1), current=C(a0=1), running_s=1000.0, attempt_s=1000.0)
    queued = JobView(spec("q", 1), waited_s=ahead * age)
    settings_ = near_tie_settings(hysteresis, restart_penalty=False, preemption_cost=False)
    plan = plan_round(snapshot(servers, [running, queued]), profiled(running, queued), settings_)
    assert plan.priorities == pytest.approx({"r": 0.0, "q": ahead})
    assert plan.assignments == ({"r": C(a0=1)} if kept else {"q": C(a0=1)})
    raised = "weight raised to tie with waiting jobs whose priority is within lr_hysteresis (0.1)"
    tied = "its priority is less than lr_hysteresis (0.1) above that of 1 running job(s) that keep their GPUs"
    if kept:  # the plan shows the weight it used, raised just above q's, and why; and why q waits
        assert plan.explain["r"].weight == pytest.approx(plan.explain["q"].weight * 1.001)
        assert plan.explain["r"].note.startswith(raised)
        assert plan.explain["q"].note.startswith(tied)
    else:
        assert "lr_hysteresis" not in plan.explain["r"].note + plan.explain["q"].note


def test_the_hysteresis_is_read_only_with_the_latency_ratio_priority() -> None:
    # q is shorter than r: under srtf_lr its value is 0.15 above r's, under latency_ratio its ratio
    # 0.02 above: within 0.5 both times, but only the latency-ratio plan raises r's weight
    servers = [srv("a0", 1, 1.0)]
    running = JobView(spec("r", 1), current=C(a0=1), running_s=1000.0, attempt_s=1000.0)
    short = JobSpec("q", RequirementSet.of([1]), 5e5, 32, restart_s=60.0)
    queued = JobView(short, waited_s=100.0)
    est = profiled(running, queued)
    raised = {}
    for priority in ("srtf_lr", "latency_ratio"):
        base = SchedulerSettings(
            solver="exact", gap=0.0, min_attempt_s=0.0, priority=priority, lr_hysteresis=0.0
        )
        plans = [
            plan_round(snapshot(servers, [running, queued]), est, replace(base, lr_hysteresis=h))
            for h in (0.0, 0.5)
        ]
        prio = plans[0].priorities
        assert 0 < prio["q"] - prio["r"] < 0.5, (priority, prio)
        raised[priority] = plans[1].explain["r"].weight > plans[0].explain["r"].weight
    assert raised == {"srtf_lr": False, "latency_ratio": True}


def test_a_job_whose_gpus_left_the_capacity_is_not_raised_as_running() -> None:
    # d's server a0 has no capacity left (profiling took it): d is placed like a waiting job, so q,
    # whose ratio is 0.05 above d's, gets the one usable GPU with or without the hysteresis
    servers = [srv("a0", 1), srv("a1", 1)]
    displaced = JobView(spec("d", 1), current=C(a0=1), running_s=1000.0, attempt_s=1000.0)
    age = 1e6 / (32 / 0.3)
    queued = JobView(spec("q", 1), waited_s=0.05 * age)
    for h in (0.0, 0.1):
        settings_ = near_tie_settings(h, window=False, restart_penalty=False, preemption_cost=False)
        snap = snapshot(servers, [displaced, queued], capacity={"a0": 0, "a1": 1})
        plan = plan_round(snap, profiled(displaced, queued), settings_)
        assert plan.assignments == {"q": C(a1=1)}
        assert "lr_hysteresis" not in plan.explain["d"].note


def test_jobs_owed_under_a_guarantee_take_no_part_in_the_hysteresis() -> None:
    # o (tenant "own", guaranteed 2 GPUs) runs within its guarantee; w (also "own") waits, owed; b
    # (tenant "other") runs. Ratios within 0.1 of each other: neither owed job raises b, and o, which
    # already carries the guarantee's boost, is not raised either.
    servers = [srv("a0", 2), srv("a1", 1)]
    age = 1e6 / (32 / 0.3)
    own = JobView(spec("o", 1, tenant="own"), current=C(a0=1), running_s=1000.0, attempt_s=1000.0)
    other = JobView(spec("b", 1, tenant="other"), current=C(a1=1), running_s=1000.0, attempt_s=1000.0)
    owed = JobView(spec("w", 1, tenant="own"), waited_s=0.05 * age)
    rival = JobView(spec("x", 1, tenant="other"), waited_s=0.02 * age)
    tenants = {"own": TenantQuota("own", guaranteed_gpus=2), "other": TenantQuota("other")}
    views = [own, other, owed, rival]
    weights = {}
    for h in (0.0, 0.1):
        settings_ = near_tie_settings(h, fairshare=False)
        plan = plan_round(snapshot(servers, views, tenants=tenants), profiled(*views), settings_)
        weights[h] = {j: e.weight for j, e in plan.explain.items()}
    assert weights[0.0]["o"] == pytest.approx(weights[0.1]["o"])  # owed and running: only the boost
    # b is raised to just above x (0.02 ahead of it), not to the owed w (0.05 ahead, carrying the boost)
    assert weights[0.1]["b"] == pytest.approx(weights[0.0]["x"] * 1.001)
    assert weights[0.0]["o"] == pytest.approx(weights[0.0]["b"] * GUARANTEE_BOOST)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_the_hysteresis_setting_refuses_a_bad_value_naming_the_field(value: float) -> None:
    with pytest.raises(ValueError, match=r"scheduler.lr_hysteresis: must be a finite number >= 0"):
        SchedulerSettings(lr_hysteresis=value)


@pytest.mark.parametrize("critical_path", [False, True])
def test_latency_ratio_with_critical_path_keeps_the_job_that_sets_the_makespan(critical_path: bool) -> None:
    # By latency ratio r (the longest, its ratio growing slowest) makes room for q; on the critical path
    # r ranks as if its ratio were the queue's highest, and x makes room instead.
    servers, jobs = makespan_round(300.0)
    settings_ = SchedulerSettings(solver="exact", gap=0.0, critical_path=critical_path)
    plan = plan_round(snapshot(servers, jobs), profiled(*jobs), settings_)
    kept = "r" if critical_path else "x"
    assert set(plan.assignments) == {"q", kept}
    assert plan.assignments[kept] == C(a0=1)
    plain = plan_round(snapshot(servers, jobs), profiled(*jobs), replace(settings_, critical_path=False))
    top = max(plain.priorities.values())
    assert plain.priorities["r"] < top  # q, queued, is never lifted; x is not on the path
    assert plan.priorities == pytest.approx(
        {**plain.priorities, "r": top if critical_path else plain.priorities["r"]}
    )


def test_the_latency_ratio_critical_path_lift_is_weighed_by_the_tenant() -> None:
    # r (on the path) belongs to a tenant of weight 0.5: lifted to the queue's highest ratio, times 0.5
    servers, jobs = makespan_round(300.0, r_tenant="half")
    tenants = {"half": TenantQuota("half", weight=0.5)}
    settings_ = SchedulerSettings(solver="exact", gap=0.0, critical_path=True, fairshare=False)
    lifted = plan_round(snapshot(servers, jobs, tenants=tenants), profiled(*jobs), settings_)
    plain = plan_round(
        snapshot(servers, jobs, tenants=tenants), profiled(*jobs), replace(settings_, critical_path=False)
    )
    assert lifted.priorities["r"] == pytest.approx(0.5 * plain.priorities["q"])
    assert {k: v for k, v in lifted.priorities.items() if k != "r"} == pytest.approx(
        {k: v for k, v in plain.priorities.items() if k != "r"}
    )
