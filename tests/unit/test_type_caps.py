"""Tenants' caps per GPU type (`cap_gpus_by_type`, hopsmgr.core.typecaps): the planner's first and
fragment plans, protected jobs over a lowered cap, reservations and backfill, and the helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core import classes as class_model
from hopsmgr.core import typecaps
from hopsmgr.core.keepchanges import keep_changes_that_free_nothing
from hopsmgr.core.model import Calibration, Config, JobView, Server, TenantQuota
from hopsmgr.core.planner import plan_fragments, plan_round
from hopsmgr.core.program import RoundState
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from tests.unit._planner_helpers import PROFILE, C, profiled, snapshot, spec, srv

SOLVERS = ["exact", "classes"]


def per_type(low: int, high: int, size: int) -> st.SearchStrategy[dict[str, int]]:
    """Tables of GPU type (those of `busy_instance`'s servers) -> a number of GPUs."""
    return st.dictionaries(
        st.sampled_from(("a100", "v100", "p100", "k80")), st.integers(low, high), max_size=size
    )


def fast_and_slow() -> list[Server]:
    """Two servers of a fast type F, two of a slow type S, 4 GPUs each."""
    return [
        srv("f0", 4, 3.0, gpu_type="F", order=0),
        srv("f1", 4, 3.0, gpu_type="F", order=1),
        srv("s0", 4, 1.0, gpu_type="S", order=2),
        srv("s1", 4, 1.0, gpu_type="S", order=3),
    ]


def holding(job_id: str, tenant: str, config: Config, attempt_s: float = 600.0) -> JobView:
    """A job of `tenant` running on `config` (all its GPUs) for `attempt_s`."""
    return JobView(
        spec(job_id, config.gpus, tenant=tenant), running_s=attempt_s, attempt_s=attempt_s, current=config
    )


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
    running = [holding(f"r{k}", "other", Config.single(f"f{k}", 4)) for k in range(2)]
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
    per_type(0, 12, 3),
    per_type(1, 8, 2),
    st.sampled_from(SOLVERS),
)
def test_first_plans_keep_every_cap_and_active_guarantee_per_type(
    seed: int, gpus: int, queued: int, caps: dict[str, int], owed: dict[str, int], solver: str
) -> None:
    inst = busy_instance(seed, gpus, queued)
    tenants = {
        "vision": TenantQuota("vision", type_caps=tuple(sorted(caps.items()))),
        "nlp": TenantQuota("nlp", type_guarantees=tuple(sorted(owed.items()))),
    }
    snap = replace(inst.snapshot, tenants=tenants)
    plan = plan_round(snap, inst.estimator, SchedulerSettings(solver=solver))  # type: ignore[arg-type]
    tenant_of = {v.id: v.spec.tenant for v in snap.jobs}
    use = typecaps.held_by_type(((tenant_of[j], c) for j, c in plan.assignments.items()), snap.server_map())
    for gpu_type, cap in caps.items():
        assert use.get(("vision", gpu_type), 0) <= cap, (gpu_type, cap)
    total: dict[str, int] = {}
    for server in snap.servers:
        total[server.gpu_type] = total.get(server.gpu_type, 0) + server.gpus
    smap = snap.server_map()
    running = typecaps.held_by_type(
        ((v.spec.tenant, v.current) for v in snap.jobs if v.current is not None), smap
    )
    needs: dict[str, int] = {}
    by_id = {v.id: v for v in snap.jobs}
    for job_id, (_, gpu_type) in typecaps.owed_by_type(snap, inst.estimator).items():
        needs[gpu_type] = needs.get(gpu_type, 0) + by_id[job_id].spec.requirements.minimum
    for gpu_type, g in owed.items():  # the others leave what nlp holds and needs of it, up to g
        protected = min(g, running.get(("nlp", gpu_type), 0) + needs.get(gpu_type, 0))
        others = sum(n for (t, k), n in use.items() if k == gpu_type and t != "nlp")
        assert others <= max(0, total.get(gpu_type, 0) - protected), (gpu_type, others, protected)


