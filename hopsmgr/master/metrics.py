"""Prometheus text exposition of the master's state (GET /metrics), written by hand: no client library.

Gauges: jobs by state, GPUs used and idle per GPU type and per tenant, nodes by health, fragments (idle
GPUs while work waits), RAQLR; summaries of round and solver time and heartbeat handling time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.metrics import percentile
from hopsmgr.master.controller import Controller
from hopsmgr.master.views import current_raqlr


def _number(value: float) -> str:
    """Integers exactly (an epoch is a Unix time), other values with 6 significant digits."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            shown = _number(value)
            self.lines.append(f"{name}{{{text}}} {shown}" if text else f"{name} {shown}")

    def summary(self, name: str, help_text: str, values: Sequence[float], total_count: int) -> None:
        samples: list[tuple[dict[str, str], float]] = []
        for q in (0.5, 0.95, 0.99):
            p = percentile(values, q * 100)
            if p is not None:
                samples.append(({"quantile": str(q)}, p))
        self.metric(name, "summary", help_text, samples)
        self.lines.append(f"{name}_count {total_count}")
        self.lines.append(f"{name}_sum {sum(values):.6g}")


def prometheus_text(ctl: Controller, loop: Any) -> str:
    w = _Writer()
    states = {s.value: 0 for s in JobState if s.value not in ("COMPLETED", "FAILED", "CANCELLED")}
    for job_state, count in ctl.machine.state.counts.items():
        if job_state.value in states:  # live states (an ended job's state counts 0)
            states[job_state.value] += count
    w.metric("hopsmgr_jobs", "gauge", "Live jobs by state.", (({"state": s}, n) for s, n in states.items()))
    w.metric(
        "hopsmgr_queue_length",
        "gauge",
        "Jobs waiting (pending, profiling, queued).",
        [({}, states["PENDING"] + states["PROFILING"] + states["QUEUED"])],
    )
    used_type: dict[str, int] = {}
    total_type: dict[str, int] = {}
    for n in ctl.state.nodes.values():
        total_type[n.server.gpu_type] = total_type.get(n.server.gpu_type, 0) + n.usable_gpus
    used_tenant: dict[str, int] = dict.fromkeys(ctl.state.tenants, 0)
    for a in ctl.state.attempts.values():
        for sid, g in a.placement.parts:
            t = ctl.state.nodes[sid].server.gpu_type
            used_type[t] = used_type.get(t, 0) + g
        owner = ctl.state.jobs.get(a.job_id)
        if owner is not None:
            used_tenant[owner.tenant] = used_tenant.get(owner.tenant, 0) + a.placement.gpus
    w.metric(
        "hopsmgr_gpus_used",
        "gauge",
        "GPUs held by attempts, per GPU type.",
        (({"gpu_type": t}, used_type.get(t, 0)) for t in sorted(total_type)),
    )
    w.metric(
        "hopsmgr_gpus_idle",
        "gauge",
        "GPUs not held by any attempt, per GPU type.",
        (({"gpu_type": t}, max(0, n - used_type.get(t, 0))) for t, n in sorted(total_type.items())),
    )
    w.metric(
        "hopsmgr_tenant_gpus_used",
        "gauge",
        "GPUs held per tenant.",
        (({"tenant": t}, n) for t, n in sorted(used_tenant.items())),
    )
    health: dict[str, int] = {}
    for node in ctl.state.nodes.values():
        health[node.health] = health.get(node.health, 0) + 1
    w.metric(
        "hopsmgr_nodes", "gauge", "Nodes by health.", (({"health": h}, n) for h, n in sorted(health.items()))
    )
    idle = sum(max(0, n - used_type.get(t, 0)) for t, n in total_type.items())
    waiting = states["QUEUED"] > 0
    w.metric(
        "hopsmgr_fragment_gpus", "gauge", "Idle GPUs while queued work waits.", [({}, idle if waiting else 0)]
    )

    value = current_raqlr(ctl)
    if value is not None:
        w.metric("hopsmgr_raqlr", "gauge", "Recent average queue latency ratio.", [({}, value)])
    w.summary("hopsmgr_round_seconds", "Wall time of a scheduling round.", loop.round_s, loop.rounds)
    w.summary("hopsmgr_solver_seconds", "Planner time within a round.", loop.solve_s, loop.rounds)
    w.summary(
        "hopsmgr_heartbeat_handling_ms",
        "Time to handle one agent heartbeat (ms).",
        list(ctl.heartbeat_ms),
        ctl.heartbeats,
    )
    w.metric(
        "hopsmgr_heartbeat_deferred_total",
        "counter",
        "Acknowledgements and stops left to a later heartbeat reply: not yet committed when it was sent.",
        [({}, ctl.replies_deferred)],
    )
    w.metric("hopsmgr_epoch", "gauge", "The master's epoch.", [({}, ctl.epoch)])
    return "\n".join(w.lines) + "\n"
