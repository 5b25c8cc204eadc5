"""Unit tests of the baseline policies (Gavel, Sia, FIFO), their shared placement helpers and the registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.model import (
    Calibration,
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    Server,
)
from hopsmgr.core.planner import Plan
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import Policy
from hopsmgr.policies.fifo import FifoPolicy
from hopsmgr.policies.gavel import GavelPolicy, equal_share_rate, max_min_allocation
from hopsmgr.policies.placement import pack
from hopsmgr.policies.registry import POLICY_NAMES, make_policy
from hopsmgr.policies.sia import SiaPolicy, restart_factor
from tests.helpers.builders import job_spec, snapshot

BASELINES = ("gavel", "gavel-lr", "sia", "sia-lr", "fifo")


def no_time() -> float:
    return 0.0


def profile(speed: float) -> TimeProfile:
    """No data time, no parameters to reduce: per-GPU rate = batch * speed / 0.31, linear in the GPU count."""
    return TimeProfile(tf_s=0.1 / speed, tb_s=0.2 / speed, tu_s=0.01 / speed, td_hit_s=0.0, td_miss_s=0.0)


def spec(job_id: str, counts: Sequence[int], submit: float = 0.0, restart_s: float = 60.0) -> JobSpec:
    return job_spec(job_id, counts, samples=1e9, submit=submit, restart_s=restart_s)


def estimator(speeds: Mapping[str, Mapping[str, float]]) -> Estimator:
    est = Estimator()
    for job_id, per_type in speeds.items():
        for gpu_type, speed in per_type.items():
            est.add_profile(job_id, gpu_type, profile(speed), Calibration())
    return est


def applied(snap: ClusterSnapshot, plan: Plan, dt: float) -> ClusterSnapshot:
    """The next snapshot, `dt` later, once the plan's placements ran (jobs left out wait)."""
    views = []
    for v in snap.jobs:
        config = plan.assignments.get(v.id)
        moved = v.current is not None and config != v.current
        views.append(
            replace(
                v,
                current=config,
                running_s=v.running_s + (dt if config is not None else 0.0),
                waited_s=v.waited_s + (dt if config is None else 0.0),
                restarts=v.restarts + (1 if moved else 0),
            )
        )
    return replace(snap, jobs=tuple(views), now=snap.now + dt)


def check_plan(snap: ClusterSnapshot, est: Estimator, plan: Plan, name: str) -> None:
    servers = snap.server_map()
    views = {v.id: v for v in snap.jobs}
    used: dict[str, int] = {}
    for job_id, config in plan.assignments.items():
        assert job_id in views and job_id not in plan.unplaceable
        reqs = views[job_id].spec.requirements
        assert config.gpus in reqs
        if name.startswith("gavel") and plan.kind == "first":
            assert config.gpus == reqs.median
        types = {servers[sid].gpu_type for sid in config.servers}
        if plan.kind == "first" and not (name == "fifo" and config == views[job_id].current):
            assert all(est.has_profile(job_id, t) for t in types)
        if not name.startswith("fifo"):
            assert len(types) == 1
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    for sid, n in used.items():
        assert n <= snap.capacity.get(sid, 0), (
            f"{name}: server {sid} given {n} of {snap.capacity.get(sid, 0)}"
        )
    assert plan.idle_gpus == sum(snap.capacity.values()) - sum(used.values())
    assert plan.now == snap.now
    assert set(plan.order) <= set(views)


