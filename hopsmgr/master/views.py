"""JSON views of the master's state for the API: job summaries and details, explain, nodes, tenants.

Read-only: built from the store rows and the controller's in-memory records and last plans.
"""

from __future__ import annotations

import math
from typing import Any

from hopsmgr.control.snapshot import waited_s
from hopsmgr.control.usage import current_usage
from hopsmgr.core import fairshare
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobView
from hopsmgr.core.planner import Plan
from hopsmgr.core.priority import PriorityContext, estimated_wait_s, expected_run_s, raqlr
from hopsmgr.core.queueorder import context_of
from hopsmgr.forecast.live import WAITING
from hopsmgr.master.controller import Controller
from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.state import NodeRecord, calibration_json

TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED")


def _plan(ctl: Controller) -> Plan | None:
    return ctl.plans.get("fragment") or ctl.plans.get("first")


def current_raqlr(ctl: Controller) -> float | None:
    return raqlr(ctl.ended_lr, ctl.clock(), ctl.config.scheduler.raqlr_hours)


def wait_context(ctl: Controller) -> PriorityContext:
    """The priority context for wait estimates, rebuilt at most once per plan, from the nodes and the
    job counts (not a snapshot: that reads every job, too slow for a request at 10,000 jobs)."""
    plan = _plan(ctl)
    key = plan.now if plan is not None else None
    if ctl.wait_ctx is None or ctl.wait_ctx[0] != key:
        state = ctl.machine.state
        active = sum(state.counts.get(s, 0) for s in (JobState.QUEUED, JobState.LAUNCHING, JobState.RUNNING))
        servers = (n.server for n in state.nodes.values())
        ctx = context_of(servers, active, state.tenants, ctl.clock(), ctl.estimator)
        ctl.wait_ctx = (key, ctx)
    return ctl.wait_ctx[1]


def job_summary(
    ctl: Controller, row: dict[str, Any], ctx: PriorityContext | None = None, *, redact: bool = False
) -> dict[str, Any]:
    """A job's line in the queue; `redact`: another user's job, its name and failure reason left out
    (its position, size and state stay: they are the queue everyone shares)."""
    job = ctl.state.jobs.get(row["id"])
    plan = _plan(ctl)
    placement = None
    if job is not None and job.attempt is not None and job.attempt in ctl.state.attempts:
        placement = ctl.state.attempts[job.attempt].placement.as_dict()
    priority = plan.priorities.get(row["id"]) if plan else None
    position = None
    est_wait = None
    ratio = None
    if job is not None and priority is not None:
        # the latency ratio itself (wait / expected run time), not the priority it enters: the kinds
        # other than latency_ratio, the projection over the plan's horizon and fair share all differ
        ctx = ctx or wait_context(ctl)
        age = expected_run_s(job.spec, ctx)
        if math.isfinite(age) and age > 0:  # else its run time is not known yet: null
            ratio = waited_s(job, ctl.machine.state, ctl.clock()) / age
    if job is not None and job.state == JobState.QUEUED:
        position = ctl.positions.get(row["id"])
        value = current_raqlr(ctl)
        if value is not None:
            view = JobView(job.spec, done_samples=job.done_samples)
            total = estimated_wait_s(view, ctx or wait_context(ctl), value)
            waited = waited_s(job, ctl.machine.state, ctl.clock())
            est_wait = None if total is None else max(0.0, total - waited)
    total_samples = row["spec"]["total_samples"]
    return {
        "id": row["id"],
        "name": "" if redact else row["name"],
        "tenant": row["tenant"],
        "user": row["user"],
        "state": row["state"] if job is None else job.state.value,
        "gpus": row["spec"]["gpus"],
        "submitted": row["submitted"],
        "placement": placement,
        "position": position,
        "priority": priority,
        "latency_ratio": ratio,
        "est_wait_s": est_wait,
        "progress": min(1.0, (job.done_samples if job else row["done_samples"]) / total_samples),
        "restarts": job.restarts if job else row["restarts"],
        "reason": None if redact else (job.reason if job else row["reason"]),
        "forecast": forecast_of(ctl, row["id"]) if job is not None else None,
    }


def forecast_of(ctl: Controller, job_id: str) -> dict[str, Any] | None:
    """The latest forecast of a live job (hopsmgr.master.forecasts), None before the first. A job
    that no longer waits keeps its forecast until the next one: its start quantiles, made while it
    waited, are then history and shown as null."""
    found = ctl.forecasts.get(job_id)
    if found is None:
        return None
    out = found.as_dict()
    job = ctl.state.jobs.get(job_id)
    if job is not None and job.state not in WAITING:
        out.update(start_p10=None, start_p50=None, start_p90=None)
    return out