def test_the_helpers() -> None:
    servers = {s.id: s for s in fast_and_slow()}
    assert typecaps.gpus_by_type(C(f0=2, f1=1, s0=3), servers) == {"F": 3, "S": 3}
    quota = TenantQuota("lab", type_caps=(("F", 2),))
    assert quota.cap_of_type("F") == 2 and quota.cap_of_type("S") is None
    limits = {("lab", "F"): 2}
    room = typecaps.type_room(limits, {("lab", "F"): 3, ("other", "F"): 4})
    assert room == {("lab", "F"): -1}
    assert typecaps.fits("lab", {"S": 8}, room) and not typecaps.fits("lab", {"F": 1}, {("lab", "F"): 0})
    assert typecaps.fits("other", {"F": 8}, room)  # the cap counts its own tenant only
    typecaps.take("lab", {"F": 2, "S": 1}, room)
    assert room == {("lab", "F"): -3}
    placed = {"a": C(f0=2), "b": C(f1=1), "c": C(s0=4)}
    tenant_of = {"a": "lab", "b": "lab", "c": "lab"}
    assert typecaps.jobs_over_type_caps(placed, tenant_of, limits, servers) == {"a", "b"}
    assert typecaps.change_back(C(f0=2), C(s0=2), servers) == {"F": 2, "S": -2}
    assert typecaps.change_back(C(f0=2), None, servers) == {"F": 2}
    assert typecaps.merged({("a", "F"): 1}, {("a", "F"): 2, ("b", "S"): 1}) == {("a", "F"): 3, ("b", "S"): 1}
    # a guarantee's limit counts every tenant but its owner
    others = {("!lab", "F"): 4}
    room = typecaps.type_room(others, {("lab", "F"): 3, ("a", "F"): 2, ("b", "F"): 3})
    assert room == {("!lab", "F"): -1}
    assert typecaps.fits("lab", {"F": 8}, room) and not typecaps.fits("a", {"F": 1}, room)
    assert typecaps.applies("!lab", "a") and not typecaps.applies("!lab", "lab")


# --- guarantees per GPU type ----------------------------------------------------------------------------


def borrowed_fast(young: bool) -> list[JobView]:
    """Four 2-GPU jobs of tenant "guest" holding every GPU of the fast type."""
    attempt = 10.0 if young else 5_000.0
    return [
        JobView(
            spec(f"g{k}", 2, tenant="guest"),
            running_s=attempt,
            attempt_s=attempt,
            current=Config.single(f"f{k // 2}", 2),
        )
        for k in range(4)
    ]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("young", [False, True])
def test_an_owner_with_work_waiting_gets_its_guaranteed_gpus_of_a_type_back(solver: str, young: bool) -> None:
    servers = fast_and_slow()
    guests = borrowed_fast(young)
    owner = JobView(spec("o", 2, tenant="owner"), waited_s=10.0)
    est = profiled(*guests, owner, types=("F", "S"))
    tenants = {"owner": TenantQuota("owner", type_guarantees=(("F", 4),)), "guest": TenantQuota("guest")}
    tenant_of = {v.id: v.spec.tenant for v in [*guests, owner]}
    settings_ = SchedulerSettings(solver=solver)  # type: ignore[arg-type]

    alone = plan_round(snapshot(servers, guests, tenants=tenants), est, settings_)
    assert held(alone.assignments, servers, tenant_of)[("guest", "F")] == 8  # borrowing while unwanted

    plan = plan_round(snapshot(servers, [*guests, owner], tenants=tenants), est, settings_)
    assert plan.order[0] == "o"  # the owner's waiting job heads the queue
    use = held(plan.assignments, servers, tenant_of)
    assert use.get(("guest", "F"), 0) <= 6  # protected or not, borrowers give back what the owner needs
    assert plan.assignments["o"].servers[0].startswith("f")

    no_guarantee = {"owner": TenantQuota("owner"), "guest": TenantQuota("guest")}
    if young:  # without the guarantee, the young attempts keep their GPUs
        plain = plan_round(snapshot(servers, [*guests, owner], tenants=no_guarantee), est, settings_)
        assert held(plain.assignments, servers, tenant_of)[("guest", "F")] == 8


