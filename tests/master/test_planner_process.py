"""The planner process: plans computed in a worker process match the inline answer; a worker that
misses the round's deadline is replaced and the round gets the fallback plan, which says so."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hopsmgr.control.commands import PlanRequest
from hopsmgr.control.planning import compute_plan, fallback_plan
from hopsmgr.core.model import ClusterSnapshot, TenantQuota
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.planner_process import PlannerProcess, dumps_request, interned, loads_request
from hopsmgr.policies.base import HopsPolicy
from tests.helpers.fakes import stalling_cbc as fake_cbc


def request_of(snapshot: ClusterSnapshot, request_id: int = 1) -> PlanRequest:
    return PlanRequest(f"test-{request_id}", request_id, "first", snapshot)


@pytest.fixture
def stalling_cbc(tmp_path: Path) -> str:
    return fake_cbc(tmp_path)


def test_a_plan_from_the_worker_process_is_the_inline_plan() -> None:
    inst = busy_instance(3, 64, 40)
    settings = SchedulerSettings(solver="exact")
    inline = compute_plan(request_of(inst.snapshot), HopsPolicy(settings), inst.estimator, time.perf_counter)
    worker = PlannerProcess(settings)
    worker.start()
    try:
        ready = asyncio.run(worker.plan(request_of(inst.snapshot), inst.estimator, time.monotonic() + 120))
    finally:
        worker.stop()
    assert ready.plan.stats.method != "fallback"
    assert ready.plan.assignments == inline.plan.assignments
    assert ready.stimulus_id == "test-1" and ready.request_id == 1


def test_a_stalled_worker_is_replaced_and_the_round_gets_the_fallback(stalling_cbc: str) -> None:
    inst = busy_instance(5, 64, 40)
    settings = SchedulerSettings(solver="exact", time_limit_s=30.0, cbc_path=stalling_cbc)
    worker = PlannerProcess(settings)
    worker.start()
    first_pid = worker.process.pid

    async def both() -> tuple[object, object]:
        stalled = await worker.plan(request_of(inst.snapshot), inst.estimator, time.monotonic() + 1.5)
        empty = ClusterSnapshot(inst.snapshot.servers, inst.snapshot.capacity, (), inst.snapshot.now)
        after = await worker.plan(request_of(empty, 2), inst.estimator, time.monotonic() + 60)
        return stalled, after

    try:
        stalled, after = asyncio.run(both())
        second_pid = worker.process.pid
    finally:
        worker.stop()
    plan = stalled.plan  # type: ignore[attr-defined]
    assert plan.stats.method == "fallback" and not plan.stats.proven
    assert "deadline" in (plan.stats.fallback or "")
    assert worker.replaced == 1 and second_pid != first_pid
    assert after.plan.stats.method != "fallback"  # type: ignore[attr-defined]
    # the fallback keeps every running job where it is and gives no server more than it has
    running = {v.id: v.current for v in inst.snapshot.jobs if v.current is not None}
    assert all(plan.assignments[j] == c for j, c in running.items())
    used: dict[str, int] = {}
    for config in plan.assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    assert all(n <= inst.snapshot.capacity[sid] for sid, n in used.items())


def test_the_fallback_places_waiting_profiled_jobs_first_fit() -> None:
    inst = busy_instance(9, 64, 40)
    ready = fallback_plan(request_of(inst.snapshot), inst.estimator, "test")
    waiting = [v for v in inst.snapshot.jobs if v.current is None]
    placed = [v for v in waiting if v.id in ready.plan.assignments]
    assert placed, "idle GPUs and waiting jobs, yet nothing placed"
    assert all(ready.plan.assignments[v.id].gpus == v.spec.requirements.minimum for v in placed)


def test_the_worker_follows_the_estimator_by_its_updates() -> None:
    """After the first request the worker gets only the updates since the last one, and plans as the
    master's own estimator would."""
    from hopsmgr.master.planner_process import LoggedEstimator

    inst = busy_instance(4, 64, 40)
    estimator = LoggedEstimator.from_state(inst.estimator.export_state())
    assert isinstance(estimator, LoggedEstimator)
    settings = SchedulerSettings(solver="exact")
    worker = PlannerProcess(settings)
    worker.start()
    try:
        asyncio.run(worker.plan(request_of(inst.snapshot), estimator, time.monotonic() + 120))
        servers = inst.snapshot.server_map()
        for view in inst.snapshot.jobs[:10]:
            if view.current is not None:  # a measured rate far from the estimate moves the plan's values
                estimator.observe(view.id, view.current, servers, 0.2, job=view.spec)
        assert len(estimator.logs["planner"]) > 0
        ready = asyncio.run(worker.plan(request_of(inst.snapshot, 2), estimator, time.monotonic() + 120))
    finally:
        worker.stop()
    assert estimator.logs["planner"] == []
    inline = compute_plan(request_of(inst.snapshot, 2), HopsPolicy(settings), estimator, time.perf_counter)
    assert ready.plan.assignments == inline.plan.assignments
    assert ready.plan.stats.objective == pytest.approx(inline.plan.stats.objective)


