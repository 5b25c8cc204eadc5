"""Placements across GPU types with speed-balanced batches: the estimator's rate and rank shares, the
configuration generator's mixed candidates and the planner's use of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hopsmgr.core import configs as config_gen
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import (
    Calibration,
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    RequirementSet,
    Server,
    spans_types,
)
from hopsmgr.core.planner import plan_round, unplaceable_reason
from hopsmgr.core.settings import SchedulerSettings

PROFILE = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)  # k80
FAST_PROFILE = TimeProfile(tf_s=0.05, tb_s=0.1, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)  # v100: 2x
FAST, SLOW = Server("f", "v100", 2), Server("s", "k80", 2)
SERVERS = {s.id: s for s in (FAST, SLOW)}
SETTINGS = SchedulerSettings(solver="exact", gap=0.0, fairshare=False)


def job(jid: str, *counts: int) -> JobSpec:
    return JobSpec(jid, RequirementSet.of(counts), 1e6, 32)


def estimator(*jobs: JobSpec) -> Estimator:
    est = Estimator()
    for j in jobs:
        est.add_profile(j.id, "v100", FAST_PROFILE, Calibration())
        est.add_profile(j.id, "k80", PROFILE, Calibration())
    return est


def test_a_mixed_configuration_runs_every_gpu_at_its_own_pace() -> None:
    j = job("j", 4)
    est = estimator(j)
    mixed = Config.of({"f": 2, "s": 2})
    assert spans_types(mixed, SERVERS) and not spans_types(Config.single("f", 2), SERVERS)
    fast = est.per_gpu_rate(j, FAST, 2, 2)
    slow = est.per_gpu_rate(j, SLOW, 2, 2)
    assert fast is not None and slow is not None and fast > 1.5 * slow
    assert est.config_rate(j, mixed, SERVERS) == pytest.approx(2 * fast + 2 * slow)
    shares = est.rank_shares(j, mixed, SERVERS)
    assert len(shares) == 4 and sum(shares) == pytest.approx(1.0)
    assert shares[0] == shares[1] == pytest.approx(fast / (2 * fast + 2 * slow))  # ranks: f's GPUs first
    assert est.rank_shares(j, Config.single("f", 2), SERVERS) == ()  # one type: equal shares


def test_within_one_type_the_slowest_server_still_sets_the_pace() -> None:
    j = job("j", 4)
    est = estimator(j)
    other = Server("f2", "v100", 2, Calibration(compute_factor=0.7))  # a slower v100 server
    servers = {**SERVERS, "f2": other}
    config = Config.of({"f": 2, "f2": 2})
    slowest = min(est.per_gpu_rate(j, FAST, 2, 2) or 0, est.per_gpu_rate(j, other, 2, 2) or 0)
    assert est.config_rate(j, config, servers) == pytest.approx(4 * slowest)


def test_the_generator_proposes_mixed_placements_only_when_asked() -> None:
    j = job("j", 2, 4)
    est = estimator(j)
    by_type = config_gen.group_by_type(SERVERS.values(), {"f": 2, "s": 2})
    free = {"f": 2, "s": 2}
    plain = config_gen.generate(j, by_type, free, SERVERS, est, span=True)
    assert all(not spans_types(c.config, SERVERS) for c in plain)
    assert all(c.config.gpus == 2 for c in plain)  # 4 GPUs fit no one type
    mixed = config_gen.generate(j, by_type, free, SERVERS, est, span=True, mixed=True)
    across = [c for c in mixed if spans_types(c.config, SERVERS)]
    assert Config.of({"f": 2, "s": 2}) in {c.config for c in across}
    assert all(c.rate > 0 for c in across)


def snapshot(*views: JobView, capacity: dict[str, int] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot((FAST, SLOW), capacity or {"f": 2, "s": 2}, views, now=1000.0)


def test_a_job_no_type_can_hold_is_placed_across_types() -> None:
    big = JobView(job("big", 4), waited_s=100.0)
    est = estimator(big.spec)
    plan = plan_round(snapshot(big), est, SETTINGS)
    assert plan.assignments["big"] == Config.of({"f": 2, "s": 2})
    assert unplaceable_reason(big.spec, SERVERS.values(), est, mixed=True) is None
    off = plan_round(snapshot(big), est, replace(SETTINGS, mixed_types=False))
    assert "big" not in off.assignments and "do not mix GPU types" in off.unplaceable["big"]


def test_fragments_of_two_types_serve_one_low_sensitivity_job() -> None:
    # One GPU free on each server: a 2-GPU job runs on both (1 x v100 + 1 x k80) instead of waiting.
    a = JobView(job("a", 1), current=Config.single("f", 1), attempt_s=10.0)
    b = JobView(job("b", 1), current=Config.single("s", 1), attempt_s=10.0)
    two = JobView(job("two", 2), waited_s=500.0)
    est = estimator(a.spec, b.spec, two.spec)
    plan = plan_round(snapshot(a, b, two), est, SETTINGS)
    assert plan.assignments["two"] == Config.of({"f": 1, "s": 1})
    assert plan.assignments["a"] == a.current and plan.assignments["b"] == b.current
    off = plan_round(snapshot(a, b, two), est, replace(SETTINGS, mixed_types=False))
    assert "two" not in off.assignments


def test_a_job_without_the_runtime_is_never_placed_across_types() -> None:
    big = JobView(replace(job("big", 4), runtime=False), waited_s=100.0)
    est = estimator(big.spec)
    plan = plan_round(snapshot(big), est, SETTINGS)
    assert "big" not in plan.assignments and "do not mix GPU types" in plan.unplaceable["big"]


def test_the_class_model_places_a_job_no_type_can_hold_across_types() -> None:
    big = JobView(job("big", 4), waited_s=100.0)
    est = estimator(big.spec)
    plan = plan_round(snapshot(big), est, replace(SETTINGS, solver="classes"))
    assert plan.stats.model == "classes"
    assert plan.assignments["big"] == Config.of({"f": 2, "s": 2})


def test_observing_a_mixed_placement_keeps_its_balance() -> None:
    # The measured total is split over the parts by their estimated rates: observing exactly the
    # predicted rate changes neither the shares nor the fast server's rate, nor other v100 servers'.
    j = job("j", 4)
    est = estimator(j)
    mixed = Config.of({"f": 2, "s": 2})
    other = Server("f2", "v100", 2)
    servers = {**SERVERS, "f2": other}
    before = (
        est.rank_shares(j, mixed, servers),
        est.per_gpu_rate(j, FAST, 2, 2),
        est.per_gpu_rate(j, other, 2, 2),
    )
    predicted = est.config_rate(j, mixed, servers)
    assert predicted is not None
    est.observe("j", mixed, servers, predicted, job=j)
    after = (
        est.rank_shares(j, mixed, servers),
        est.per_gpu_rate(j, FAST, 2, 2),
        est.per_gpu_rate(j, other, 2, 2),
    )
    assert after[0] == pytest.approx(before[0]) and after[1] == pytest.approx(before[1])
    assert after[2] == pytest.approx(before[2])
    est.observe("j", mixed, servers, predicted * 0.5, job=j)  # slower than predicted: both parts learn it
    slower = est.config_rate(j, mixed, servers)
    assert slower is not None and slower < predicted
    assert est.rank_shares(j, mixed, servers) == pytest.approx(before[0])


def test_forecast_futures_place_a_job_no_type_can_hold_across_types() -> None:
    from hopsmgr.forecast.policy import ForecastPolicy

    big = JobView(job("big", 4), waited_s=100.0)
    est = estimator(big.spec)
    plan = ForecastPolicy(SETTINGS).plan(snapshot(big), est, "first", lambda: 0.0)
    assert plan.assignments["big"].gpus == 4 and spans_types(plan.assignments["big"], SERVERS)
    off = ForecastPolicy(replace(SETTINGS, mixed_types=False)).plan(snapshot(big), est, "first", lambda: 0.0)
    assert "big" not in off.assignments