def test_an_owner_within_its_guarantee_of_a_type_asks_for_nothing_more() -> None:
    servers = fast_and_slow()
    mine = JobView(spec("m", 4, tenant="owner"), running_s=5_000.0, attempt_s=5_000.0, current=C(f0=4))
    guests = [JobView(spec("g", 4, tenant="guest"), running_s=5_000.0, attempt_s=5_000.0, current=C(f1=4))]
    more = JobView(spec("o", 2, tenant="owner"), waited_s=10.0)
    snap = snapshot(
        servers,
        [mine, *guests, more],
        tenants={"owner": TenantQuota("owner", type_guarantees=(("F", 4),)), "guest": TenantQuota("guest")},
    )
    est = profiled(mine, *guests, more, types=("F", "S"))
    # it holds its 4: the others may not take them, and nothing more is owed
    assert typecaps.limits(snap, est) == {("!owner", "F"): 4}
    assert typecaps.owed_by_type(snap, est) == {}
    plan = plan_round(snap, est, SchedulerSettings(solver="exact"))
    assert plan.assignments["g"] == C(f1=4)


# --- every guard, one by one (from the review) ----------------------------------------------------------


def use_of(plan_assignments: dict[str, Config], views: list[JobView], servers: list[Server]) -> dict:
    return held(plan_assignments, servers, {v.id: v.spec.tenant for v in views})


def test_two_reservations_of_one_tenant_share_its_cap() -> None:
    servers = [srv(f"f{k}", 4, 1.0, gpu_type="F", order=k) for k in range(4)]
    views = [JobView(spec(f"b{k}", 8, tenant="lab"), waited_s=1e6) for k in range(2)]
    est = profiled(*views, types=("F",))
    on = SchedulerSettings(
        solver="exact", reservations=True, reserve_min_gpus=8, reserve_after_lr=0.0, reserve_share=1.0
    )
    assert len(plan_round(snapshot(servers, views), est, on).reservations) == 2
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 8),))}
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, on)
    assert use_of(plan.assignments, views, servers).get(("lab", "F"), 0) <= 8


def test_draining_jobs_of_a_tenant_over_its_cap_are_kept_only_within_it() -> None:
    servers = [srv(f"f{k}", 4, 1.0, gpu_type="F", order=k) for k in range(2)]
    running = [holding(f"r{k}", "lab", Config.single(f"f{k}", 4)) for k in range(2)]
    big = JobView(spec("big", 8, tenant="other"), waited_s=1e6)
    est = profiled(*running, big, types=("F",))
    drain = SchedulerSettings(
        solver="exact", reservations=True, reserve_min_gpus=8, reserve_after_lr=0.0, reserve_preempt=False
    )
    free = plan_round(snapshot(servers, [*running, big]), est, drain)
    assert [r.job_id for r in free.reservations] == ["big"] and set(free.assignments) == {"r0", "r1"}
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 4),)), "other": TenantQuota("other")}
    plan = plan_round(snapshot(servers, [*running, big], tenants=tenants), est, drain)
    assert use_of(plan.assignments, [*running, big], servers).get(("lab", "F"), 0) <= 4


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    ("quota", "widths", "kept_gpus"),
    [
        (TenantQuota("lab", cap_gpus=6), (2, 2, 4), 4),
        (TenantQuota("lab", type_caps=(("F", 6),)), (2, 2, 4), 4),
        (TenantQuota("lab", cap_gpus=4), (2, 2, 3), 4),
    ],
    ids=["cap_gpus", "cap_gpus_by_type", "narrow_first"],
)
def test_a_tenant_over_its_cap_loses_only_enough_of_its_draining_jobs(
    solver: str, quota: TenantQuota, widths: tuple[int, int, int], kept_gpus: int
) -> None:
    """Three jobs of `lab` drain two servers for a big job; a cap below their total stops one of them,
    not all three (the draining servers are closed to the program: a job not kept there leaves them),
    the narrowest kept first: with 2 + 2 + 3 GPUs under a cap of 4, the 3-GPU job leaves."""
    servers = [srv(f"f{k}", 4, 1.0, gpu_type="F", order=k) for k in range(2)]
    first, second, wide = widths
    running = [
        holding("r0", "lab", Config.single("f0", first)),
        holding("r1", "lab", Config.single("f0" if first + second <= 4 else "f1", second)),
        holding("r2", "lab", Config.single("f1", wide)),
    ]
    big = JobView(spec("big", 8, tenant="other"), waited_s=1e6)
    est = profiled(*running, big, types=("F",))
    drain = SchedulerSettings(
        solver=solver,  # type: ignore[arg-type]
        reservations=True,
        reserve_min_gpus=8,
        reserve_after_lr=0.0,
        reserve_preempt=False,
    )
    free = plan_round(snapshot(servers, [*running, big]), est, drain)
    assert [r.job_id for r in free.reservations] == ["big"] and set(free.assignments) == {"r0", "r1", "r2"}
    tenants = {"lab": quota, "other": TenantQuota("other")}
    plan = plan_round(snapshot(servers, [*running, big], tenants=tenants), est, drain)
    kept = {jid for jid, c in plan.assignments.items() if c == free.assignments.get(jid)}
    assert kept == {"r0", "r1"}
    assert use_of(plan.assignments, [*running, big], servers).get(("lab", "F"), 0) == kept_gpus


