"""Tenants' caps per GPU type (`cap_gpus_by_type`, hopsmgr.core.typecaps): the planner's first and
fragment plans, protected jobs over a lowered cap, reservations and backfill, and the helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core import typecaps
from hopsmgr.core.model import Config, JobView, Server, TenantQuota
from hopsmgr.core.planner import plan_fragments, plan_round
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from tests.unit._planner_helpers import C, profiled, snapshot, spec, srv

SOLVERS = ["exact", "classes"]


def fast_and_slow() -> list[Server]:
    """Two servers of a fast type F, two of a slow type S, 4 GPUs each."""
    return [
        srv("f0", 4, 3.0, gpu_type="F", order=0),
        srv("f1", 4, 3.0, gpu_type="F", order=1),
        srv("s0", 4, 1.0, gpu_type="S", order=2),
        srv("s1", 4, 1.0, gpu_type="S", order=3),
    ]


def held(assignments: dict[str, Config], servers: list[Server], tenant_of: dict[str, str]) -> dict:
    smap = {s.id: s for s in servers}
    return typecaps.held_by_type(((tenant_of[j], c) for j, c in assignments.items()), smap)


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_cap_per_type_holds_and_is_used_in_full(solver: str) -> None:
    servers = fast_and_slow()
    views = [JobView(spec(f"t{k}", 2, tenant="lab"), waited_s=100.0 * (k + 1)) for k in range(4)]
    est = profiled(*views, types=("F", "S"))
    tenant_of = {v.id: "lab" for v in views}
    settings_ = SchedulerSettings(solver=solver)  # type: ignore[arg-type]

    free_plan = plan_round(snapshot(servers, views), est, settings_)
    assert held(free_plan.assignments, servers, tenant_of)[("lab", "F")] > 2  # the fast type is preferred

    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 2),))}
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, settings_)
    use = held(plan.assignments, servers, tenant_of)
    assert use[("lab", "F")] == 2  # the cap, not less: the fast GPUs are free
    assert len(plan.assignments) == 4  # the others run on the slow type
    assert use[("lab", "S")] == 6


@pytest.mark.parametrize("solver", SOLVERS)
def test_a_cap_per_type_binds_only_its_tenant(solver: str) -> None:
    servers = fast_and_slow()
    views = [JobView(spec(f"t{k}", 4, tenant="lab"), waited_s=100.0) for k in range(2)]
    views.append(JobView(spec("o", 4, tenant="other"), waited_s=50.0))
    est = profiled(*views, types=("F", "S"))
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 0),)), "other": TenantQuota("other")}
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver=solver))  # type: ignore[arg-type]
    assert {plan.assignments[f"t{k}"].servers[0] for k in range(2)} == {"s0", "s1"}
    assert plan.assignments["o"].servers[0] in ("f0", "f1")


def test_protected_jobs_over_a_lowered_cap_lose_their_protection() -> None:
    servers = fast_and_slow()
    # two young attempts on the fast type: protected by the minimum attempt length
    running = [
        JobView(
            spec(f"r{k}", 2, tenant="lab"), running_s=10.0, attempt_s=10.0, current=Config.single(f"f{k}", 2)
        )
        for k in range(2)
    ]
    est = profiled(*running, types=("F", "S"))
    tenant_of = {v.id: "lab" for v in running}
    uncapped = plan_round(snapshot(servers, running), est, SchedulerSettings(solver="exact"))
    assert held(uncapped.assignments, servers, tenant_of)[("lab", "F")] == 4  # kept: protected

    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 2),))}
    plan = plan_round(snapshot(servers, running, tenants=tenants), est, SchedulerSettings(solver="exact"))
    assert held(plan.assignments, servers, tenant_of).get(("lab", "F"), 0) <= 2


def test_a_fragment_plan_counts_running_jobs_against_the_cap() -> None:
    servers = fast_and_slow()
    running = JobView(spec("r", 2, tenant="lab"), running_s=500.0, attempt_s=500.0, current=C(f0=2))
    queued = JobView(spec("q", 2, tenant="lab"), waited_s=100.0)
    est = profiled(running, queued, types=("F", "S"))
    settings_ = SchedulerSettings(solver="exact")
    uncapped = plan_fragments(snapshot(servers, [running, queued]), est, settings_)
    assert uncapped.assignments["q"].servers[0].startswith("f")

    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 2),))}
    plan = plan_fragments(snapshot(servers, [running, queued], tenants=tenants), est, settings_)
    assert plan.assignments["r"] == C(f0=2)
    assert plan.assignments["q"].servers[0].startswith("s")


def test_a_reservation_keeps_the_caps_per_type() -> None:
    # A big job past its reservation threshold, and a tenant capped at 0 on the only type big enough.
    servers = [srv(f"f{k}", 4, 3.0, gpu_type="F", order=k) for k in range(2)]
    running = [
        JobView(
            spec(f"r{k}", 4, tenant="other"),
            running_s=600.0,
            attempt_s=600.0,
            current=Config.single(f"f{k}", 4),
        )
        for k in range(2)
    ]
    big = JobView(spec("big", 8, tenant="lab"), waited_s=1e6)
    est = profiled(*running, big, types=("F",))
    on = SchedulerSettings(solver="exact", reservations=True, reserve_min_gpus=8, reserve_after_lr=0.0)
    free_plan = plan_round(snapshot(servers, [*running, big]), est, on)
    assert [r.job_id for r in free_plan.reservations] == ["big"]  # the scenario does reserve
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 0),)), "other": TenantQuota("other")}
    plan = plan_round(snapshot(servers, [*running, big], tenants=tenants), est, on)
    assert plan.reservations == ()
    assert "big" not in plan.assignments


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(16, 64),
    st.integers(0, 30),
    st.dictionaries(st.sampled_from(("a100", "v100", "p100", "k80")), st.integers(0, 12), max_size=3),
    st.sampled_from(SOLVERS),
)
def test_first_plans_never_exceed_a_cap_per_type(
    seed: int, gpus: int, queued: int, caps: dict[str, int], solver: str
) -> None:
    inst = busy_instance(seed, gpus, queued)
    tenants = {
        "vision": TenantQuota("vision", type_caps=tuple(sorted(caps.items()))),
        "nlp": TenantQuota("nlp"),
    }
    snap = replace(inst.snapshot, tenants=tenants)
    plan = plan_round(snap, inst.estimator, SchedulerSettings(solver=solver))  # type: ignore[arg-type]
    tenant_of = {v.id: v.spec.tenant for v in snap.jobs}
    use = typecaps.held_by_type(((tenant_of[j], c) for j, c in plan.assignments.items()), snap.server_map())
    for gpu_type, cap in caps.items():
        assert use.get(("vision", gpu_type), 0) <= cap, (gpu_type, cap)


def test_the_helpers() -> None:
    servers = {s.id: s for s in fast_and_slow()}
    assert typecaps.gpus_by_type(C(f0=2, f1=1, s0=3), servers) == {"F": 3, "S": 3}
    quota = TenantQuota("lab", type_caps=(("F", 2),))
    assert quota.cap_of_type("F") == 2 and quota.cap_of_type("S") is None
    room = typecaps.type_room({"lab": quota}, {("lab", "F"): 3})
    assert room == {("lab", "F"): -1}
    assert typecaps.over_a_type_cap("lab", room) == {"F"}
    assert typecaps.fits("lab", {"S": 8}, room) and not typecaps.fits("lab", {"F": 1}, {("lab", "F"): 0})
    typecaps.take("lab", {"F": 2, "S": 1}, room)
    assert room == {("lab", "F"): -3}
    placed = {"a": C(f0=2), "b": C(f1=1), "c": C(s0=4)}
    tenant_of = {"a": "lab", "b": "lab", "c": "lab"}
    assert typecaps.jobs_over_type_caps(placed, tenant_of, {"lab": quota}, servers) == {"a", "b"}
    assert typecaps.gives_up_capped_gpus(quota, C(f0=2), C(s0=2), servers)
    assert not typecaps.gives_up_capped_gpus(quota, C(s0=2), C(s1=2), servers)
    assert not typecaps.gives_up_capped_gpus(TenantQuota("x"), C(f0=2), None, servers)