def test_a_request_sends_again_only_the_specs_and_servers_the_worker_does_not_hold() -> None:
    inst = busy_instance(4, 64, 60)
    snap = inst.snapshot
    first = request_of(snap)
    whole = dumps_request((first, None, []), {})
    known = interned(first)
    again = dumps_request((request_of(snap, 2), None, []), known)
    assert len(again) < 0.6 * len(whole)  # specs and servers travel as references
    assert loads_request(whole, {}) == (first, None, [])
    assert loads_request(again, known) == (request_of(snap, 2), None, [])
    # a job whose spec object changed (same id) and a new job travel whole; a job gone is dropped
    changed = replace(snap.jobs[0], spec=replace(snap.jobs[0].spec, name="renamed"))
    new = replace(snap.jobs[1], spec=replace(snap.jobs[1].spec, id="j-new"))
    third = request_of(replace(snap, jobs=(changed, new, *snap.jobs[2:-1])), 3)
    decoded, _, _ = loads_request(dumps_request((third, None, []), known), known)
    assert decoded == third and decoded.snapshot.jobs[0].spec.name == "renamed"
    assert snap.jobs[-1].spec.id not in interned(third)["spec"]
    with pytest.raises(ValueError, match="holds no spec"):
        loads_request(dumps_request((third, None, []), interned(third)), {})


def test_successive_requests_to_one_worker_give_the_inline_plans() -> None:
    inst = busy_instance(3, 64, 40)
    settings = SchedulerSettings(solver="exact")
    snap = inst.snapshot
    later = replace(snap, jobs=snap.jobs[5:], now=snap.now + 60)
    worker = PlannerProcess(settings)
    worker.start()

    async def both() -> list[object]:
        out = []
        for i, s in enumerate((snap, later), start=1):
            out.append(await worker.plan(request_of(s, i), inst.estimator, time.monotonic() + 120))
        return out

    try:
        answers = asyncio.run(both())
    finally:
        worker.stop()
    for i, (s, ready) in enumerate(zip((snap, later), answers, strict=True), start=1):
        inline = compute_plan(request_of(s, i), HopsPolicy(settings), inst.estimator, time.perf_counter)
        assert ready.plan.stats.method != "fallback"  # type: ignore[attr-defined]
        assert ready.plan.assignments == inline.plan.assignments  # type: ignore[attr-defined]


def test_the_fallback_keeps_tenant_caps_and_caps_per_gpu_type() -> None:
    inst = busy_instance(9, 64, 40)
    types = sorted({s.gpu_type for s in inst.snapshot.servers})
    tenants = {
        "vision": TenantQuota("vision", cap_gpus=0),
        "nlp": TenantQuota("nlp", type_caps=((types[0], 0),)),
    }
    free = fallback_plan(request_of(inst.snapshot), inst.estimator, "test").plan
    snap = replace(inst.snapshot, tenants=tenants)
    plan = fallback_plan(request_of(snap), inst.estimator, "test").plan
    waiting = {v.id: v for v in snap.jobs if v.current is None}
    placed_free = [j for j in free.assignments if j in waiting]
    assert any(waiting[j].spec.tenant == "vision" for j in placed_free)  # without the caps it places them
    servers = snap.server_map()
    for job_id, config in plan.assignments.items():
        if job_id in waiting:
            assert waiting[job_id].spec.tenant != "vision"
            assert servers[config.servers[0]].gpu_type != types[0] or waiting[job_id].spec.tenant != "nlp"
