"""Tenant guarantees: which jobs are within their tenant's guaranteed GPUs (pure).

A tenant with `guaranteed_gpus = G` is owed G GPUs whenever it has work for them. Its jobs are counted
against G in order, running jobs first (the GPUs they hold), then queued jobs by priority (their smallest
GPU count); the jobs that fit are *entitled*. The planner puts entitled jobs at the head of the queue and
multiplies their ILP weight by `GUARANTEE_BOOST`, so the program prefers them to any borrower: a tenant
under its guarantee with work waiting reclaims borrowed GPUs through ordinary checkpoint preemption, and
a tenant within its guarantee is not preempted for borrowers. GPUs above the guarantee are shared by
priority (borrowing), up to the tenant's cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hopsmgr.core.model import JobId, JobView, TenantQuota

GUARANTEE_BOOST = 100.0


def entitled(
    jobs: Iterable[JobView], tenants: Mapping[str, TenantQuota], priority: Mapping[JobId, float]
) -> frozenset[JobId]:
    by_tenant: dict[str, list[JobView]] = {}
    for view in jobs:
        quota = tenants.get(view.spec.tenant)
        if quota is not None and quota.guaranteed_gpus > 0:
            by_tenant.setdefault(view.spec.tenant, []).append(view)
    owed: set[JobId] = set()
    for name, views in by_tenant.items():
        budget = tenants[name].guaranteed_gpus
        views.sort(key=lambda v: (v.current is None, -priority.get(v.id, 0.0), v.spec.submit_time, v.id))
        for view in views:
            need = view.current.gpus if view.current is not None else view.spec.requirements.minimum
            if need <= budget:
                owed.add(view.id)
                budget -= need
    return frozenset(owed)


def borrowers(jobs: Iterable[JobView], owed: frozenset[JobId]) -> frozenset[JobId]:
    """Running jobs not covered by their tenant's guarantee (they hold borrowed GPUs)."""
    return frozenset(v.id for v in jobs if v.current is not None and v.id not in owed)


def reclaim_wanted(jobs: Iterable[JobView], owed: frozenset[JobId]) -> bool:
    """True when some entitled job waits: borrowed GPUs must then be given back."""
    return any(v.current is None and v.id in owed for v in jobs)
