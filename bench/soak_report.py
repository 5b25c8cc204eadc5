"""The soak's figures: what happened to every job, the faults, the API and the master, and the printed table.

Part of bench/soak.py (run that script, not this module). `SoakReport` adds to the soak's cluster
(soak_cluster.SoakCluster) `figures`, the flat JSON object of --json, read from the master and the
node work dirs once the drain is over, with the history of lost jobs and the exit records of killed
attempts; `print_report` prints the table (TABLE) and the non-empty problem lists.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import Counter
from typing import Any

from soak_cluster import SERVERS, TERMINAL, SoakCluster, Unreachable

from hopsmgr.core.metrics import percentile as pct
from hopsmgr.node import ops


class SoakReport(SoakCluster):
    """The figures of a finished soak (and the details of lost jobs and killed attempts)."""

    def figures(self, offered: int, drain_s: float) -> dict[str, Any]:
        final = self.jobs()
        ids = set(self.submitted.values())
        prefix = f"soak-{self.args.seed}-"
        names = Counter(j["name"] for j in final.values() if str(j["name"]).startswith(prefix))
        mine = {i: final[i] for i in ids if i in final}
        by_state = Counter(j["state"] for j in mine.values())
        failed = {i: j for i, j in mine.items() if j["state"] == "FAILED"}
        killed_failed = {i for i in failed if i in self.stats.killed}
        clear = {
            i for i in killed_failed if re.search(r"-9\b|signal 9|SIGKILL", failed[i].get("reason") or "")
        }
        cancelled = {i for i, j in mine.items() if j["state"] == "CANCELLED"}
        lost = sorted(i for i in ids if i not in final or final[i]["state"] not in TERMINAL)
        killed_not_failed = {
            i: {"state": mine[i]["state"], "attempt": a, "exit": self.exit_record(a)}
            for i, a in self.stats.killed.items()
            if i in mine and i not in failed
        }
        details = {i: self.http("GET", f"/api/v1/jobs/{i}")[1] for i in sorted(mine)}
        counters: Counter[str] = Counter()
        for d in details.values():
            if isinstance(d, dict):
                counters.update(d.get("counters", {}))
        server = self.stats.server
        round_p95 = [v for f in server.values() if (v := f.get("round_p95_s")) is not None]
        hb_p99 = [v for f in server.values() if (v := f.get("heartbeat_p99_ms")) is not None]
        dups = list(self.stats.duplicates.values())
        return {
            "minutes": self.args.minutes,
            "seed": self.args.seed,
            "rate_per_min": self.args.rate,
            "fault_every_s": self.args.fault_every,
            "faults_injected": {
                "total": sum(self.stats.faults.values()),
                **dict(sorted(self.stats.faults.items())),
            },
            "faults_skipped": dict(self.stats.skipped),
            "jobs_offered": offered,
            "jobs": len(ids),
            "completed": by_state["COMPLETED"],
            "failed": len(failed),
            "failed_killed": len(killed_failed),
            "failed_killed_with_exit_reason": len(clear),
            "failed_other": len(failed) - len(killed_failed),
            "failed_other_reasons": sorted(
                {(failed[i].get("reason") or "")[:160] for i in failed if i not in killed_failed}
            )[:10],
            "killed_jobs_not_failed": killed_not_failed,
            "cancelled": len(cancelled),
            "cancelled_by_soak": len(cancelled & self.stats.cancelled),
            "cancelled_other": len(cancelled - self.stats.cancelled),
            "lost_jobs": len(lost) + len(self.ambiguous),
            "lost_job_ids": lost,
            "lost_job_states": {i: (final[i]["state"] if i in final else "MISSING") for i in lost},
            "lost_job_details": {i: self.why(i) for i in lost[:5]},
            "unanswered_submissions": list(self.ambiguous),
            "refused_submissions": self.refused[:10],
            "duplicate_submissions": sorted(n for n, c in names.items() if c > 1),
            "restarts": counters.get("restarts", 0),
            "preemptions": counters.get("preemptions", 0),
            "node_losses": counters.get("node_losses", 0),
            "duplicate_runs": len(dups),
            "duplicate_runs_agent_down": sum(1 for d in dups if d["agent_down"]),
            "duplicate_runs_other": sum(1 for d in dups if not d["agent_down"]),
            "duplicate_run_samples": dups[:20],
            "api_requests": dict(self.stats.statuses),
            "api_5xx": len(self.stats.api_5xx),
            "api_5xx_samples": self.stats.api_5xx[:10],
            "api_unreachable": self.stats.unreachable,
            "bad_burst_statuses": dict(self.stats.bad_burst_statuses),
            "bad_burst_not_json": self.stats.bad_burst_not_json,
            "round_p95_s": max(round_p95) if round_p95 else None,
            "heartbeat_p99_ms": max(hb_p99) if hb_p99 else None,
            "heartbeat_client_p99_ms": pct(self.stats.probe_ms, 99),
            "heartbeat_client_p50_ms": pct(self.stats.probe_ms, 50),
            "heartbeat_client_samples": len(self.stats.probe_ms),
            "server_figures_by_master_pid": {str(k): v for k, v in sorted(server.items())},
            "master_rss_mb": max(self.stats.rss.values()) if self.stats.rss else None,
            "master_pids": len(self.stats.rss),
            "master_restart_failures": self.stats.restart_failures,
            "drain_s": round(drain_s, 1),
            "fault_log": self.stats.fault_log,
        }

    def why(self, job: str) -> dict[str, Any]:
        """A lost job's history, attempts and the planner's explanation (for the report)."""
        out: dict[str, Any] = {}
        with contextlib.suppress(Unreachable):
            _, detail = self.http("GET", f"/api/v1/jobs/{job}")
            if isinstance(detail, dict):
                out["history"] = detail.get("history", [])[-8:]
                out["attempts"] = detail.get("attempts", [])[-6:]
            _, explain = self.http("GET", f"/api/v1/jobs/{job}/explain")
            out["explain"] = explain
            _, nodes = self.http("GET", "/api/v1/nodes")
            if isinstance(nodes, dict):
                out["nodes"] = [
                    {k: n.get(k) for k in ("id", "health", "drained", "free_gpus", "running")}
                    for n in nodes["nodes"]
                ]
        return out

    def exit_record(self, attempt: str) -> dict[str, Any] | None:
        """What the node wrapper recorded when the attempt ended (a kill that came too late finds exit 0)."""
        for sid, _, _ in SERVERS:
            with contextlib.suppress(Exception):
                return dict(ops.status(self.root / "nodes" / sid, attempt)["attempts"][0]["exit"] or {})
        return None


TABLE = [
    ("faults injected", lambda f: f"{f['faults_injected']['total']}  "
     + " ".join(f"{k}={v}" for k, v in f["faults_injected"].items() if k != "total")),
    ("jobs (offered / submitted)", lambda f: f"{f['jobs_offered']} / {f['jobs']}"),
    ("completed", lambda f: f["completed"]),
    ("failed (killed by soak, with -9 reason / other)",
     lambda f: f"{f['failed']} ({f['failed_killed']}, {f['failed_killed_with_exit_reason']} / {f['failed_other']})"),
    ("cancelled (by soak / other)", lambda f: f"{f['cancelled']} ({f['cancelled_by_soak']} / {f['cancelled_other']})"),
    ("lost jobs", lambda f: f["lost_jobs"]),
    ("restarts / preemptions / node losses", lambda f: f"{f['restarts']} / {f['preemptions']} / {f['node_losses']}"),
    ("duplicate runs (agent down / other)",
     lambda f: f"{f['duplicate_runs']} ({f['duplicate_runs_agent_down']} / {f['duplicate_runs_other']})"),
    ("API 5xx / unreachable", lambda f: f"{f['api_5xx']} / {f['api_unreachable']}"),
    ("round p95 (s, server)", lambda f: f["round_p95_s"]),
    ("heartbeat p99 (ms, server / client)", lambda f: f"{f['heartbeat_p99_ms']} / {f['heartbeat_client_p99_ms']}"),
    ("master RSS (VmHWM MB, max over restarts)", lambda f: f["master_rss_mb"]),
    ("drain (s)", lambda f: f["drain_s"]),
]  # fmt: skip


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else str(value)
    return str(value)


def print_report(figures: dict[str, Any]) -> None:
    """The table, then the lists that show a problem when they are not empty."""
    width = max(len(name) for name, _ in TABLE)
    for name, get in TABLE:
        print(f"{name:<{width}}  {show(get(figures))}")
    for key in ("lost_job_states", "killed_jobs_not_failed", "failed_other_reasons", "api_5xx_samples"):
        if figures[key]:
            print(f"{key}: {json.dumps(figures[key])[:1500]}")