# -- every baseline on random busy clusters -----------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    gpus=st.integers(16, 64),
    queued=st.integers(0, 30),
    drain=st.booleans(),
    name=st.sampled_from(BASELINES),
)
def test_baselines_respect_capacity_and_requirements(
    seed: int, gpus: int, queued: int, drain: bool, name: str
) -> None:
    inst = busy_instance(seed, gpus, queued)
    snap = inst.snapshot
    if drain:  # a drained server: its jobs must move or wait
        snap = replace(snap, capacity={**snap.capacity, snap.servers[0].id: 0})
    policy = make_policy(name, SchedulerSettings())
    for round_no in range(3):
        plan = policy.plan(snap, inst.estimator, "first", no_time)
        check_plan(snap, inst.estimator, plan, name)
        if name == "fifo" and not drain:  # no preemption
            assert all(plan.assignments.get(v.id) == v.current for v in snap.jobs if v.current is not None)
        fragment = policy.plan(snap, inst.estimator, "fragment", no_time)
        check_plan(snap, inst.estimator, fragment, name)
        snap = applied(snap, plan, policy.round_seconds * (round_no + 1))


# -- shared helpers -----------------------------------------------------------------------------------


def test_pack_best_fit_then_fewest_servers() -> None:
    servers = [Server(f"s{k}", "v100", 8) for k in range(4)]
    free = {"s0": 6, "s1": 3, "s2": 8, "s3": 5}
    assert pack(servers, free, 3) == Config.single("s1", 3)  # the tightest server that holds it
    assert pack(servers, free, 7) == Config.single("s2", 7)
    assert pack(servers, free, 12) == Config.of({"s2": 8, "s3": 4})  # two servers, last piece best fit
    assert pack(servers, free, 22) == Config.of(free)
    assert pack(servers, free, 23) is None
    assert pack(servers, free, 0) is None


# -- Gavel --------------------------------------------------------------------------------------------


def test_gavel_uses_the_median_as_rigid_size() -> None:
    servers = [Server("s0", "v100", 8)]
    jobs = [spec("a", [1, 2, 4]), spec("b", [2, 4, 8, 16]), spec("c", [1, 16, 32])]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    plan = GavelPolicy().plan(snapshot(servers, [JobView(j) for j in jobs]), est, "first", no_time)
    assert plan.assignments["a"].gpus == 2
    assert plan.assignments["b"].gpus == 4
    assert "c" not in plan.assignments and "16" in plan.unplaceable["c"]


def test_gavel_lp_gives_the_fast_type_to_the_job_that_gains_most() -> None:
    rates = {"a": {"k80": 1.0, "a100": 4.0}, "b": {"k80": 1.0, "a100": 1.0}}
    assert equal_share_rate(rates["a"], {"k80": 1, "a100": 1}) == pytest.approx(2.5)
    alloc = max_min_allocation({"a": 1, "b": 1}, {}, rates, {"k80": 1, "a100": 1})
    assert alloc.x["a"]["a100"] > alloc.x["b"]["a100"]
    assert alloc.x["a"]["a100"] == pytest.approx(1.0, abs=1e-4)
    assert alloc.x["b"]["k80"] == pytest.approx(1.0, abs=1e-4)
    assert alloc.t == pytest.approx(1.0, abs=1e-4)  # b gets its equal-split throughput, a more than its own

    servers = [Server("f0", "a100", 1), Server("s0", "k80", 1)]
    est = estimator({"a": {"k80": 1.0, "a100": 4.0}, "b": {"k80": 1.0, "a100": 1.0}})
    views = [JobView(spec("a", [1])), JobView(spec("b", [1]))]
    plan = GavelPolicy().plan(snapshot(servers, views), est, "first", no_time)
    assert plan.assignments == {"a": Config.single("f0", 1), "b": Config.single("s0", 1)}
    assert plan.stats.method.startswith("lp") and plan.stats.variables == 5


def test_gavel_priorities_rotate_so_every_job_gets_turns() -> None:
    servers = [Server("s0", "v100", 1)]
    jobs = [spec(f"j{k}", [1]) for k in range(3)]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    snap = snapshot(servers, [JobView(j) for j in jobs])
    policy = GavelPolicy()
    turns: list[str] = []
    for _ in range(6):
        plan = policy.plan(snap, est, "first", no_time)
        assert len(plan.assignments) == 1
        turns.extend(plan.assignments)
        snap = applied(snap, plan, policy.round_seconds)
    assert sorted(turns[:3]) == ["j0", "j1", "j2"]  # a starved job (infinite priority) goes next
    assert all(turns.count(j.id) == 2 for j in jobs)


