"""Elastic jobs on the real master with in-process agents: given more GPUs than its smallest count,
a job ends in fewer steps, and the master counts its work and measures its rate in the estimator's
unit; a job submitted for one server never gets a placement over two."""

from __future__ import annotations

import json
import sys
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.inprocess import InProcessCluster

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "emulated_train.py")
CONFIG: dict[str, Any] = {
    "cluster": {"name": "elastic"},
    "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 2}],
    "tenants": [{"name": "lab"}],
    "scheduler": {"round_seconds": 5, "profiling_iterations": 10},
    "master": {"heartbeat_interval_s": 0.5, "suspect_after_s": 3, "lost_after_s": 8},
}
ITERS, BATCH, STEP_S = 1200, 16, 0.02  # 600 steps on 2 GPUs: 12 s, past one observation interval


def test_a_job_given_twice_its_smallest_count_ends_in_half_the_steps(
    in_process_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = in_process_cluster(CONFIG, {"n1": 1.0})
    cluster.wait(
        lambda: all(n["health"] == "HEALTHY" for n in cluster.api("GET", "/api/v1/nodes")["nodes"]),
        30,
        "a healthy node",
    )
    command = [sys.executable, EXAMPLE, "--iters", str(ITERS), "--step-seconds", str(STEP_S)]
    body = {"command": command, "gpus": [1, 2], "batch_size": BATCH, "iterations": ITERS, "tenant": "lab"}
    job_id = cluster.api("POST", "/api/v1/jobs", body)["id"]
    cluster.wait(
        lambda: cluster.api("GET", f"/api/v1/jobs/{job_id}")["state"] == "COMPLETED", 90, f"{job_id} to end"
    )
    detail = cluster.api("GET", f"/api/v1/jobs/{job_id}")
    runs = [a for a in detail["attempts"] if not a["profiling"]]
    assert len(runs) == 1 and sum(runs[0]["placement"].values()) == 2, runs  # nothing else wanted GPUs
    progress = json.loads(
        (cluster.root / "nodes" / "n1" / "attempts" / runs[0]["id"] / "progress.json").read_text()
    )
    # each step on 2 GPUs did 2 of the job's iterations (counted at 1 GPU): half the steps
    assert (progress["iteration"], progress["work"]) == (ITERS // 2, float(ITERS)), progress
    # ended, it is in no plan to come: explain shows no priority, window or planner note for it
    explained = cluster.api("GET", f"/api/v1/jobs/{job_id}/explain")
    assert (explained["priority"], explained["in_window"], explained["note"]) == (None, None, None)
    ctl = cluster.master.ctl
    assert ctl is not None

    async def measured() -> list[Any]:  # read on the loop's thread, once every record is committed
        while ctl.writer.pending():
            await ctl.settled()
        return ctl.store.throughput(job_id)

    samples = cluster.call(measured())
    assert samples, "no throughput measured"
    # measured as the estimator predicts: batch x 2 samples per iteration (STEP_S each, and overhead);
    # in protocol 2's accounting it was batch x 1 per iteration, half of that
    rates = [s["samples_per_s"] for s in samples]
    assert all(BATCH * 2 / STEP_S / 1.4 < r <= BATCH * 2 / STEP_S for r in rates), rates


def test_a_job_for_one_server_runs_on_one_and_one_no_server_can_hold_is_refused(
    in_process_cluster: Callable[..., InProcessCluster],
) -> None:
    # two 1-GPU servers: a `--gpus 1,2` job may take one GPU of each; submitted for one server, it
    # runs on one GPU of one server; `--gpus 2` for one server can never run and is refused
    config = {
        **CONFIG,
        "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 1}, {"id": "n2", "gpu_type": "v100", "gpus": 1}],
    }
    cluster = in_process_cluster(config, {"n1": 1.0, "n2": 1.0})
    cluster.wait(
        lambda: all(n["health"] == "HEALTHY" for n in cluster.api("GET", "/api/v1/nodes")["nodes"]),
        30,
        "healthy nodes",
    )
    command = [sys.executable, EXAMPLE, "--iters", "100", "--step-seconds", str(STEP_S)]
    body = {"command": command, "gpus": [1, 2], "batch_size": BATCH, "iterations": 100, "tenant": "lab"}
    job_id = cluster.api("POST", "/api/v1/jobs", {**body, "one_server": True})["id"]
    cluster.wait(
        lambda: cluster.api("GET", f"/api/v1/jobs/{job_id}")["state"] == "COMPLETED", 90, f"{job_id} to end"
    )
    detail = cluster.api("GET", f"/api/v1/jobs/{job_id}")
    assert detail["one_server"] is True
    assert [a["placement"] for a in detail["attempts"] if not a["profiling"]] in ([{"n1": 1}], [{"n2": 1}])
    with pytest.raises(urllib.error.HTTPError) as refused:
        cluster.api("POST", "/api/v1/jobs", {**body, "gpus": [2], "one_server": True})
    assert refused.value.code == 422
    error = json.loads(refused.value.read())["error"]
    assert error["field"] == "one_server" and "largest has 1" in error["message"], error