def test_the_fill_charges_what_it_places(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = fast_and_slow()
    views = [JobView(spec(f"t{k}", 1, tenant="lab"), waited_s=100.0 * (k + 1)) for k in range(4)]
    est = profiled(*views, types=("F", "S"))
    monkeypatch.setattr(class_model, "SMALL_PROGRAM", -1)
    monkeypatch.setattr(class_model, "_refinement_scope", lambda *a: ({}, None))  # all to the fill
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 1),))}
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver="classes"))
    assert len(plan.assignments) == 4
    assert use_of(plan.assignments, views, servers).get(("lab", "F"), 0) <= 1


@pytest.mark.parametrize("class_lp", [False, True])
def test_the_class_program_knows_the_caps_per_type(monkeypatch: pytest.MonkeyPatch, class_lp: bool) -> None:
    """A first-ranked tenant capped off the fast type, a second one free to use it: as many jobs run
    as in the exact program, with the class program solved (a large cluster's rounds) or skipped."""
    if class_lp:
        monkeypatch.setattr(class_model, "SMALL_PROGRAM", -1)
    servers = fast_and_slow()
    lab = [JobView(spec(f"l{k}", 4, tenant="lab"), waited_s=1e5) for k in range(2)]
    other = [JobView(spec(f"o{k}", 4, tenant="other"), waited_s=100.0) for k in range(2)]
    views = lab + other
    est = profiled(*views, types=("F", "S"))
    tenants = {"lab": TenantQuota("lab", type_caps=(("F", 0),)), "other": TenantQuota("other")}
    exact = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver="exact"))
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver="classes"))
    assert len(plan.assignments) == len(exact.assignments) == 4
    assert use_of(plan.assignments, views, servers).get(("lab", "F"), 0) == 0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.integers(16, 64),
    st.integers(0, 30),
    per_type(0, 12, 3),
    per_type(0, 12, 3),
    st.sampled_from(SOLVERS),
    st.sampled_from(["first", "fragment"]),
    st.floats(0.0, 1.0),
    st.integers(2, 8),
)
def test_caps_per_type_hold_with_reservations_on(
    seed: int,
    gpus: int,
    queued: int,
    caps_v: dict[str, int],
    caps_n: dict[str, int],
    solver: str,
    kind: str,
    busy: float,
    min_res: int,
) -> None:
    inst = busy_instance(seed, gpus, queued, busy_fraction=busy)
    tenants = {
        "vision": TenantQuota("vision", type_caps=tuple(sorted(caps_v.items()))),
        "nlp": TenantQuota("nlp", type_caps=tuple(sorted(caps_n.items()))),
    }
    snap = replace(inst.snapshot, tenants=tenants)
    on = SchedulerSettings(solver=solver, reservations=True, reserve_min_gpus=min_res, reserve_after_lr=0.0)  # type: ignore[arg-type]
    # reservations made without the caps are the next plan's `previous`
    uncapped = replace(inst.snapshot, tenants={"vision": TenantQuota("vision"), "nlp": TenantQuota("nlp")})
    previous = {r.job_id: r for r in plan_round(uncapped, inst.estimator, on).reservations}
    plan = (plan_round if kind == "first" else plan_fragments)(snap, inst.estimator, on, None, previous)
    smap = snap.server_map()
    tenant_of = {v.id: v.spec.tenant for v in snap.jobs}
    use = typecaps.held_by_type(((tenant_of[j], c) for j, c in plan.assignments.items()), smap)
    running = typecaps.held_by_type(
        ((v.spec.tenant, v.current) for v in snap.jobs if v.current is not None), smap
    )
    reserved = dict(running)
    for r in plan.reservations:
        for gpu_type, n in typecaps.gpus_by_type(r.config, smap).items():
            key = (tenant_of[r.job_id], gpu_type)
            reserved[key] = reserved.get(key, 0) + n
    for tenant, caps in (("vision", caps_v), ("nlp", caps_n)):
        for gpu_type, cap in caps.items():
            held_now = running.get((tenant, gpu_type), 0)
            limit = cap if kind == "first" else max(cap, held_now)  # a fragment plan keeps what runs
            assert use.get((tenant, gpu_type), 0) <= limit, (kind, tenant, gpu_type)
            assert reserved.get((tenant, gpu_type), 0) <= max(cap, held_now), (
                "reservations",
                tenant,
                gpu_type,
            )


