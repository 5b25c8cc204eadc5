"""Charging tenants for the GPUs their jobs hold (fair share with memory; hopsmgr.core.fairshare).

Every attempt that has started is charged, in reference-GPU-seconds, for the time since it was last
charged: at each round tick (all open attempts) and when it ends. The state's `usage` holds each tenant's
decayed total; `current_usage` reads it at `now` without changing it (for snapshots and views).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hopsmgr.core import fairshare
from hopsmgr.core.fairshare import TenantUsage

if TYPE_CHECKING:
    from hopsmgr.control.machine import SchedulerMachine
    from hopsmgr.control.records import Attempt, ControlState


def charge_attempt(m: SchedulerMachine, attempt: Attempt, now: float) -> None:
    job = m.state.jobs.get(attempt.job_id)
    if job is None or attempt.started is None:
        return
    since = max(attempt.started, attempt.charged_until)
    if now <= since:
        return
    state = m.state
    servers = {sid: node.server for sid, node in state.nodes.items()}
    reference = fairshare.reference_type(servers.values(), m.settings.scheduler.fairshare_reference)
    rate = fairshare.charge_rate(job.spec, attempt.placement, servers, reference, m.estimator)
    tenant = job.spec.tenant
    usage = state.usage.setdefault(tenant, TenantUsage(tenant, 0.0, now))
    usage.charge(rate * (now - since), now, m.settings.scheduler.fairshare_half_life_h)
    attempt.charged_until = now


def charge_all(m: SchedulerMachine, now: float) -> None:
    for attempt in list(m.state.attempts.values()):
        charge_attempt(m, attempt, now)


def current_usage(state: ControlState, now: float, half_life_h: float) -> dict[str, float]:
    """Each tenant's decayed use at `now` (reference-GPU-seconds)."""
    return {name: u.decayed(now, half_life_h) for name, u in state.usage.items()}
