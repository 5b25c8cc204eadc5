"""Charging tenants for the GPUs their jobs hold (fair share with memory; hopsmgr.core.fairshare).

Every attempt that has started is charged, in reference-GPU-seconds, for the time since it was last
charged: at each round tick (all open attempts) and when it ends. The state's `usage` holds each tenant's
decayed total; `current_usage` reads it at `now` without changing it (for snapshots and views).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hopsmgr.control.context import MachineCore
from hopsmgr.control.records import Attempt, ControlState
from hopsmgr.core import fairshare
from hopsmgr.core.fairshare import TenantUsage
from hopsmgr.core.model import GpuType, Server, ServerId


def charge_attempt(
    m: MachineCore,
    attempt: Attempt,
    now: float,
    reference: GpuType | None = None,
    servers: Mapping[ServerId, Server] | None = None,
) -> None:
    """Charge `attempt`'s tenant up to `now` (`reference` as `reference_type` gives it, and `servers`
    every node's server, when the caller charges many attempts at once)."""
    job = m.state.jobs.get(attempt.job_id)
    if job is None or attempt.started is None:
        return
    since = max(attempt.started, attempt.charged_until)
    if now <= since:
        return
    if servers is None:
        nodes = m.state.nodes
        servers = {sid: nodes[sid].server for sid, _ in attempt.placement.parts if sid in nodes}
    ref = reference_type(m) if reference is None else reference
    rate = fairshare.charge_rate(job.spec, attempt.placement, servers, ref, m.estimator)
    tenant = job.spec.tenant
    usage = m.state.usage.setdefault(tenant, TenantUsage(tenant, 0.0, now))
    usage.charge(rate * (now - since), now, m.settings.scheduler.fairshare_half_life_h)
    attempt.charged_until = now


def reference_type(m: MachineCore) -> GpuType:
    """hopsmgr.core.fairshare.reference_type of the machine's nodes, from the GPUs per type the state
    keeps (not a pass over every node)."""
    return fairshare.reference_of_totals(m.state.type_gpus, m.settings.scheduler.fairshare_reference)


def charge_all(m: MachineCore, now: float, attempt_ids: Iterable[str] | None = None) -> None:
    """Charge every open attempt (or those of `attempt_ids` still open) up to `now`."""
    reference = reference_type(m)
    servers = {sid: node.server for sid, node in m.state.nodes.items()}
    attempts = m.state.attempts
    for attempt_id in list(attempts) if attempt_ids is None else attempt_ids:
        attempt = attempts.get(attempt_id)
        if attempt is not None:  # one that ended was charged up to its end
            charge_attempt(m, attempt, now, reference, servers)


def current_usage(state: ControlState, now: float, half_life_h: float) -> dict[str, float]:
    """Each tenant's decayed use at `now` (reference-GPU-seconds)."""
    return {name: u.decayed(now, half_life_h) for name, u in state.usage.items()}