@pytest.mark.parametrize("class_lp", [False, True])
def test_the_class_solver_keeps_a_tenant_cap_and_places_what_the_exact_one_does(
    monkeypatch: pytest.MonkeyPatch, class_lp: bool
) -> None:
    """The same with a tenant's total cap (`cap_gpus`), whose rows the class program's options now use
    too (here the fill would make up for them: this checks the answer, not the rows)."""
    if class_lp:
        monkeypatch.setattr(class_model, "SMALL_PROGRAM", -1)
    servers = fast_and_slow()
    lab = [JobView(spec(f"l{k}", 4, tenant="lab"), waited_s=1e5) for k in range(2)]
    other = [JobView(spec(f"o{k}", 2, tenant="other"), waited_s=100.0) for k in range(4)]
    views = lab + other
    est = profiled(*views, types=("F", "S"))
    tenants = {"lab": TenantQuota("lab", cap_gpus=4), "other": TenantQuota("other")}
    exact = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver="exact"))
    plan = plan_round(snapshot(servers, views, tenants=tenants), est, SchedulerSettings(solver="classes"))
    assert len(exact.assignments) == 5  # one lab job (its cap) and the four others
    assert len(plan.assignments) == 5
    assert sum(c.gpus for j, c in plan.assignments.items() if j.startswith("l")) == 4


def run_rounds(servers: list[Server], views: list[JobView], tenants: dict, rounds: int) -> int:
    """Plan `rounds` first plans in a row, each plan's outcome the next snapshot (a round apart);
    returns how many running jobs were preempted or moved."""
    est = profiled(*views, types=tuple(sorted({s.gpu_type for s in servers})))
    settings_ = SchedulerSettings(solver="exact")
    step = settings_.round_seconds
    changes = 0
    for _ in range(rounds):
        plan = plan_round(snapshot(servers, views, tenants=tenants), est, settings_)
        nxt = []
        for v in views:
            config = plan.assignments.get(v.id)
            if v.current is not None and config != v.current:
                changes += 1
            if config is None:
                nxt.append(replace(v, current=None, attempt_s=0.0, waited_s=v.waited_s + step))
            elif config == v.current:
                nxt.append(replace(v, attempt_s=v.attempt_s + step, running_s=v.running_s + step))
            else:
                nxt.append(replace(v, current=config, attempt_s=step, running_s=v.running_s + step))
        views = nxt
    return changes


def test_an_owners_jobs_within_its_guarantee_of_a_type_keep_their_gpus_round_after_round() -> None:
    """(From the review: the owner's job, once running, was preempted for a waiting guest, which made it
    owed again and the guest was checkpointed in turn: 7 preemptions in 12 rounds.)"""
    servers = [srv("s0", 4, 1.0, gpu_type="S", order=0), srv("s1", 4, 1.0, gpu_type="S", order=1)]
    views = [
        JobView(
            spec("o", 4, tenant="owner"), running_s=3000.0, attempt_s=3000.0, current=C(s0=4), waited_s=10.0
        ),
        JobView(
            spec("g0", 4, tenant="guest"), running_s=3000.0, attempt_s=3000.0, current=C(s1=4), waited_s=10.0
        ),
        JobView(spec("g1", 4, tenant="guest"), waited_s=20_000.0),
    ]
    tenants = {"owner": TenantQuota("owner", type_guarantees=(("S", 4),)), "guest": TenantQuota("guest")}
    assert run_rounds(servers, views, tenants, 12) <= 1  # g1 takes g0's turn once; the owner keeps its own


