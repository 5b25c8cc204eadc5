"""Submission limits of the scheduler state machine: why a job could never be admitted (its id is
taken, its tenant is unknown, it asks for more GPUs than the cluster, its tenant's cap, the largest
server or the largest GPU type can ever give it, under the tenant's caps per GPU type too), as the
`Reply` that refuses it. A plain function of the state; `SchedulerMachine.refusal`
(hopsmgr.control.machine) calls it for each submission, and the master's API asks it before
submitting or forecasting.
"""

from __future__ import annotations

from hopsmgr.control.commands import Reply
from hopsmgr.control.records import ControlState
from hopsmgr.core.model import JobSpec


def refusal(state: ControlState, spec: JobSpec, *, mixed_types: bool, stimulus: str) -> Reply | None:
    """Why a submission of `spec` is refused (unknown tenant, more GPUs than it may ever get), or None.
    `mixed_types`: the scheduler's setting (a placement of a job with the runtime may mix GPU types);
    `stimulus`: the stimulus id of the reply."""
    if spec.id in state.jobs:
        return Reply(stimulus, spec.id, "id", f"job {spec.id} exists", 409)
    quota = state.tenants.get(spec.tenant)
    if state.tenants and quota is None:
        known = ", ".join(sorted(state.tenants))
        return Reply(stimulus, None, "tenant", f"unknown tenant {spec.tenant!r} (known: {known})", 422)
    total = state.total_gpus
    limit = min(total, quota.cap_gpus) if quota is not None and quota.cap_gpus is not None else total
    if spec.requirements.minimum > limit:
        where = f"tenant {spec.tenant!r} cap of {limit}" if limit < total else f"cluster's {total}"
        message = f"the smallest GPU count asked for ({spec.requirements.minimum}) exceeds the {where} GPUs"
        return Reply(stimulus, None, "gpus", message, 422)
    if spec.one_server:
        largest = max((n.server.gpus for n in state.nodes.values()), default=0)
        if state.nodes and spec.requirements.minimum > largest:
            message = (
                f"no placement can ever hold {spec.requirements.minimum} GPUs on one server: the"
                f" largest has {largest} GPUs"
            )
            return Reply(stimulus, None, "one_server", message, 422)
    per_type = dict(state.type_gpus)
    capped = ""
    if quota is not None and quota.type_caps:  # [ours] what the tenant's caps per GPU type leave it
        per_type = {
            t: min(n, cap) if (cap := quota.cap_of_type(t)) is not None else n for t, n in per_type.items()
        }
        capped = f" under the caps per GPU type of tenant {spec.tenant!r}"
        if per_type and spec.requirements.minimum > sum(per_type.values()):
            message = (
                f"the smallest GPU count asked for ({spec.requirements.minimum}) exceeds the"
                f" {sum(per_type.values())} GPUs the tenant may hold{capped}"
            )
            return Reply(stimulus, None, "gpus", message, 422)
    mixed = mixed_types and spec.runtime  # else a placement uses one type
    if per_type and not mixed and spec.requirements.minimum > max(per_type.values()):
        types = ", ".join(f"{t}: {g}" for t, g in sorted(per_type.items()))
        message = (
            f"no placement can ever hold {spec.requirements.minimum} GPUs: a placement uses one GPU"
            f" type and the largest has {max(per_type.values())} GPUs{capped} ({types})"
        )
        return Reply(stimulus, None, "gpus", message, 422)
    return None
