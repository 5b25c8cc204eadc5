"""Builders shared by the planner's unit tests (test_planner.py, test_planner_moves.py,
test_planner_priorities.py): configurations, servers, job specs and snapshots, an estimator with one
profile per job and GPU type, and the GPUs a plan uses on each server.
"""

from __future__ import annotations

from collections.abc import Mapping

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
from hopsmgr.core.settings import SchedulerSettings

# Per-GPU rate = batch / (tf + tb + tu) x compute factor: no data time, no parameters to all-reduce.
PROFILE = TimeProfile(tf_s=0.1, tb_s=0.2, tu_s=0.0, td_hit_s=0.0, td_miss_s=0.0)
EXACT = SchedulerSettings(solver="exact", gap=0.0)


def C(**parts: int) -> Config:
    return Config.of(parts)


def srv(sid: str, gpus: int, compute: float = 1.0, gpu_type: str = "A", order: int = 0) -> Server:
    return Server(sid, gpu_type, gpus, Calibration(compute_factor=compute), order=order)


def spec(jid: str, *counts: int, tenant: str = "default", restart_s: float = 60.0) -> JobSpec:
    return JobSpec(jid, RequirementSet.of(counts), 1e6, 32, tenant=tenant, restart_s=restart_s)


def snapshot(
    servers: list[Server],
    views: list[JobView],
    capacity: Mapping[str, int] | None = None,
    tenants: Mapping[str, TenantQuota] | None = None,
) -> ClusterSnapshot:
    cap = dict(capacity) if capacity is not None else {s.id: s.gpus for s in servers}
    return ClusterSnapshot(tuple(servers), cap, tuple(views), now=1000.0, tenants=dict(tenants or {}))


def profiled(*views: JobView, types: tuple[str, ...] = ("A",)) -> Estimator:
    est = Estimator()
    for v in views:
        for t in types:
            est.add_profile(v.id, t, PROFILE, Calibration())
    return est


def used_per_server(assignments: Mapping[str, Config]) -> dict[str, int]:
    used: dict[str, int] = {}
    for config in assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    return used