def test_a_guarantee_per_type_beside_a_general_one_does_not_rotate_their_jobs() -> None:
    servers = [srv("s0", 4, 1.0, gpu_type="S", order=0), srv("s1", 4, 1.0, gpu_type="S", order=1)]
    views = [
        JobView(spec("a", 4, tenant="A"), running_s=3000.0, attempt_s=3000.0, current=C(s0=4), waited_s=10.0),
        JobView(spec("c", 4, tenant="C"), running_s=3000.0, attempt_s=3000.0, current=C(s1=4), waited_s=10.0),
        JobView(spec("b", 4, tenant="B"), waited_s=100.0),
    ]
    tenants = {
        "A": TenantQuota("A", type_guarantees=(("S", 4),)),
        "B": TenantQuota("B", guaranteed_gpus=4),
        "C": TenantQuota("C"),
    }
    assert run_rounds(servers, views, tenants, 10) <= 1  # the borrower c gives way to b, once


def one_fast_two_slow(fast_gpus: int) -> list[Server]:
    return [
        srv("f0", fast_gpus, 3.0, gpu_type="F", order=0),
        srv("s0", 4, 1.0, gpu_type="S", order=1),
        srv("s1", 4, 1.0, gpu_type="S", order=2),
    ]


def slow_guests() -> list[JobView]:
    """Two long-running 4-GPU jobs of tenant "guest" holding both slow servers."""
    return [holding(f"g{k}", "guest", Config.single(f"s{k}", 4), attempt_s=5e3) for k in range(2)]


def test_no_gpus_are_kept_for_a_job_the_type_or_the_owners_caps_cannot_take() -> None:
    servers = one_fast_two_slow(8)
    guests = slow_guests()
    wide = JobView(
        replace(spec("o", 8, tenant="owner"), one_server=True), waited_s=50.0
    )  # no S server holds 8
    est = profiled(*guests, wide, types=("F", "S"))
    owner = {"owner": TenantQuota("owner", type_guarantees=(("S", 8),)), "guest": TenantQuota("guest")}
    assert typecaps.plan_limits(snapshot(servers, [*guests, wide], tenants=owner), est) == ({}, {})
    mine = JobView(spec("m", 4, tenant="owner"), running_s=10.0, attempt_s=10.0, current=C(f0=4))
    more = JobView(spec("o", 4, tenant="owner"), waited_s=50.0)
    capped = {
        "owner": TenantQuota("owner", cap_gpus=4, type_guarantees=(("S", 4),)),
        "guest": TenantQuota("guest"),
    }
    est = profiled(*guests, mine, more, types=("F", "S"))
    assert typecaps.plan_limits(snapshot(servers, [*guests, mine, more], tenants=capped), est) == ({}, {})


def test_a_job_not_profiled_on_the_type_is_owed_by_its_transfer_estimate() -> None:
    """The type was full of borrowers when the owner's job came: it was profiled elsewhere only."""
    servers = one_fast_two_slow(4)
    guests = slow_guests()
    busy = JobView(spec("x", 4, tenant="guest"), running_s=10.0, attempt_s=10.0, current=C(f0=4))
    owner = JobView(spec("o", 4, tenant="owner"), waited_s=50.0)
    est = profiled(*guests, busy, types=("F", "S"))
    est.add_profile("o", "F", PROFILE, Calibration())
    tenants = {"owner": TenantQuota("owner", type_guarantees=(("S", 4),)), "guest": TenantQuota("guest")}
    plan = plan_round(
        snapshot(servers, [*guests, busy, owner], tenants=tenants), est, SchedulerSettings(solver="exact")
    )
    assert plan.assignments["o"].servers[0].startswith("s")  # on the transfer prior's rate


def test_a_fragment_plan_keeps_room_for_the_owner() -> None:
    servers = [srv("s0", 4, 1.0, gpu_type="S", order=0), srv("s1", 4, 1.0, gpu_type="S", order=1)]
    mine = JobView(spec("m", 4, tenant="owner"), running_s=500.0, attempt_s=500.0, current=C(s0=4))
    more = JobView(spec("o", 4, tenant="owner"), waited_s=10.0)
    guest = JobView(spec("g", 4, tenant="guest"), waited_s=5_000.0)  # first by priority
    est = profiled(mine, more, guest, types=("S",))
    settings_ = SchedulerSettings(solver="exact")
    free = {"owner": TenantQuota("owner"), "guest": TenantQuota("guest")}
    assert plan_fragments(
        snapshot(servers, [mine, more, guest], tenants=free), est, settings_
    ).assignments.get("g")
    tenants = {"owner": TenantQuota("owner", type_guarantees=(("S", 8),)), "guest": TenantQuota("guest")}
    plan = plan_fragments(snapshot(servers, [mine, more, guest], tenants=tenants), est, settings_)
    assert "g" not in plan.assignments and plan.assignments["o"] == C(s1=4)