def job_detail(ctl: Controller, row: dict[str, Any]) -> dict[str, Any]:
    out = job_summary(ctl, row)
    attempts = ctl.store.attempts(row["id"])
    out.update(
        command=row["command"],
        env=row["env"],
        workdir=row["workdir"],
        launcher=row["launcher"],
        one_server=bool(row["spec"].get("one_server", False)),
        run_as=row.get("run_as") or "",
        mem_mb=row.get("mem_mb"),
        cpus=row.get("cpus"),
        batch_size=row["spec"]["batch_size"],
        total_samples=row["spec"]["total_samples"],
        done_samples=row["done_samples"],
        counters={k: row[k] for k in ("restarts", "preemptions", "node_losses", "failures")},
        history=[
            {"time": e["time"], "kind": e["kind"], "state": e["state"], "message": e["message"]}
            for e in ctl.store.events(row["id"])
        ],
        attempts=[
            {
                "id": a["id"],
                "placement": a["placement"],
                "devices": a["devices"] or {},
                "profiling": bool(a["profiling"]),
                "started": a["started"],
                "ended": a["ended"],
                "end_reason": a["end_reason"],
                "exit_code": a["exit_code"],
            }
            for a in attempts
        ],
        throughput=throughput_history(ctl, row["id"]),
    )
    return out


def throughput_history(ctl: Controller, job_id: str) -> list[dict[str, Any]]:
    """The job's measured throughput per placement (oldest first), beside what the estimator expected
    there just before the latest measurement (stored with it: kept after the job ends) and what it
    estimates there now (live jobs only)."""
    groups: dict[tuple[tuple[str, int], ...], dict[str, Any]] = {}
    for r in ctl.store.throughput(job_id):
        group = groups.setdefault(
            tuple(sorted(r["placement"].items())),
            {"placement": r["placement"], "rates": [], "expected": None},
        )
        group["rates"].append(r["samples_per_s"])
        if r.get("estimated_per_s") is not None:
            group["expected"] = r["estimated_per_s"]
    return [
        {
            "placement": g["placement"],
            "measurements": len(g["rates"]),
            "measured_last": round(g["rates"][-1], 4),
            "measured_mean": round(sum(g["rates"]) / len(g["rates"]), 4),
            "expected_last": None if g["expected"] is None else round(g["expected"], 4),
            "estimate_now": placement_estimate(ctl, job_id, g["placement"]),
        }
        for g in groups.values()
    ]


async def latest_log(ctl: Controller, row: dict[str, Any], tail: int) -> tuple[str | None, str]:
    # attempts that ran (one may end before the master saw it start: a short script, an agent's late
    # beat) or still may; not the second half of a move that never launched
    attempts = [
        a
        for a in ctl.store.attempts(row["id"])
        if a["started"] is not None or a["ended"] is None or a["exit_code"] is not None
    ]
    if not attempts:
        return None, ""
    attempt = attempts[-1]
    node_id = next(iter(attempt["placement"]))
    node = ctl.state.nodes.get(node_id)
    stored = (attempt.get("log_tail") or "")[-tail:]
    if node is None or not node.workdir:
        return attempt["id"], stored
    try:
        return attempt["id"], await ctl.executor.logs(ctl.target(node_id), attempt["id"], tail)
    except ExecutorError as exc:  # the node is gone or forgot it: the tail its agent sent at the end
        return attempt["id"], stored or f"(log not available: {exc})"


def explain(ctl: Controller, row: dict[str, Any]) -> dict[str, Any]:
    summary = job_summary(ctl, row)
    plan = _plan(ctl)
    live = row["id"] in ctl.machine.state.jobs
    # an ended job is in no plan to come: the last plan's view of it (its priority, window, note) is
    # history, not an explanation
    info = plan.explain.get(row["id"]) if plan and live else None
    tenant = row["tenant"]
    spec = row["spec"]
    return {
        "id": row["id"],
        "state": summary["state"],
        "position": summary["position"],
        "priority": summary["priority"] if live else None,
        "latency_ratio": summary["latency_ratio"],
        "in_window": None if info is None else info.in_window,
        "window": None if plan is None else len(plan.window),
        "sensitivity": None if info is None else info.sensitivity,
        "may_span": None if info is None else info.may_span,
        "candidates": []
        if info is None
        else [{"config": c.config, "rate": c.rate, "value": c.value} for c in info.candidates],
        "chosen": None if info is None else info.chosen,
        "note": None if info is None else info.note or None,
        "placement": summary["placement"],
        "unplaceable": None if plan is None or not live else plan.unplaceable.get(row["id"]),
        "profiled_types": []
        if not spec.get("runtime", True)
        else sorted(ctl.estimator.profiled_types(row["id"])),
        "without_runtime": _without_runtime(spec),
        "waits_for": [d for d in spec.get("after", []) if d in ctl.machine.state.jobs],
        "estimates": estimates(ctl, row["id"]),
        "estimates_by_count": estimates_by_count(ctl, row["id"]),
        "placement_estimate": placement_estimate(ctl, row["id"], summary["placement"]),
        "reason": summary["reason"],
        "forecast": summary["forecast"],
        "quota": tenant_view(ctl, tenant),
        "what_if": None,  # the API fills it in for ?gpus= (hopsmgr.master.whatif)
        "round": None
        if plan is None
        else {"time": plan.now, "kind": plan.kind, "method": plan.stats.method, "proven": plan.stats.proven},
    }


