"""The queue as plans take it: each job's priority value, its tenants' fair-share factors and
guarantees, and the order the service window walks.

The priority kinds themselves are pure functions in hopsmgr.core.priority; this module gives them the
cluster (a `PriorityContext` of a snapshot), projects the latency ratio over the plan's horizon
(`projected_priority`), lifts the running jobs on the critical path of the backlog's makespan
(`critical_path`), and puts the jobs owed GPUs under their tenant's guarantee first. The planner and
the forecasts' policy both read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from hopsmgr.core import fairshare, quota
from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import ClusterSnapshot, GpuType, JobId, JobView, Server, TenantQuota
from hopsmgr.core.priority import (
    PriorityContext,
    critical_path_jobs,
    order_queue,
    priority_values,
    projected_latency_ratio,
    remaining_run_s,
    srtf_lr_value,
)
from hopsmgr.core.program import horizon_s, preemption_cost_s
from hopsmgr.core.settings import SchedulerSettings


def priority_context(snapshot: ClusterSnapshot, estimator: Estimator) -> PriorityContext:
    return context_of(snapshot.servers, len(snapshot.jobs), snapshot.tenants, snapshot.now, estimator)


def context_of(
    servers: Iterable[Server],
    active_jobs: int,
    tenants: Mapping[str, TenantQuota],
    now: float,
    estimator: Estimator,
) -> PriorityContext:
    """The priority context of a cluster of `servers` with `active_jobs` live jobs (no snapshot needed)."""
    totals: dict[GpuType, int] = {}
    for s in servers:
        totals[s.gpu_type] = totals.get(s.gpu_type, 0) + s.gpus
    all_gpus = sum(totals.values()) or 1
    return PriorityContext(
        now=now,
        type_share={t: n / all_gpus for t, n in totals.items()},
        rate=estimator.type_rate,
        total_gpus=all_gpus,
        active_jobs=max(1, active_jobs),
        tenant_weight={name: q.weight for name, q in tenants.items()},
    )


def _priorities(
    snapshot: ClusterSnapshot, ctx: PriorityContext, settings: SchedulerSettings
) -> dict[JobId, float]:
    """The queue's priority values; with `projected_priority`, the latency ratio each job would have
    at the end of the plan's horizon if not served (a running job also losing its checkpoint and
    restart), times its tenant's weight; "srtf_lr" projects its guard's latency ratio the same way.
    With `critical_path`, the running jobs on the critical path of the backlog's makespan are lifted:
    one past its guard with "srtf_lr", to the queue's highest latency ratio with "latency_ratio"."""
    if settings.priority == "srtf_lr":
        critical: frozenset[JobId] = frozenset()
        if settings.critical_path:
            critical = _critical_path(snapshot, ctx, settings)
        return {
            view.id: (
                srtf_lr_value(view, ctx, _ahead_s(view, settings), settings.lr_guard)
                + (1.0 if view.id in critical else 0.0)
            )
            * ctx.weight_of(view.spec.tenant)
            for view in snapshot.jobs
        }
    if settings.priority != "latency_ratio" or not settings.projected_priority:
        values = priority_values(settings.priority, snapshot.jobs, ctx)
    else:
        values = {
            view.id: projected_latency_ratio(view, ctx, _ahead_s(view, settings))
            * ctx.weight_of(view.spec.tenant)
            for view in snapshot.jobs
        }
    if settings.priority == "latency_ratio" and settings.critical_path and values:
        # [ours] a running job on the critical path ranks as if its ratio were the queue's highest,
        # weighed by its own tenant like every job
        weight = {view.id: max(ctx.weight_of(view.spec.tenant), 1e-12) for view in snapshot.jobs}
        top = max(values[job_id] / weight[job_id] for job_id in values)
        for job_id in _critical_path(snapshot, ctx, settings):
            values[job_id] = max(values[job_id], top * weight[job_id])
    return values


def _critical_path(
    snapshot: ClusterSnapshot, ctx: PriorityContext, settings: SchedulerSettings
) -> frozenset[JobId]:
    """[ours] The running jobs `critical_path_jobs` finds on the critical path of the backlog's makespan,
    each job's remaining run time as its priority reckons it (at its mean GPU count, over the cluster's
    type mix). Only running ones: to start a queued one early as well cost more average JCT on Gavel's
    small clusters, for no shorter makespan on paper-512 on average (docs/results.md)."""
    remaining = {view.id: remaining_run_s(view, ctx) for view in snapshot.jobs}
    gpus = {view.id: view.spec.requirements.mean for view in snapshot.jobs}
    critical = critical_path_jobs(remaining, gpus, ctx.total_gpus, settings.round_seconds)
    return frozenset(view.id for view in snapshot.jobs if view.current is not None and view.id in critical)


def _ahead_s(view: JobView, settings: SchedulerSettings) -> float:
    """How far ahead a job's latency ratio is projected (`projected_priority`): the plan's horizon, and
    for a running job also the checkpoint and restart a preemption would delay it by; 0 without it."""
    if not settings.projected_priority:
        return 0.0
    ahead = horizon_s(settings, view.spec.restart_s)
    if view.current is not None:
        ahead += preemption_cost_s(view.spec)
    return ahead


def queue_order(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    per_sample: dict[JobId, float] | None = None,
) -> tuple[dict[JobId, float], frozenset[JobId], list[JobView]]:
    """The queue as plans take it: each job's priority value (with the tenants' fair-share factors),
    the jobs owed GPUs under their tenant's guarantee, and the jobs in order (those owed first).
    `per_sample`: PriorityContext.per_sample, for a caller whose rates do not change between plans."""
    ctx = replace(priority_context(snapshot, estimator), per_sample=per_sample)
    if settings.fairshare and snapshot.tenant_usage:
        share = fairshare.factors(
            snapshot.tenant_usage,
            ctx.tenant_weight,
            (v.spec.tenant for v in snapshot.jobs),
            settings.fairshare_strength,
        )
        weights_now = {t: ctx.weight_of(t) * f for t, f in share.items()}
        ctx = replace(ctx, tenant_weight=weights_now)
    values = _priorities(snapshot, ctx, settings)
    owed = quota.entitled(snapshot.jobs, snapshot.tenants, values)
    ordered = order_queue(snapshot.jobs, values)
    return values, owed, [v for v in ordered if v.id in owed] + [v for v in ordered if v.id not in owed]
