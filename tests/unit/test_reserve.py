"""Reservations for big waiting jobs and backfill on their servers (hopsmgr.core.reserve), through the
planner: which servers are reserved, what drains, what is backfilled, when the job starts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hopsmgr.core.estimator import Estimator, TimeProfile
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
from hopsmgr.core.planner import plan_fragments, plan_round
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import HopsPolicy

PROFILE = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)
RATE = 32 / 0.3  # samples/s of one GPU
NOW = 10_000.0
SETTINGS = SchedulerSettings(
    solver="exact", gap=0.0, fairshare=False, reservations=True, reserve_preempt=False
)
PREEMPTING = replace(SETTINGS, reserve_preempt=True)


def server(sid: str, order: int) -> Server:
    return Server(sid, "A", 8, Calibration(), order=order)


SERVERS = [server("s0", 0), server("s1", 1), server("s2", 2)]


def job(jid: str, gpus: int, samples: float, tenant: str = "default") -> JobSpec:
    return JobSpec(jid, RequirementSet.of((gpus,)), samples, 32, tenant=tenant, restart_s=30.0)


def running(jid: str, config: Config, left_s: float, started_s: float = 3_000.0) -> JobView:
    """A job on `config` with about `left_s` seconds of work left, its attempt `started_s` old."""
    total = 1e8
    left = left_s * RATE * config.gpus
    return JobView(job(jid, config.gpus, total), total - left, 0.0, current=config, attempt_s=started_s)


def waiting(jid: str, gpus: int, run_s: float, waited_s: float, tenant: str = "default") -> JobView:
    return JobView(job(jid, gpus, run_s * RATE * gpus, tenant), waited_s=waited_s)


def snap(views: list[JobView], tenants: dict[str, TenantQuota] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot(tuple(SERVERS), {s.id: 8 for s in SERVERS}, tuple(views), NOW, dict(tenants or {}))


def estimator(views: list[JobView]) -> Estimator:
    est = Estimator()
    for v in views:
        est.add_profile(v.id, "A", PROFILE, Calibration())
    return est


def scene(big_waited_s: float = 20_000.0, young: bool = False) -> list[JobView]:
    """s0: one job ending in ~100 s; s1: one job ending in ~5,000 s; s2: half busy until ~400 s, half idle.
    Waiting: a 16-GPU job (expected run ~1,000 s), a short and a long 1-GPU job."""
    age = 60.0 if young else 3_000.0
    return [
        running("r0", Config.single("s0", 8), 100.0, started_s=age),
        running("r1", Config.single("s1", 8), 5_000.0, started_s=60.0),  # protected: not preempted
        running("r2", Config.single("s2", 4), 400.0, started_s=age),
        waiting("big", 16, 1_000.0, big_waited_s),
        waiting("short", 1, 60.0, 10.0),
        waiting("long", 1, 20_000.0, 10.0),
    ]


def test_big_job_gets_the_servers_that_free_soonest_and_they_drain() -> None:
    views = scene()
    plan = plan_round(snap(views), estimator(views), SETTINGS)
    (r,) = plan.reservations
    assert r.job_id == "big" and r.config == Config.of({"s0": 8, "s2": 8})
    assert r.start_s == pytest.approx(NOW + 400.0, rel=0.01)  # s2's job ends last of the two
    assert "big" not in plan.assignments
    assert plan.assignments["r0"] == views[0].current and plan.assignments["r2"] == views[2].current
    # The short job ends before the reservation starts: backfilled onto s2's idle half.
    assert plan.assignments["short"] == Config.single("s2", 1)
    assert set(plan.backfills) == {"short"} and plan.backfills["short"].reserved_for == "big"
    assert plan.backfills["short"].finish_p90_s <= r.start_s
    # The long one would hold reserved GPUs past the start: nothing new elsewhere either (s1 is full).
    assert "long" not in plan.assignments
    assert "reservation" in plan.explain["big"].note


def test_without_reservations_the_idle_gpus_go_to_whoever_fits() -> None:
    views = scene(young=True)  # nothing can be preempted for the big job
    plan = plan_round(snap(views), estimator(views), replace(SETTINGS, reservations=False))
    assert plan.reservations == () and plan.backfills == {}
    assert "long" in plan.assignments  # the long job takes s2's idle half, delaying any 16-GPU start


def test_a_young_big_job_gets_no_reservation() -> None:
    views = scene(big_waited_s=100.0)  # latency ratio 0.1 < reserve_after_lr
    plan = plan_round(snap(views), estimator(views), SETTINGS)
    assert plan.reservations == ()


def test_the_job_starts_on_its_reservation_once_the_gpus_are_free() -> None:
    views = scene()
    est = estimator(views)
    policy = HopsPolicy(SETTINGS)
    first = policy.plan(snap(views), est, "first", lambda: 0.0)
    (r,) = first.reservations
    # r0 and r2 ended; the short backfill ended too.
    later = [v for v in views if v.id in ("r1", "big", "long")]
    big = replace(later[1], waited_s=later[1].waited_s + 500.0)
    snapshot = replace(snap([later[0], big, later[2]]), now=NOW + 500.0)
    plan = policy.plan(snapshot, est, "fragment", lambda: 0.0)
    assert plan.assignments["big"] == r.config
    assert plan.reservations[0].since_s == NOW  # the same reservation, kept across plans


def test_reserved_servers_are_kept_across_plans_unless_others_free_a_round_sooner() -> None:
    views = scene()
    est = estimator(views)
    policy = HopsPolicy(SETTINGS)
    (r,) = policy.plan(snap(views), est, "first", lambda: 0.0).reservations
    # s1's job now looks like ending in 450 s: later than s2 (400 s), so nothing changes; a server
    # freeing only a little sooner than the kept set does not move the reservation either.
    views2 = [
        running("r1", Config.single("s1", 8), 390.0, started_s=60.0),
        *[v for v in views if v.id != "r1"],
    ]
    (again,) = policy.plan(snap(views2), est, "first", lambda: 0.0).reservations
    assert again.config == r.config


def test_a_job_that_overran_the_reservation_is_preempted_unless_protected() -> None:
    views = scene()
    est = estimator(views)
    policy = HopsPolicy(SETTINGS)
    (_reservation,) = policy.plan(snap(views), est, "first", lambda: 0.0).reservations
    # Two rounds past the start, r2 still runs (it overran its estimate); r0 is gone.
    late = NOW + 400.0 + 2 * SETTINGS.round_seconds
    r2 = replace(views[2], done_samples=views[2].done_samples - 50 * RATE * 4)
    rest = [views[1], r2, replace(views[3], waited_s=30_000.0)]
    plan = policy.plan(replace(snap(rest), now=late), est, "first", lambda: 0.0)
    assert "r2" not in plan.assignments or plan.assignments["r2"] != r2.current
    young = replace(r2, attempt_s=10.0)  # protected: its attempt is younger than min_attempt_s
    plan = policy.plan(replace(snap([views[1], young, rest[2]]), now=late), est, "first", lambda: 0.0)
    assert plan.assignments["r2"] == young.current


def test_backfill_respects_tenant_caps() -> None:
    views = scene()
    views[4] = waiting("short", 1, 60.0, 10.0, tenant="capped")
    tenants = {"capped": TenantQuota("capped", cap_gpus=0), "default": TenantQuota("default")}
    plan = plan_round(snap(views, tenants), estimator(views), SETTINGS)
    assert "short" not in plan.assignments


def test_fragment_plans_keep_the_reserved_servers_closed() -> None:
    views = scene()
    plan = plan_fragments(snap(views), estimator(views), SETTINGS)
    assert [r.job_id for r in plan.reservations] == ["big"]
    assert "long" not in plan.assignments and plan.assignments.get("short") == Config.single("s2", 1)


def test_with_reserve_preempt_long_jobs_on_the_reserved_servers_are_checkpointed() -> None:
    # r2 would run 400 s more: checkpointing it (this plan, its attempt is not protected) frees its
    # GPUs sooner; r0 ends within the checkpoint time and is kept; a protected job would be kept too.
    views = scene()
    views[0] = running("r0", Config.single("s0", 8), 2.0)
    plan = plan_round(snap(views), estimator(views), PREEMPTING)
    (r,) = plan.reservations
    assert r.config == Config.of({"s0": 8, "s2": 8})
    assert r.start_s < NOW + 30.0  # r2's checkpoint, not its end
    assert plan.assignments["r0"] == views[0].current
    assert "r2" not in plan.assignments or plan.assignments["r2"] != views[2].current
    assert "short" not in plan.backfills  # nothing ends before the reservation starts
    young = scene(young=True)
    plan = plan_round(snap(young), estimator(young), PREEMPTING)
    assert plan.assignments["r2"] == young[2].current  # protected: kept; the start waits for it


def test_a_reservation_survives_gpus_briefly_out_of_the_capacity() -> None:
    views = scene()
    est = estimator(views)
    policy = HopsPolicy(SETTINGS)
    (r,) = policy.plan(snap(views), est, "first", lambda: 0.0).reservations
    # A profiling run (or a checkpoint being written) takes one of s0's GPUs for a while: the
    # reservation stays, and s2's idle GPUs stay closed to the long job.
    dipped = replace(snap(views), capacity={"s0": 7, "s1": 8, "s2": 8}, now=NOW + 10.0)
    plan = policy.plan(dipped, est, "fragment", lambda: 0.0)
    assert [x.config for x in plan.reservations] == [r.config]
    assert "long" not in plan.assignments


def test_profiling_keeps_off_reserved_servers() -> None:
    policy = HopsPolicy(SETTINGS)
    views = scene()
    policy.plan(snap(views), estimator(views), "first", lambda: 0.0)
    assert policy.reserved_servers == frozenset({"s0", "s2"})


def test_compute_plan_puts_no_profiling_run_on_reserved_servers() -> None:
    from hopsmgr.control.commands import PlanRequest
    from hopsmgr.control.planning import compute_plan

    views = scene()
    views[1] = running("r1", Config.single("s1", 6), 5_000.0, started_s=60.0)  # s1: 2 idle GPUs
    est = estimator(views)
    policy = HopsPolicy(SETTINGS)
    policy.plan(snap(views), est, "first", lambda: 0.0)  # reserves s0 and s2 (s2 has 4 idle GPUs)
    assert policy.reserved_servers == frozenset({"s0", "s2"})
    new = job("new", 1, 1e5)
    request = PlanRequest("t", 1, "fragment", snap(views), (new,), profiling_budget=8)
    ready = compute_plan(request, policy, est, lambda: 0.0)
    assert [r.server_id for r in ready.runs] == ["s1"]  # not s2, the server with the most idle GPUs
    policy.reservations = {}
    ready = compute_plan(request, policy, est, lambda: 0.0)
    assert [r.server_id for r in ready.runs] == ["s2"]


def test_reservations_never_take_a_tenant_over_its_cap() -> None:
    # Cap 12: a running 4-GPU job and two waiting 8-GPU jobs of the tenant; only one may start.
    servers = [Server(f"t{k}", "A", 8, Calibration(), order=k) for k in range(4)]
    views = [
        running("r", Config.single("t0", 4), 5_000.0, started_s=60.0),
        waiting("b1", 8, 1_000.0, 20_000.0),
        waiting("b2", 8, 1_000.0, 19_000.0),
    ]
    views[0] = replace(views[0], spec=replace(views[0].spec, tenant="lab"))
    views[1] = replace(views[1], spec=replace(views[1].spec, tenant="lab"))
    views[2] = replace(views[2], spec=replace(views[2].spec, tenant="lab"))
    snapshot = ClusterSnapshot(
        tuple(servers),
        {s.id: 8 for s in servers},
        tuple(views),
        NOW,
        {"lab": TenantQuota("lab", cap_gpus=12)},
    )
    plan = plan_round(snapshot, estimator(views), SETTINGS)
    held = sum(c.gpus for c in plan.assignments.values())
    assert held <= 12, plan.assignments
    assert sum(r.config.gpus for r in plan.reservations) <= 8


def test_jobs_kept_for_a_drain_never_overfill_a_shrunken_server() -> None:
    # s2's capacity fell to 3 (a profiling run took a GPU): the protected r2 (4 GPUs) no longer fits,
    # and keeping it for the drain must not put it back over the capacity.
    views = scene(young=True)
    cap = {"s0": 8, "s1": 8, "s2": 3}
    snap_ = replace(snap(views), capacity=cap)
    plan = plan_round(snap_, estimator(views), SETTINGS)
    used: dict[str, int] = {}
    for config in plan.assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    assert all(used.get(sid, 0) <= n for sid, n in cap.items()), plan.assignments


@pytest.mark.parametrize("reservations", [True, False])
def test_fragment_plans_leave_idle_backfill_to_a_held_reservation(
    monkeypatch: pytest.MonkeyPatch, reservations: bool
) -> None:
    # While a reservation is held its own backfill rule decides (a job must end before it starts); the
    # idle backfill of fragment plans (jobs from behind the window that fit the idle GPUs) waits.
    from hopsmgr.core import planner

    calls: list[int] = []
    real = planner.idle_backfill

    def spy(window: list[JobView], ordered: list[JobView], idle_gpus: int) -> list[JobView]:
        calls.append(idle_gpus)
        return real(window, ordered, idle_gpus)

    monkeypatch.setattr(planner, "idle_backfill", spy)
    views = scene()
    settings = replace(SETTINGS, reservations=reservations, idle_backfill=True)
    plan = plan_fragments(snap(views), estimator(views), settings)
    assert bool(plan.reservations) is reservations
    assert bool(calls) is not reservations


def test_backfill_respects_caps_per_gpu_type() -> None:
    views = scene()
    views[4] = waiting("short", 1, 60.0, 10.0, tenant="capped")
    free = {"capped": TenantQuota("capped"), "default": TenantQuota("default")}
    assert "short" in plan_round(snap(views, free), estimator(views), SETTINGS).backfills
    gpu_type = SERVERS[0].gpu_type
    tenants = {**free, "capped": TenantQuota("capped", type_caps=((gpu_type, 0),))}
    plan = plan_round(snap(views, tenants), estimator(views), SETTINGS)
    assert "short" not in plan.assignments


def test_two_backfills_of_one_tenant_share_its_cap_per_gpu_type() -> None:
    views = scene()
    views[4] = waiting("short", 1, 60.0, 10.0, tenant="capped")
    views.append(waiting("short2", 1, 60.0, 10.0, tenant="capped"))
    free = {"capped": TenantQuota("capped"), "default": TenantQuota("default")}
    assert {"short", "short2"} <= set(plan_round(snap(views, free), estimator(views), SETTINGS).backfills)
    tenants = {**free, "capped": TenantQuota("capped", type_caps=((SERVERS[0].gpu_type, 1),))}
    plan = plan_round(snap(views, tenants), estimator(views), SETTINGS)
    assert sum(1 for j in ("short", "short2") if j in plan.assignments) <= 1