def _without_runtime(spec: dict[str, Any]) -> str | None:
    """How a job whose command does not use hopsmgr.runtime is scheduled (None for the others)."""
    if spec.get("runtime", True):
        return None
    gpus = min(spec["gpus"])
    run_s = spec["total_samples"] / gpus
    where = "its --time" if spec.get("time_limit_s") else "scheduler.default_run_s"
    if spec.get("checkpoint_signal"):
        grace = spec.get("grace_s")
        how = f"preempted with {spec['checkpoint_signal']}" + (
            f" and {grace:g} s to exit" if grace is not None else ""
        )
    else:
        how = "never preempted"
    return (
        "no profile (the command does not use hopsmgr.runtime): placed from the servers' calibration and"
        f" an expected run time of {run_s:.0f} s ({where}); {how}"
    )


def estimates(ctl: Controller, job_id: str) -> dict[str, float]:
    """The estimator's samples/s for the job at its smallest GPU count on each node (live jobs only)."""
    job = ctl.state.jobs.get(job_id)
    if job is None:
        return {}
    gpus = job.spec.requirements.minimum
    out: dict[str, float] = {}
    for node in ctl.state.nodes.values():
        if node.server.gpus >= gpus:
            rate = ctl.estimator.per_gpu_rate(job.spec, node.effective_server(), gpus)
            if rate is not None:
                out[node.id] = round(rate * gpus, 4)
    return out


def estimates_by_count(ctl: Controller, job_id: str) -> dict[str, dict[str, float]]:
    """The estimator's samples/s for the job on each node at each of its GPU counts the node holds
    (live jobs only): what an elastic job's measured rate on a larger count is compared with."""
    job = ctl.state.jobs.get(job_id)
    if job is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for node in ctl.state.nodes.values():
        server = node.effective_server()
        for gpus in job.spec.requirements.counts:
            if gpus <= node.server.gpus:
                rate = ctl.estimator.per_gpu_rate(job.spec, server, gpus)
                if rate is not None:
                    out.setdefault(node.id, {})[str(gpus)] = round(rate * gpus, 4)
    return out


def placement_estimate(ctl: Controller, job_id: str, placement: dict[str, int] | None) -> float | None:
    """The estimator's samples/s for the job on the placement it holds, over several servers or GPU
    types too (speed-balanced where the types differ); None when it holds none or has no estimate."""
    job = ctl.state.jobs.get(job_id)
    if job is None or not placement or any(sid not in ctl.state.nodes for sid in placement):
        return None
    config = Config.of(placement)
    servers = {sid: ctl.state.nodes[sid].effective_server() for sid in placement}
    rate = ctl.estimator.config_rate(job.spec, config, servers)
    return None if rate is None else round(rate, 4)


def node_view(ctl: Controller, node: NodeRecord) -> dict[str, Any]:
    running = []
    used = 0
    for a in ctl.state.attempts_on(node.id):
        gpus = a.placement.as_dict().get(node.id)
        if gpus:
            used += gpus
            running.append({"job": a.job_id, "attempt": a.id, "gpus": gpus, "profiling": a.profiling})
    cal = node.calibration or node.server.calibration
    return {
        "id": node.id,
        "gpu_type": node.server.gpu_type,
        "gpus": node.usable_gpus,
        "health": node.health,
        "drained": node.drained,
        "drain_reason": node.drain_reason or None,
        "emulated": node.device_mode == "emulated",
        "device_mode": node.device_mode,
        "calibration": {**calibration_json(cal), "source": cal.source},
        "last_beat_s": None if node.last_beat is None else round(ctl.clock() - node.last_beat, 3),
        "free_gpus": max(0, node.usable_gpus - used),
        "command_error": node.exec_error or None,
        "command_error_s": None if not node.exec_error else round(ctl.clock() - node.exec_error_at, 1),
        "running": running,
    }


