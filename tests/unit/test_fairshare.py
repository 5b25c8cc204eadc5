"""Fair share with memory (hopsmgr.core.fairshare) and its effect on the planner's queue order."""

from __future__ import annotations

import pytest

from hopsmgr.core import fairshare
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.fairshare import TenantUsage
from hopsmgr.core.model import (
    Calibration,
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    RequirementSet,
    Server,
    TenantQuota,
)
from hopsmgr.core.planner import plan_round
from hopsmgr.core.settings import SchedulerSettings

FAST = TimeProfile(tf_s=0.01, tb_s=0.02, tu_s=0.002, td_hit_s=0.001, td_miss_s=0.001)
SLOW = TimeProfile(tf_s=0.03, tb_s=0.06, tu_s=0.006, td_hit_s=0.003, td_miss_s=0.003)


def spec(job_id: str, tenant: str = "a", gpus: int = 1) -> JobSpec:
    return JobSpec(job_id, RequirementSet.rigid(gpus), 1e6, 32, tenant=tenant, restart_s=20.0)


def test_decay_halves_use_every_half_life() -> None:
    usage = TenantUsage("a", 100.0, at=0.0)
    assert usage.decayed(0.0, 24.0) == 100.0
    assert usage.decayed(24 * 3600.0, 24.0) == pytest.approx(50.0)
    assert usage.decayed(48 * 3600.0, 24.0) == pytest.approx(25.0)
    usage.charge(10.0, 24 * 3600.0, 24.0)
    assert usage.used == pytest.approx(60.0) and usage.at == 24 * 3600.0


def test_factors_follow_use_over_weight_share() -> None:
    f = fairshare.factors({"a": 0.0, "b": 0.0}, {}, ["a", "b"])
    assert f == {"a": 1.0, "b": 1.0}
    f = fairshare.factors({"a": 300.0, "b": 100.0}, {}, ["a", "b"], strength=1.0)
    assert f["a"] == pytest.approx(2 ** -(0.75 / 0.5 - 1)) and f["b"] == pytest.approx(2 ** -(0.25 / 0.5 - 1))
    assert f["a"] < 1.0 < f["b"]
    # Steeper with the strength.
    strong = fairshare.factors({"a": 300.0, "b": 100.0}, {}, ["a", "b"], strength=5.0)
    assert strong["a"] == pytest.approx(f["a"] ** 5) and strong["b"] == pytest.approx(f["b"] ** 5)
    # Using exactly its weighted share gives a tenant 1, whatever the weights.
    f = fairshare.factors({"a": 300.0, "b": 100.0}, {"a": 3.0, "b": 1.0}, ["a", "b"])
    assert f["a"] == pytest.approx(1.0) and f["b"] == pytest.approx(1.0)
    # A tenant alone is always at its share.
    assert fairshare.factors({"a": 5.0}, {}, ["a"]) == {"a": 1.0}


def test_a_fast_gpu_costs_more_than_a_slow_one() -> None:
    est = Estimator()
    est.add_profile("j", "v100", FAST, Calibration())
    est.add_profile("j", "k80", SLOW, Calibration())
    servers = {"v": Server("v", "v100", 4), "k": Server("k", "k80", 4)}
    job = spec("j")
    ratio = fairshare.speed(job, "v100", "k80", est)
    assert ratio > 1.5  # the job runs faster on a V100: an hour of it is worth more K80-hours
    assert fairshare.charge_rate(job, Config.of({"v": 2}), servers, "k80", est) == pytest.approx(2 * ratio)
    assert fairshare.charge_rate(job, Config.of({"k": 2}), servers, "k80", est) == pytest.approx(2.0)
    # Not profiled on the reference type: one GPU-second is one unit.
    assert fairshare.speed(spec("other"), "v100", "k80", est) == 1.0


def test_reference_type_is_the_most_common_unless_configured() -> None:
    servers = [Server("a", "v100", 4), Server("b", "k80", 8), Server("c", "v100", 2)]
    assert fairshare.reference_type(servers) == "k80"
    assert fairshare.reference_type(servers, "v100") == "v100"
    # a tie between totals goes to the first name, from servers or from kept totals alike
    tied = [Server("a", "v100", 4), Server("b", "k80", 4)]
    assert fairshare.reference_type(tied) == fairshare.reference_of_totals({"v100": 4, "k80": 4}) == "k80"
    assert fairshare.reference_of_totals({}) == "" and fairshare.reference_of_totals({}, "t4") == "t4"


@pytest.mark.parametrize("enabled", [True, False])
def test_the_tenant_that_used_more_waits(enabled: bool) -> None:
    # Two equal jobs of two tenants, one GPU for both: the tenant with less recorded use goes first,
    # unless fair share is off (then the older submission wins).
    est = Estimator()
    views = []
    for job_id, tenant, submitted in (("ja", "a", 0.0), ("jb", "b", 10.0)):
        est.add_profile(job_id, "v100", FAST, Calibration())
        views.append(JobView(spec(job_id, tenant), waited_s=1000.0 - submitted))
    snapshot = ClusterSnapshot(
        (Server("v", "v100", 1),),
        {"v": 1},
        tuple(views),
        now=1000.0,
        tenants={"a": TenantQuota("a"), "b": TenantQuota("b")},
        tenant_usage={"a": 50 * 3600.0, "b": 1 * 3600.0},
    )
    plan = plan_round(snapshot, est, SchedulerSettings(fairshare=enabled, solver="exact"))
    assert list(plan.assignments) == (["jb"] if enabled else ["ja"])


def test_fairshare_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="fairshare_half_life_h"):
        SchedulerSettings(fairshare_half_life_h=0.0)
    with pytest.raises(ValueError, match="fairshare_strength"):
        SchedulerSettings(fairshare_strength=-1.0)
