"""Tenant guarantees: entitlement order, and the planner reclaiming borrowed GPUs for an owner."""

from __future__ import annotations

from hopsmgr.core import quota
from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import (
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    Server,
    TenantQuota,
)
from hopsmgr.core.planner import plan_round
from hopsmgr.core.settings import SchedulerSettings
from tests.helpers.builders import job_spec

PROFILE = TimeProfile(tf_s=0.01, tb_s=0.02, tu_s=0.005, td_hit_s=0.002, td_miss_s=0.002)


def job(jid: str, tenant: str, gpus: int = 1, submit: float = 0.0) -> JobSpec:
    return job_spec(jid, (gpus,), tenant=tenant, submit=submit)


def test_running_jobs_count_first_then_queued_by_priority() -> None:
    tenants = {"a": TenantQuota("a", guaranteed_gpus=3)}
    views = [
        JobView(job("q-low", "a", 1)),
        JobView(job("q-high", "a", 2)),
        JobView(job("run", "a", 2), current=Config.single("s", 2)),
    ]
    owed = quota.entitled(views, tenants, {"q-low": 1.0, "q-high": 5.0, "run": 0.1})
    # run holds 2 of 3; q-high needs 2 (does not fit); q-low needs 1 (fits)
    assert owed == {"run", "q-low"}


def test_tenants_without_guarantee_are_never_entitled() -> None:
    tenants = {"a": TenantQuota("a"), "b": TenantQuota("b", guaranteed_gpus=0)}
    views = [JobView(job("x", "a")), JobView(job("y", "b"))]
    assert quota.entitled(views, tenants, {}) == frozenset()


def _estimator(*jobs: JobSpec) -> Estimator:
    est = Estimator()
    for j in jobs:
        est.add_profile(j.id, "v100", PROFILE, Server("s0", "v100", 4).calibration)
    return est


def test_owner_under_guarantee_reclaims_borrowed_gpus() -> None:
    servers = (Server("s0", "v100", 4),)
    tenants = {"owner": TenantQuota("owner", guaranteed_gpus=2), "guest": TenantQuota("guest")}
    guests = [job(f"g{i}", "guest", 1, submit=0.0) for i in range(4)]
    owner = job("o", "owner", 2, submit=500.0)
    views = [
        JobView(g, current=Config.single("s0", 1), running_s=100.0, attempt_s=100.0, waited_s=0.0)
        for g in guests
    ]
    views.append(JobView(owner, waited_s=1.0))
    snapshot = ClusterSnapshot(servers, {"s0": 4}, tuple(views), now=600.0, tenants=tenants)
    plan = plan_round(snapshot, _estimator(owner, *guests), SchedulerSettings())
    assert plan.assignments.get("o") == Config.single("s0", 2)
    kept = [g.id for g in guests if g.id in plan.assignments]
    assert len(kept) == 2  # two borrowers are checkpointed to give the owner its guarantee


def test_without_guarantee_the_same_job_waits_for_min_attempt() -> None:
    servers = (Server("s0", "v100", 4),)
    tenants = {"owner": TenantQuota("owner"), "guest": TenantQuota("guest")}
    guests = [job(f"g{i}", "guest", 1) for i in range(4)]
    owner = job("o", "owner", 2, submit=500.0)
    views = [JobView(g, current=Config.single("s0", 1), running_s=100.0, attempt_s=100.0) for g in guests]
    views.append(JobView(owner, waited_s=1.0))
    snapshot = ClusterSnapshot(servers, {"s0": 4}, tuple(views), now=600.0, tenants=tenants)
    plan = plan_round(snapshot, _estimator(owner, *guests), SchedulerSettings())
    assert "o" not in plan.assignments  # the running jobs keep their minimum attempt