def used_gpus(ctl: Controller) -> dict[str, int]:
    """GPUs each tenant's jobs hold (profiling runs not counted), in one pass over the open attempts."""
    used: dict[str, int] = {}
    jobs = ctl.state.jobs
    for a in ctl.state.attempts.values():
        job = jobs.get(a.job_id)
        if job is not None and not a.profiling:
            used[job.tenant] = used.get(job.tenant, 0) + a.placement.gpus
    return used


def used_gpus_by_type(ctl: Controller, tenant: str) -> dict[str, int]:
    """GPUs of each type one tenant's jobs hold (profiling runs not counted)."""
    used: dict[str, int] = {}
    jobs, nodes = ctl.state.jobs, ctl.state.nodes
    for a in ctl.state.attempts.values():
        job = jobs.get(a.job_id)
        if job is None or a.profiling or job.tenant != tenant:
            continue
        for node_id, gpus in a.placement.parts:
            node = nodes.get(node_id)
            gpu_type = node.server.gpu_type if node is not None else "unknown"
            used[gpu_type] = used.get(gpu_type, 0) + gpus
    return used


def tenant_view(ctl: Controller, name: str) -> dict[str, Any]:
    quota = ctl.state.tenants.get(name)
    used = used_gpus(ctl).get(name, 0)
    jobs = [j for j in ctl.state.jobs.values() if j.tenant == name]
    guaranteed = quota.guaranteed_gpus if quota else 0
    scheduler = ctl.control_settings.scheduler
    now = ctl.clock()
    usage = current_usage(ctl.machine.state, now, scheduler.fairshare_half_life_h)
    total_use = sum(usage.values())
    weights = {t: q.weight for t, q in ctl.state.tenants.items()}
    factor = fairshare.factors(usage, weights, ctl.state.tenants, scheduler.fairshare_strength).get(name, 1.0)
    history = [
        {"time": at, "ref_gpu_h": round(sample.get(name, 0.0) / 3600.0, 4)}
        for at, sample in ctl.usage_history
    ]
    return {
        "name": name,
        "tenant": name,
        "guaranteed_gpus": guaranteed,
        "cap_gpus": quota.cap_gpus if quota else None,
        "cap_gpus_by_type": dict(quota.type_caps) if quota else {},
        "guaranteed_gpus_by_type": dict(quota.type_guarantees) if quota else {},
        "weight": quota.weight if quota else 1.0,
        "used_gpus": used,
        "used_gpus_by_type": used_gpus_by_type(ctl, name),
        "borrowed_gpus": max(0, used - guaranteed),
        "queued": sum(1 for j in jobs if j.state == JobState.QUEUED),
        "running": sum(1 for j in jobs if j.state == JobState.RUNNING),
        "usage_ref_gpu_h": round(usage.get(name, 0.0) / 3600.0, 4),
        "usage_share": round(usage.get(name, 0.0) / total_use, 4) if total_use > 0 else 0.0,
        "fairshare_factor": round(factor, 4) if scheduler.fairshare else 1.0,
        "usage_history": history,
    }


def cluster_view(ctl: Controller, loop: Any) -> dict[str, Any]:
    by_type: dict[str, int] = {}
    health: dict[str, int] = {}
    for n in ctl.state.nodes.values():
        by_type[n.server.gpu_type] = by_type.get(n.server.gpu_type, 0) + n.usable_gpus
        health[n.health] = health.get(n.health, 0) + 1
    used = sum(ctl.state.held().values())
    counts = {s: 0 for s in ("PENDING", "PROFILING", "QUEUED", "LAUNCHING", "RUNNING", "CHECKPOINTING")}
    for job_state, count in ctl.machine.state.counts.items():
        if job_state.value in counts:  # live states (an ended job's state counts 0)
            counts[job_state.value] += count
    total = sum(by_type.values())
    return {
        "gpus": total,
        "gpus_by_type": by_type,
        "used_gpus": used,
        "idle_gpus": max(0, total - used),
        "pending": counts["PENDING"] + counts["PROFILING"],
        "queued": counts["QUEUED"],
        "running": counts["RUNNING"] + counts["LAUNCHING"],
        "checkpointing": counts["CHECKPOINTING"],
        "nodes": health,
        "raqlr": current_raqlr(ctl),
        "epoch": ctl.epoch,
        "executor": ctl.executor.name,
        "last_round": loop.last or None,
    }
