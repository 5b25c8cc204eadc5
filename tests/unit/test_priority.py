"""Unit tests of hopsmgr.core.priority: ages, latency ratio, priority kinds, ILP weights, RAQLR."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopsmgr.core.model import Config, GpuType, JobSpec, JobView, RequirementSet
from hopsmgr.core.priority import (
    DEFAULT_LR_GUARD,
    HYSTERESIS_TIE,
    PRIORITY_KINDS,
    PriorityContext,
    critical_path_jobs,
    estimated_wait_s,
    expected_run_s,
    ftf_rho,
    ilp_weights,
    latency_ratio,
    order_queue,
    priority_values,
    raqlr,
    remaining_run_s,
    srtf_lr_value,
    with_hysteresis,
)

# --- two GPU types, a job with requirement set {2, 4} (R_avg = 3) ---------------------------------------

RATES_2T: dict[tuple[str, GpuType], float | None] = {("j", "A"): 10.0, ("j", "B"): 20.0}


def rate_2t(job: JobSpec, gpu_type: GpuType) -> float | None:
    return RATES_2T.get((job.id, gpu_type))


def ctx_2t(**kw: object) -> PriorityContext:
    args: dict[str, object] = {
        "now": 1000.0,
        "type_share": {"A": 0.25, "B": 0.75},
        "rate": rate_2t,
        "total_gpus": 6,
    }
    args.update(kw)
    return PriorityContext(**args)  # type: ignore[arg-type]


def job_2t(job_id: str = "j", tenant: str = "default") -> JobSpec:
    return JobSpec(
        id=job_id, requirements=RequirementSet.of([2, 4]), total_samples=36000.0, batch_size=32, tenant=tenant
    )


def test_expected_run_s_two_types() -> None:
    # 0.25 * 36000 / (10 * 3) + 0.75 * 36000 / (20 * 3) = 300 + 450
    assert expected_run_s(job_2t(), ctx_2t()) == pytest.approx(750.0)


def test_expected_run_s_renormalises_over_known_types() -> None:
    def only_a(job: JobSpec, gpu_type: GpuType) -> float | None:
        return 10.0 if gpu_type == "A" else None

    # only A known: P(A) renormalised to 1 -> 36000 / (10 * 3)
    assert expected_run_s(job_2t(), ctx_2t(rate=only_a)) == pytest.approx(1200.0)


def test_expected_run_s_unknown_rate_is_infinite() -> None:
    ctx = ctx_2t(rate=lambda job, t: None)
    assert expected_run_s(job_2t(), ctx) == math.inf
    view = JobView(spec=job_2t(), waited_s=500.0)
    assert latency_ratio(view, ctx) == 0.0
    assert ftf_rho(view, ctx) == 0.0
    assert estimated_wait_s(view, ctx, 2.0) is None
    values = priority_values("sjf", [view], ctx)
    assert values == {"j": 0.0}


def test_zero_share_and_bad_rates_are_ignored() -> None:
    def rates(job: JobSpec, gpu_type: GpuType) -> float | None:
        return {"A": 10.0, "B": 0.0, "C": math.inf, "D": 99.0}[gpu_type]

    ctx = ctx_2t(type_share={"A": 0.5, "B": 0.25, "C": 0.25, "D": 0.0}, rate=rates)
    assert expected_run_s(job_2t(), ctx) == pytest.approx(1200.0)


def test_remaining_run_s() -> None:
    assert remaining_run_s(JobView(spec=job_2t(), done_samples=18000.0), ctx_2t()) == pytest.approx(375.0)
    assert remaining_run_s(JobView(spec=job_2t(), done_samples=36000.0), ctx_2t()) == 0.0
    done = JobView(spec=job_2t(), done_samples=36000.0)
    assert remaining_run_s(done, ctx_2t(rate=lambda job, t: None)) == 0.0


def test_latency_ratio_and_tenant_weight() -> None:
    view = JobView(spec=job_2t(tenant="gold"), waited_s=1500.0)
    assert latency_ratio(view, ctx_2t()) == pytest.approx(2.0)
    assert priority_values("latency_ratio", [view], ctx_2t())["j"] == pytest.approx(2.0)
    weighted = ctx_2t(tenant_weight={"gold": 3.0})
    assert priority_values("latency_ratio", [view], weighted)["j"] == pytest.approx(6.0)


def test_ftf_rho_hand_computed() -> None:
    view = JobView(spec=job_2t(), done_samples=18000.0)
    # T_shared = (1000 - 0) + 375; T_ideal = 750 * max(1, 4 * 3 / 6) = 1500
    assert ftf_rho(view, ctx_2t(active_jobs=4)) == pytest.approx(1375.0 / 1500.0)
    # one job: 4 * 3 / 6 < 1 -> T_ideal = 750
    assert ftf_rho(view, ctx_2t(active_jobs=1)) == pytest.approx(1375.0 / 750.0)


def test_estimated_wait() -> None:
    view = JobView(spec=job_2t())
    assert estimated_wait_s(view, ctx_2t(), 0.5) == pytest.approx(375.0)
    assert estimated_wait_s(view, ctx_2t(), None) is None


def test_context_validation() -> None:
    with pytest.raises(ValueError, match="total_gpus"):
        ctx_2t(total_gpus=-1)
    with pytest.raises(ValueError, match="share"):
        ctx_2t(type_share={"A": -0.5})


# --- priority kinds on a hand-built queue (one type, rigid 1 GPU, rate 1 sample/s) -----------------------


def unit_rate(job: JobSpec, gpu_type: GpuType) -> float | None:
    return 1.0


def spec(job_id: str, submit: float, samples: float, tenant: str = "default") -> JobSpec:
    return JobSpec(
        id=job_id,
        requirements=RequirementSet.rigid(1),
        total_samples=samples,
        batch_size=8,
        submit_time=submit,
        tenant=tenant,
    )


def queue(a_tenant: str = "default") -> list[JobView]:
    # a: age 1000, remaining 100, attained 5000, LR 0.1
    # b: age 200, remaining 200, attained 0, LR 0.5
    # c: age 500, remaining 500, attained 1000, LR 0.8
    return [
        JobView(spec=spec("c", 20.0, 500.0), waited_s=400.0, attained_gpu_s=1000.0),
        JobView(
            spec=spec("a", 0.0, 1000.0, a_tenant), done_samples=900.0, waited_s=100.0, attained_gpu_s=5000.0
        ),
        JobView(spec=spec("b", 10.0, 200.0), waited_s=100.0),
    ]


def ctx_q(**kw: object) -> PriorityContext:
    args: dict[str, object] = {
        "now": 1000.0,
        "type_share": {"A": 1.0},
        "rate": unit_rate,
        "total_gpus": 3,
        "active_jobs": 3,
    }
    args.update(kw)
    return PriorityContext(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("fifo", ["a", "b", "c"]),  # by submit time
        ("las", ["b", "c", "a"]),  # attained 0 < 1000 < 5000
        ("sjf", ["b", "c", "a"]),  # age 200 < 500 < 1000
        ("srtf", ["a", "b", "c"]),  # remaining 100 < 200 < 500
        ("srtf_lr", ["a", "b", "c"]),  # every LR below the guard (2): as srtf
        ("latency_ratio", ["c", "b", "a"]),  # LR 0.8 > 0.5 > 0.1
        # rho: a (1000 + 100) / 1000 = 1.1, b (990 + 200) / 200 = 5.95, c (980 + 500) / 500 = 2.96
        ("ftf", ["b", "c", "a"]),
    ],
)
def test_each_kind_orders_queue(kind: str, expected: list[str]) -> None:
    views = queue()
    values = priority_values(kind, views, ctx_q())
    assert set(values) == {"a", "b", "c"}
    assert all(math.isfinite(v) for v in values.values())
    assert [v.id for v in order_queue(views, values)] == expected


def test_ftf_values_hand_computed() -> None:
    values = priority_values("ftf", queue(), ctx_q())
    assert values == pytest.approx({"a": 1.1, "b": 5.95, "c": 2.96})


def test_tenant_weight_lifts_job_in_lr_order() -> None:
    views = queue(a_tenant="gold")
    values = priority_values("latency_ratio", views, ctx_q(tenant_weight={"gold": 10.0}))
    assert values["a"] == pytest.approx(1.0)
    assert [v.id for v in order_queue(views, values)] == ["a", "c", "b"]


def test_srtf_lr_values_hand_computed() -> None:
    # below the guard the SRTF value alone: 1 / (1 + remaining hours)
    values = priority_values("srtf_lr", queue(), ctx_q())
    assert values == pytest.approx(
        {"a": 1 / (1 + 100 / 3600), "b": 1 / (1 + 200 / 3600), "c": 1 / (1 + 500 / 3600)}
    )
    # past it, the ratio's excess is added: c has waited 1,500 s on an age of 500 (LR 3): + 1 over the
    # default guard of 2, + 2 over a guard of 1
    late = JobView(spec=spec("c", 20.0, 500.0), waited_s=1500.0)
    assert DEFAULT_LR_GUARD == 2.0
    assert srtf_lr_value(late, ctx_q()) == pytest.approx(1 / (1 + 500 / 3600) + 1.0)
    assert srtf_lr_value(late, ctx_q(), guard=1.0) == pytest.approx(1 / (1 + 500 / 3600) + 2.0)
    assert srtf_lr_value(late, ctx_q(), guard=5.0) == pytest.approx(1 / (1 + 500 / 3600))
    # projected 500 s ahead: LR (1,500 + 500) / 500 = 4
    assert srtf_lr_value(late, ctx_q(), ahead_s=500.0, guard=1.0) == pytest.approx(1 / (1 + 500 / 3600) + 3.0)


def test_srtf_lr_guard_lifts_a_long_job_over_short_ones_once_its_ratio_passes_guard_plus_one() -> None:
    # long: 100 h of work, waited 310 h (LR 3.1, past the default guard 2 + 1); short: 1 s of work,
    # never waited (the SRTF maximum ~1)
    long_job = JobView(spec=spec("long", 0.0, 360_000.0), waited_s=1_116_000.0)
    short = JobView(spec=spec("short", 5.0, 1.0))
    values = priority_values("srtf_lr", [long_job, short], ctx_q())
    assert [v.id for v in order_queue([long_job, short], values)] == ["long", "short"]
    # and plain SRTF would starve it
    values = priority_values("srtf", [long_job, short], ctx_q())
    assert [v.id for v in order_queue([long_job, short], values)] == ["short", "long"]


def test_srtf_lr_a_running_job_is_not_overtaken_by_a_queued_one_of_its_size_waiting() -> None:
    # r runs (a quarter done), q waits; both 2,000 s of work. Until r ends (t = 1,500 s) q's latency
    # ratio stays under 1, below the guard. Latency ratio: r's is frozen (0), q's grows, so q overtakes r
    # and the plan would rotate them. srtf_lr: r's SRTF value grows as it ends, and q's does not.
    def views(t: float) -> list[JobView]:
        r = JobView(
            spec=spec("r", 0.0, 2000.0), done_samples=min(2000.0, 500.0 + t), current=Config.of({"s": 1})
        )
        q = JobView(spec=spec("q", 1.0, 2000.0), waited_s=t)
        return [r, q]

    for t in (0.0, 600.0, 1400.0, 1499.0):
        values = priority_values("srtf_lr", views(t), ctx_q())
        assert values["r"] > values["q"]
    lr = priority_values("latency_ratio", views(1400.0), ctx_q())
    assert lr["q"] > lr["r"]


def test_srtf_lr_past_its_guard_a_queued_job_overtakes_a_running_one() -> None:
    # r runs with 1,000 s left (SRTF value 1 / (1 + 0.28) = 0.78); q (2,000 s of work) has waited
    # 4,400 s: LR 2.2, 0.2 past the guard (2), value 1 / (1 + 0.56) + 0.2 = 0.84: q goes first.
    r = JobView(spec=spec("r", 0.0, 2000.0), done_samples=1000.0, current=Config.of({"s": 1}))
    q = JobView(spec=spec("q", 1.0, 2000.0), waited_s=4400.0)
    values = priority_values("srtf_lr", [r, q], ctx_q())
    assert values["q"] > values["r"]
    assert values["q"] == pytest.approx(1 / (1 + 2000 / 3600) + 0.2)


def test_srtf_lr_tenant_weight_multiplies_the_value() -> None:
    views = queue(a_tenant="gold")
    plain = priority_values("srtf_lr", views, ctx_q())
    weighted = priority_values("srtf_lr", views, ctx_q(tenant_weight={"gold": 0.1}))
    assert weighted["a"] == pytest.approx(0.1 * plain["a"])
    assert weighted["b"] == pytest.approx(plain["b"])


# --- the critical path of the backlog's makespan ---------------------------------------------------------


def test_critical_path_is_the_longest_job_when_it_outlasts_the_drain() -> None:
    # 8 GPUs; remaining work 10 h x 1 + 9.97 h x 1 + 2 h x 4 + 1 h x 2 = 30 GPU-hours: drained in 3.75 h,
    # so the bound is the 10-h job, and only a job within the horizon of it is on the path
    remaining = {"long": 36_000.0, "near": 36_000.0 - 100.0, "mid": 7_200.0, "short": 3_600.0}
    gpus = {"long": 1.0, "near": 1.0, "mid": 4.0, "short": 2.0}
    assert critical_path_jobs(remaining, gpus, 8, 120.0) == {"long", "near"}
    assert critical_path_jobs(remaining, gpus, 8, 60.0) == {"long"}


def test_critical_path_under_a_long_drain_is_every_job_that_lasts_as_long() -> None:
    # 2 GPUs and 3 h x 2 + 2.9 h x 2 + 1 h x 2 GPUs of work: a 6.9-h drain outlasts every job, so none is on
    # the path until a job's remaining run reaches the drain, less the horizon
    remaining = {"a": 3 * 3600.0, "b": 2.9 * 3600.0, "c": 3600.0}
    gpus = dict.fromkeys(remaining, 2.0)
    assert critical_path_jobs(remaining, gpus, 2, 120.0) == frozenset()
    assert critical_path_jobs(remaining, gpus, 2, 4 * 3600.0) == {"a", "b"}


def test_critical_path_leaves_out_jobs_of_unknown_size_and_finished_ones() -> None:
    remaining = {"unknown": math.inf, "done": 0.0, "known": 600.0}
    gpus = dict.fromkeys(remaining, 1.0)
    assert critical_path_jobs(remaining, gpus, 4, 0.0) == {"known"}
    assert critical_path_jobs({"unknown": math.inf}, {"unknown": 1.0}, 4, 0.0) == frozenset()
    assert critical_path_jobs({}, {}, 0, 0.0) == frozenset()


def test_bad_kind_raises_naming_it() -> None:
    with pytest.raises(ValueError, match="bogus") as info:
        priority_values("bogus", queue(), ctx_q())
    for kind in PRIORITY_KINDS:
        assert kind in str(info.value)


def test_order_queue_ties_and_missing_values() -> None:
    views = [
        JobView(spec=spec("x", 5.0, 10.0)),
        JobView(spec=spec("w", 5.0, 10.0)),
        JobView(spec=spec("v", 1.0, 10.0)),
        JobView(spec=spec("m", 0.0, 10.0)),
        JobView(spec=spec("n", 0.0, 10.0)),
    ]
    values = {"x": 1.0, "w": 1.0, "v": 1.0, "n": math.nan}
    # equal values: earlier submit first, then id; missing and NaN last (then by submit, id)
    assert [v.id for v in order_queue(views, values)] == ["v", "w", "x", "m", "n"]


# --- ILP weights, RAQLR ----------------------------------------------------------------------------------


def test_ilp_weights_bias_with_negative_values() -> None:
    values = {"a": -1.0, "b": 0.0, "c": 2.0}  # bias = |-1| + 0.01
    assert ilp_weights(values, 0) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert ilp_weights(values, 1) == pytest.approx({"a": 0.01, "b": 1.01, "c": 3.01})
    assert ilp_weights(values, 2) == pytest.approx({"a": 0.0001, "b": 1.0201, "c": 9.0601})


def test_ilp_weights_zero_minimum_gets_bias() -> None:
    assert ilp_weights({"a": 0.0, "b": 1.0}, 1) == pytest.approx({"a": 0.01, "b": 1.01})


def test_ilp_weights_all_positive_no_bias() -> None:
    assert ilp_weights({"a": 0.5, "b": 2.0}, 2) == pytest.approx({"a": 0.25, "b": 4.0})
    assert ilp_weights({}, 1) == {}


def test_ilp_weights_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="lambda"):
        ilp_weights({"a": 1.0}, -1)
    with pytest.raises(ValueError, match="'a'"):
        ilp_weights({"a": math.inf}, 1)


def test_ilp_weights_with_a_knee_are_flatter_below_it_and_the_papers_above() -> None:
    values = {"a": 0.25, "b": 1.0, "c": 4.0}  # all positive: no bias
    knee = ilp_weights(values, 1, knee=1.0, below=0.5)
    assert knee == pytest.approx({"a": 0.5, "b": 1.0, "c": 4.0})  # 0.25^0.5; 1^0.5 = the knee; 1 x 4/1
    assert ilp_weights(values, 2, knee=2.0, below=0.5) == pytest.approx(
        {"a": 0.5, "b": 1.0, "c": 2**0.5 * 2.0**2}
    )
    # continuous at the knee, and no knee is the paper's curve
    assert ilp_weights({"x": 2.0 - 1e-9, "y": 2.0 + 1e-9}, 2, knee=2.0, below=0.5) == pytest.approx(
        {"x": 2**0.5, "y": 2**0.5}
    )
    assert ilp_weights(values, 1, knee=0.0, below=0.5) == ilp_weights(values, 1)
    # the ratio of two weights below the knee shrinks (a: 0.25 of b without it, 0.5 with it)
    assert knee["a"] / knee["b"] > ilp_weights(values, 1)["a"] / ilp_weights(values, 1)["b"]


def test_ilp_weights_refuse_a_bad_knee_or_exponent_below_it() -> None:
    with pytest.raises(ValueError, match="lambda_knee"):
        ilp_weights({"a": 1.0}, 1, knee=-1.0)
    with pytest.raises(ValueError, match="lambda_below"):
        ilp_weights({"a": 1.0}, 1, knee=1.0, below=math.nan)


def test_raqlr_window() -> None:
    ended = [(100.0, 1.0), (3700.0, 2.0), (7200.0, 4.0)]
    assert raqlr(ended, now=7200.0, hours=1) == pytest.approx(3.0)  # cutoff 3600
    assert raqlr(ended, now=7200.0, hours=2) == pytest.approx(7.0 / 3.0)  # cutoff 0
    assert raqlr(ended, now=7200.0, hours=0) == pytest.approx(4.0)  # cutoff at now, inclusive
    assert raqlr(ended, now=20000.0, hours=1) is None
    assert raqlr([], now=0.0, hours=1) is None
    with pytest.raises(ValueError):
        raqlr(ended, now=0.0, hours=-1)


# --- properties -----------------------------------------------------------------------------------------

job_rows = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5),  # submit time (coarse: many ties)
        st.sampled_from([0.0, 0.5, 1.0, -2.0, 3.0]),  # value (coarse: many ties)
    ),
    min_size=0,
    max_size=12,
)


@given(job_rows, st.randoms(use_true_random=False))
def test_order_queue_is_a_deterministic_permutation(
    rows: list[tuple[int, float]], rnd: random.Random
) -> None:
    views = [JobView(spec=spec(f"j{i}", float(submit), 10.0)) for i, (submit, _) in enumerate(rows)]
    values = {f"j{i}": value for i, (_, value) in enumerate(rows)}
    ordered = order_queue(views, values)
    assert sorted(v.id for v in ordered) == sorted(v.id for v in views)
    shuffled = list(views)
    rnd.shuffle(shuffled)
    assert [v.id for v in order_queue(shuffled, values)] == [v.id for v in ordered]
    keys = [values[v.id] for v in ordered]
    assert keys == sorted(keys, reverse=True)


@given(
    # hundredths: keeps (prio + bias)^lambda clear of float underflow
    st.dictionaries(
        st.text(min_size=1, max_size=3), st.integers(-(10**5), 10**5).map(lambda i: i / 100), max_size=8
    ),
    st.sampled_from([1.0, 2.0]),
)
def test_ilp_weights_positive_and_order_preserving(values: dict[str, float], lambda_: float) -> None:
    weights = ilp_weights(values, lambda_)
    assert all(w > 0 for w in weights.values())
    for a in values:
        for b in values:
            if values[a] < values[b]:
                assert weights[a] <= weights[b]


@pytest.mark.parametrize("kind", sorted(PRIORITY_KINDS))
def test_a_job_with_the_smallest_positive_work_gets_a_finite_priority(kind: str) -> None:
    """Work of 5e-324 samples (the API takes it: positive) once made the latency ratio infinite and
    the plan fail (found by the OpenAPI fuzz test through a what-if forecast)."""
    tiny = JobSpec(id="j", requirements=RequirementSet.of([2, 4]), total_samples=5e-324, batch_size=1)
    view = JobView(tiny, waited_s=30.0)
    ctx = ctx_2t()
    assert expected_run_s(tiny, ctx) == 1.0 and latency_ratio(view, ctx) == 30.0
    values = priority_values(kind, [view], ctx)
    assert all(math.isfinite(v) for v in values.values()), values
    assert ilp_weights(values, 1.0)


def test_with_hysteresis_raises_a_running_job_to_just_above_its_best_rival_within_delta() -> None:
    values = {"run": 0.20, "near": 0.28, "nearer": 0.25, "far": 0.31, "low": 0.1, "run2": 0.5}
    weights = {j: v + 0.01 for j, v in values.items()}
    out = with_hysteresis(
        values, weights, running=["run", "run2"], rivals=["near", "nearer", "far", "low"], delta=0.1
    )
    assert out["run"] == pytest.approx(weights["near"] * (1 + HYSTERESIS_TIE))  # the best within 0.30
    assert out["run"] < weights["far"]  # a rival beyond delta still outranks it
    assert out["run2"] == weights["run2"]  # every rival is below it: nothing to raise
    assert {j: out[j] for j in ("near", "nearer", "far", "low")} == {
        j: weights[j] for j in ("near", "nearer", "far", "low")
    }  # only running jobs change
    assert with_hysteresis(values, weights, ["run"], ["near"], 0.0) == weights
    assert with_hysteresis(values, weights, ["run"], [], 0.1) == weights


@pytest.mark.parametrize("delta", [-1.0, float("nan"), float("inf")])
def test_with_hysteresis_refuses_a_bad_delta(delta: float) -> None:
    with pytest.raises(ValueError, match="lr_hysteresis"):
        with_hysteresis({}, {}, [], [], delta)


def test_with_hysteresis_never_lifts_a_running_job_over_a_rival_beyond_delta() -> None:
    # a rival at exactly delta and another just beyond it: the running job ties with the first and
    # stays below the second, whose weight is less than a thousandth above the first's
    values = {"run": 0.0, "at": 0.1, "beyond": 0.10001}
    weights = {j: v + 0.01 for j, v in values.items()}
    out = with_hysteresis(values, weights, running=["run"], rivals=["at", "beyond"], delta=0.1)
    assert weights["at"] < out["run"] < weights["beyond"]