def test_gavel_starved_job_beats_a_served_one_after_joining() -> None:
    servers = [Server("s0", "v100", 2)]
    jobs = [spec("old", [2]), spec("new", [2], submit=500.0)]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    policy = GavelPolicy()
    snap = snapshot(servers, [JobView(jobs[0])])
    for _ in range(2):
        snap = applied(snap, policy.plan(snap, est, "first", no_time), 360.0)
    snap = replace(snap, jobs=(*snap.jobs, JobView(jobs[1], waited_s=220.0)))
    plan = policy.plan(snap, est, "first", no_time)
    assert list(plan.assignments) == ["new"]
    # as in Gavel's simulator, the new job starts with half a round (180 s of the type's 900 s: the old
    # job's half round and its two rounds)
    assert policy.priority("new", "v100") == pytest.approx(0.5 / (180 / 900), rel=1e-4)
    assert policy.priority("old", "v100") == pytest.approx(0.5 / (900 / 900), rel=1e-4)
    assert plan.priorities["new"] > plan.priorities["old"]


def test_gavel_counts_received_time_as_its_simulator_does() -> None:
    # a 4-GPU and a 1-GPU job both run a whole round: each received the round once, whatever its width;
    # its share is over the sum of all jobs' times on the type plus their half rounds (Gavel's simulator)
    servers = [Server("s0", "v100", 4), Server("s1", "v100", 1)]
    jobs = [spec("wide", [4]), spec("narrow", [1])]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    policy = GavelPolicy()
    snap = snapshot(servers, [JobView(j) for j in jobs])
    snap = applied(snap, policy.plan(snap, est, "first", no_time), 360.0)
    policy.plan(snap, est, "first", no_time)
    total = 2 * 180 + 360 + 360
    x_wide, x_narrow = (policy._ledger.x[j]["v100"] for j in ("wide", "narrow"))
    assert policy.priority("wide", "v100") == pytest.approx(x_wide / ((180 + 360) / total), rel=1e-4)
    assert policy.priority("narrow", "v100") == pytest.approx(x_narrow / ((180 + 360) / total), rel=1e-4)
    assert policy._ledger.received["wide"]["v100"] == policy._ledger.received["narrow"]["v100"] == 540


def test_gavel_keeps_a_selected_job_on_its_previous_gpus() -> None:
    servers = [Server("s0", "v100", 4), Server("s1", "v100", 4)]
    jobs = [spec("a", [2]), spec("b", [2]), spec("c", [4])]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    views = [
        JobView(jobs[0], current=Config.single("s0", 2), running_s=100.0),
        JobView(jobs[1]),
        JobView(jobs[2]),
    ]
    plan = GavelPolicy().plan(snapshot(servers, views), est, "first", no_time)
    # Larger-first best fit alone would put c on s0 and move a; a stays, c goes to s1.
    assert plan.assignments["a"] == Config.single("s0", 2)
    assert plan.assignments["c"] == Config.single("s1", 4)
    assert plan.assignments["b"] == Config.single("s0", 2)


def test_gavel_latency_ratio_order_serves_the_longest_relative_wait() -> None:
    servers = [Server("s0", "v100", 1)]
    jobs = [spec("early", [1]), spec("late", [1], submit=10.0)]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    views = [JobView(jobs[0], waited_s=10.0), JobView(jobs[1], waited_s=1000.0)]
    snap = snapshot(servers, views, now=1000.0)
    assert list(GavelPolicy().plan(snap, est, "first", no_time).assignments) == ["early"]
    lr = GavelPolicy(queue_order="latency_ratio").plan(snap, est, "first", no_time)
    assert list(lr.assignments) == ["late"] and lr.order[0] == "late"