def test_two_guarantees_on_a_type_with_servers_down_leave_no_type_idle() -> None:
    """(From the second review: two owners guaranteed 4 of S each, and half of S down: each row used
    to forbid the other owner's jobs, and S stood idle round after round.)"""
    servers = [srv("s0", 4, gpu_type="S", order=0), srv("s1", 4, gpu_type="S", order=1)]
    a = holding("a", "A", C(s0=4), attempt_s=3000.0)
    b = JobView(spec("b", 4, tenant="B"), waited_s=100.0)
    tenants = {
        "A": TenantQuota("A", type_guarantees=(("S", 4),)),
        "B": TenantQuota("B", type_guarantees=(("S", 4),)),
    }
    snap = snapshot(servers, [a, b], capacity={"s0": 4, "s1": 0}, tenants=tenants)
    est = profiled(a, b, types=("S",))
    assert typecaps.plan_limits(snap, est) == ({("!A", "S"): 0}, {})  # no room owed to B: A keeps s0
    plan = plan_round(snap, est, SchedulerSettings(solver="exact"))
    assert plan.assignments == {"a": C(s0=4)}


def test_a_guests_job_is_kept_where_the_owner_leaves_room() -> None:
    """(From the second review: with the owner holding GPUs of the type, a guest's job the solver left
    out was no longer kept, though the row had room for it.)"""
    servers = [srv("s1", 4, gpu_type="S"), srv("s2", 4, gpu_type="S", order=1)]
    guest = holding("r", "guest", C(s1=1), attempt_s=5000.0)
    owner = holding("o", "owner", C(s2=1), attempt_s=5000.0)
    est = profiled(guest, owner, types=("S",))
    tenants = {"owner": TenantQuota("owner", type_guarantees=(("S", 4),)), "guest": TenantQuota("guest")}
    state = replace(
        RoundState(
            snapshot(servers, [guest, owner], tenants=tenants),
            est,
            SchedulerSettings(),
            {s.id: s for s in servers},
            {},
            {},
            {},
            {},
            4,
        ),
        type_limits={("!owner", "S"): 7},
    )
    assignment = {"o": C(s2=1)}  # the program left r out for nothing
    keep_changes_that_free_nothing(
        state, [guest, owner], {"s1": 4, "s2": 4}, {"r": C(s1=1), "o": C(s2=1)}, assignment
    )
    assert assignment["r"] == C(s1=1)
    state = replace(state, type_limits={("!owner", "S"): 0})  # no room: it is not kept
    assignment = {"o": C(s2=1)}
    keep_changes_that_free_nothing(
        state, [guest, owner], {"s1": 4, "s2": 4}, {"r": C(s1=1), "o": C(s2=1)}, assignment
    )
    assert "r" not in assignment


def test_the_owners_total_cap_is_shared_by_its_guarantees_on_several_types() -> None:
    servers = [
        srv("s0", 4, gpu_type="S", order=0),
        srv("f0", 4, gpu_type="F", order=1),
        srv("v0", 8, gpu_type="V", order=2),
    ]
    views = [
        holding("ov", "owner", C(v0=8), attempt_s=3000.0),
        JobView(spec("os", 4, tenant="owner"), waited_s=100.0),
        JobView(spec("of", 4, tenant="owner"), waited_s=90.0),
        holding("g1", "guest", C(s0=4), attempt_s=3000.0),
        holding("g2", "guest", C(f0=4), attempt_s=3000.0),
    ]
    est = profiled(*views, types=("S", "F", "V"))
    tenants = {
        "owner": TenantQuota("owner", cap_gpus=12, type_guarantees=(("F", 4), ("S", 4))),
        "guest": TenantQuota("guest"),
    }
    limits, owed = typecaps.plan_limits(snapshot(servers, views, tenants=tenants), est)
    assert len(owed) == 1  # the cap leaves room for one of the two waiting jobs
    assert len([key for key in limits if key[0] == "!owner"]) == 1
