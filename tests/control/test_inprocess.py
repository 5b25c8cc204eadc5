"""The real master with in-process agents: jobs run (real processes through the node wrapper), are
cancelled and complete, and the scheduler's invariants hold at the end (checked by the fixture)."""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.control.snapshot import waited_s
from hopsmgr.core.priority import expected_run_s
from hopsmgr.master.views import wait_context
from tests.helpers.inprocess import InProcessCluster

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "emulated_train.py")
CONFIG: dict[str, Any] = {
    "cluster": {"name": "in-process"},
    "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 2}, {"id": "n2", "gpu_type": "k80", "gpus": 2}],
    "tenants": [{"name": "vision", "guaranteed_gpus": 2}, {"name": "nlp"}],
    "scheduler": {"round_seconds": 5, "profiling_iterations": 10},
    "master": {"heartbeat_interval_s": 0.5, "suspect_after_s": 3, "lost_after_s": 8},
}


def job(iters: int, gpus: list[int], tenant: str) -> dict[str, Any]:
    command = [sys.executable, EXAMPLE, "--iters", str(iters), "--step-seconds", "0.02"]
    return {"command": command, "gpus": gpus, "batch_size": 16, "iterations": iters, "tenant": tenant}


def test_jobs_run_complete_and_cancel_with_the_invariants_held(
    in_process_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = in_process_cluster(CONFIG, {"n1": 1.0, "n2": 0.5})
    cluster.wait(
        lambda: all(n["health"] == "HEALTHY" for n in cluster.api("GET", "/api/v1/nodes")["nodes"]),
        30,
        "healthy nodes",
    )
    short = [cluster.api("POST", "/api/v1/jobs", job(60, [1, 2], t))["id"] for t in ("vision", "nlp", "nlp")]
    long = cluster.api("POST", "/api/v1/jobs", job(100_000, [1], "vision"))["id"]

    def state(job_id: str) -> str:
        return str(cluster.api("GET", f"/api/v1/jobs/{job_id}")["state"])

    cluster.wait(lambda: state(long) == "RUNNING", 60, f"{long} running")
    ctl = cluster.master.ctl
    assert ctl is not None
    # the API's latency ratio is the running job's wait (frozen while it runs) over its expected run
    # time, not the priority the planner gave it (projected over the plan's horizon)
    shown = cluster.api("GET", f"/api/v1/jobs/{long}")
    live = ctl.machine.state.jobs[long]
    if live.state.value == "RUNNING":
        waited = waited_s(live, ctl.machine.state, ctl.clock())
        age = expected_run_s(live.spec, wait_context(ctl))
        assert shown["latency_ratio"] == pytest.approx(waited / age, rel=1e-6, abs=1e-9)
    cluster.api("POST", f"/api/v1/jobs/{long}/cancel")
    cluster.wait(lambda: all(state(j) == "COMPLETED" for j in short), 90, "the short jobs to complete")
    cluster.wait(lambda: state(long) == "CANCELLED", 30, f"{long} cancelled")
    cluster.wait(lambda: not ctl.machine.state.attempts, 30, "every attempt to end")
    detail = cluster.api("GET", f"/api/v1/jobs/{long}")
    assert [a["end_reason"] for a in detail["attempts"] if not a["profiling"]][-1] in ("exited", "cancelled")
    # the three short jobs' ends came in heartbeats, each acknowledged once its records were committed
    request = urllib.request.Request(f"{cluster.url}/metrics")
    request.add_header("Authorization", f"Bearer {cluster.admin}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    deferred = re.search(r"^hopsmgr_heartbeat_deferred_total (\d+)", text, re.MULTILINE)
    assert deferred is not None, text
    cluster.wait(lambda: not ctl.unacked_ends, 30, "every end acknowledged to its agent")