@pytest.mark.parametrize("policy", [GavelPolicy(), SiaPolicy()])
def test_no_fragment_plans_keep_current_placements(policy: Policy) -> None:
    servers = [Server("s0", "v100", 4)]
    jobs = [spec("a", [1]), spec("b", [1])]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    views = [JobView(jobs[0], current=Config.single("s0", 1)), JobView(jobs[1])]
    plan = policy.plan(snapshot(servers, views), est, "fragment", no_time)
    assert not policy.fragment_plans
    assert plan.assignments == {"a": Config.single("s0", 1)} and plan.idle_gpus == 3


def test_policies_reject_bad_parameters() -> None:
    with pytest.raises(ValueError, match="queue_order"):
        GavelPolicy(queue_order="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="p must"):
        SiaPolicy(p=0.0)
    with pytest.raises(ValueError, match="round_seconds"):
        FifoPolicy(round_seconds=0.0)


# -- Sia ----------------------------------------------------------------------------------------------


def test_restart_factor_formula() -> None:
    assert restart_factor(100.0, 0, 60.0) == pytest.approx(100 / 160)
    assert restart_factor(100.0, 1, 60.0) == pytest.approx(40 / 160)
    assert restart_factor(100.0, 2, 60.0) == 0.0
    assert restart_factor(0.0, 0, 0.0) == 1.0


@pytest.mark.parametrize(
    ("running_s", "restarts", "expected"),
    [(100.0, 1, Config.single("s1", 2)), (10_000.0, 0, None)],
)
def test_sia_keeps_a_running_configuration_unless_the_gain_beats_the_restart_factor(
    running_s: float, restarts: int, expected: Config | None
) -> None:
    servers = [Server("s0", "v100", 8), Server("s1", "v100", 8)]
    job = spec("a", [2, 4], restart_s=60.0)
    est = estimator({"a": {"v100": 1.0}})
    view = JobView(job, current=Config.single("s1", 2), running_s=running_s, restarts=restarts)
    plan = SiaPolicy().plan(snapshot(servers, [view]), est, "first", no_time)
    if expected is not None:
        # r = 40/160: G(4) = 2 * 0.25 = 0.5, 0.5^-0.5 > lambda_n: moving is worse than keeping G = 1.
        assert plan.assignments["a"] == expected
    else:
        # r ~ 0.994: G(4) ~ 1.99 pays for the restart.
        assert plan.assignments["a"].gpus == 4


def test_sia_allocates_every_job_when_capacity_allows() -> None:
    servers = [Server("s0", "v100", 8), Server("s1", "t4", 4)]
    jobs = [spec("a", [1, 2, 4]), spec("b", [1, 2]), spec("c", [1]), spec("d", [2]), spec("e", [4])]
    est = estimator({j.id: {"v100": 2.0, "t4": 1.0} for j in jobs})
    plan = SiaPolicy(p=-0.5).plan(snapshot(servers, [JobView(j) for j in jobs]), est, "first", no_time)
    assert set(plan.assignments) == {j.id for j in jobs}
    assert plan.stats.proven


def test_sia_may_leave_a_job_out_when_its_gpus_scale_others_more() -> None:
    # The published objective at work: allocating d at G = 2 saves lambda_n - 2^-0.5 = 0.39, while its
    # two GPUs let a and b go from 1 to 2 v100 GPUs (G 2 -> 4), saving 2 * (0.707 - 0.5) = 0.41.
    servers = [Server("s0", "v100", 4), Server("s1", "t4", 2)]
    jobs = [spec("a", [1, 2, 4]), spec("b", [1, 2, 4]), spec("c", [1, 2]), spec("d", [2])]
    est = estimator({j.id: {"v100": 2.0, "t4": 1.0} for j in jobs})
    plan = SiaPolicy(p=-0.5).plan(snapshot(servers, [JobView(j) for j in jobs]), est, "first", no_time)
    assert set(plan.assignments) == {"a", "b", "c"}
    assert plan.assignments["a"].gpus == plan.assignments["b"].gpus == 2


def test_sia_latency_ratio_variant_only_considers_the_window() -> None:
    servers = [Server("s0", "v100", 2)]
    jobs = [spec("a", [1]), spec("b", [1]), spec("c", [1])]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    views = [
        JobView(jobs[0], waited_s=10.0),
        JobView(jobs[1], waited_s=500.0),
        JobView(jobs[2], waited_s=900.0),
    ]
    plan = SiaPolicy(queue_order="latency_ratio").plan(
        snapshot(servers, views, 1000.0), est, "first", no_time
    )
    assert plan.window == ("c", "b")
    assert set(plan.assignments) == {"b", "c"}


# -- FIFO ---------------------------------------------------------------------------------------------


def test_fifo_blocks_at_the_head_of_the_line() -> None:
    servers = [Server("s0", "v100", 4)]
    jobs = [spec("j1", [2], submit=0.0), spec("j2", [4], submit=1.0), spec("j3", [1], submit=2.0)]
    est = estimator({j.id: {"v100": 1.0} for j in jobs})
    plan = FifoPolicy().plan(snapshot(servers, [JobView(j) for j in jobs]), est, "first", no_time)
    assert plan.assignments == {"j1": Config.single("s0", 2)}  # j3 would fit, but j2 is ahead of it
    assert plan.order == ("j1", "j2", "j3") and plan.idle_gpus == 2


def test_fifo_smallest_requirement_on_the_fastest_type_with_room_and_no_preemption() -> None:
    servers = [Server("slow", "k80", 4), Server("fast", "a100", 4)]
    jobs = [spec("r", [4], submit=50.0), spec("q1", [1, 2], submit=0.0), spec("q2", [2, 4], submit=1.0)]
    est = estimator({j.id: {"k80": 1.0, "a100": 3.0} for j in jobs})
    views = [JobView(jobs[0], current=Config.single("fast", 4)), JobView(jobs[1]), JobView(jobs[2])]
    plan = FifoPolicy().plan(snapshot(servers, views), est, "fragment", no_time)
    assert plan.assignments["r"] == Config.single("fast", 4)  # later arrival, but running: never preempted
    assert plan.assignments["q1"] == Config.single("slow", 1)
    assert plan.assignments["q2"] == Config.single("slow", 2)
    free = FifoPolicy().plan(snapshot(servers, views[1:]), est, "first", no_time)
    assert free.assignments["q1"] == Config.single("fast", 1)


# -- registry -----------------------------------------------------------------------------------------


def test_registry_makes_every_policy() -> None:
    inst = busy_instance(3, 16, 4)
    for name in POLICY_NAMES:
        policy = make_policy(name, SchedulerSettings())
        assert policy.name == name and policy.description and policy.round_seconds > 0
        plan = policy.plan(inst.snapshot, inst.estimator, "first", no_time)
        assert plan.kind == "first"
    assert isinstance(make_policy("gavel-lr", SchedulerSettings()), GavelPolicy)
    assert make_policy("sia-lr", SchedulerSettings()).fragment_plans is False
    assert make_policy("fifo", SchedulerSettings()).fragment_plans is True


def test_registry_rejects_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"'tiresias'.*gavel-lr"):
        make_policy("tiresias", SchedulerSettings())


def test_the_hops_description_names_the_critical_path_where_the_priority_reads_it() -> None:
    on = SchedulerSettings(critical_path=True)
    assert "critical_path" in make_policy("hops", on).description
    assert "critical_path" in make_policy("hops-srtf-lr", on).description
    assert "critical_path" not in make_policy("hops-las", on).description
    assert "critical_path" not in make_policy("hops", SchedulerSettings()).description
