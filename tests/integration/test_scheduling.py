"""Scheduling on a real local cluster: guarantees and preemption, cancel, master crash, node loss."""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3

from tests.integration.cluster import LocalCluster, wait_for


def kinds(job: dict) -> list[str]:
    return [h["kind"] for h in job["history"]]


def runs(job: dict) -> list[dict]:
    return [a for a in job["attempts"] if not a["profiling"]]


def test_owner_under_guarantee_preempts_borrowers_which_resume(cluster: LocalCluster) -> None:
    guests = [cluster.submit(iters=2000, step=0.02, tenant="nlp", name=f"guest{i}") for i in range(4)]
    for g in guests:
        cluster.wait_state(g, "RUNNING", timeout=60)
    owner = cluster.submit(gpus="2", iters=40, step=0.02, tenant="vision", name="owner")
    done = cluster.wait_state(owner, "COMPLETED", timeout=90)
    assert "completed" in kinds(done)
    preempted = [g for g in guests if "preempted" in kinds(cluster.job(g))]
    assert len(preempted) >= 2  # the owner's 2 guaranteed GPUs came from borrowers
    for g in preempted:
        job = cluster.job(g)
        requeued = [h for h in job["history"] if h["kind"] == "requeued"]
        assert requeued and "checkpointed" in requeued[0]["message"]
        assert runs(job)[0]["exit_code"] == 75  # EXIT_CHECKPOINTED: saved and exited when asked
    # the borrowers come back and finish from their checkpoints
    for g in preempted:
        job = cluster.wait_state(g, "RUNNING", "COMPLETED", timeout=60)
        assert len(runs(job)) >= 2
        assert job["attempts"][-1]["id"] != runs(job)[0]["id"]


def test_cancel_stops_the_running_process(cluster: LocalCluster) -> None:
    job_id = cluster.submit(iters=5000, step=0.02, tenant="vision")
    running = cluster.wait_state(job_id, "RUNNING")
    attempt = runs(running)[-1]["id"]
    out = cluster.cli("cancel", job_id).stdout
    assert "CANCELLED" in out or job_id in out
    wait_for(lambda: runs(cluster.job(job_id))[-1]["ended"] is not None, 30, "attempt ended")
    job = cluster.job(job_id)
    assert job["state"] == "CANCELLED" and runs(job)[-1]["end_reason"] == "cancelled"
    node = next(iter(runs(job)[-1]["placement"]))
    status = json.loads((cluster.root / "nodes" / node / "attempts" / attempt / "exit.json").read_text())
    assert status["code"] is not None or status["signal"] is not None
    wait_for(
        lambda: all(n["free_gpus"] == n["gpus"] for n in cluster.api("GET", "/api/v1/nodes")["nodes"]),
        20,
        "GPUs free",
    )
    again = cluster.cli("cancel", job_id, check=False)
    assert again.returncode == 1 and "already ended" in again.stderr


def test_master_sigkill_and_restart_loses_nothing_and_runs_nothing_twice(cluster: LocalCluster) -> None:
    jobs = [cluster.submit(iters=250, step=0.03, tenant="vision", name=f"j{i}") for i in range(3)]
    for j in jobs[:2]:
        cluster.wait_state(j, "RUNNING", timeout=60)
    epoch = cluster.healthz()["epoch"]  # type: ignore[index]
    cluster.kill_master(signal.SIGKILL)
    cluster.start_master()
    assert cluster.healthz()["epoch"] > epoch  # type: ignore[index]
    for j in jobs:
        cluster.wait_state(j, "COMPLETED", timeout=120)
    db = sqlite3.connect(f"file:{cluster.state_dir / 'state.db'}?mode=ro", uri=True)
    ids = [r[0] for r in db.execute("SELECT id FROM attempts")]
    assert len(ids) == len(set(ids))
    for j in jobs:
        job = cluster.job(j)
        completed = [a for a in runs(job) if a["exit_code"] == 0]
        assert len(completed) == 1, job["attempts"]
        # no two run attempts of the job overlapped in time
        spans = sorted((a["started"] or a["ended"], a["ended"]) for a in runs(job))
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            assert e1 is not None and e1 <= s2 + 1e-6


def test_lost_node_requeues_its_job_and_stale_attempt_is_reaped(cluster: LocalCluster) -> None:
    cluster.api("POST", "/api/v1/nodes/n1/drain")
    job_id = cluster.submit(iters=3000, step=0.02, tenant="vision")
    first = cluster.wait_state(job_id, "RUNNING")
    assert runs(first)[-1]["placement"] == {"n2": 1}
    stale = runs(first)[-1]["id"]
    cluster.api("POST", "/api/v1/nodes/n1/undrain")
    cluster.stop_agent("n2", signal.SIGKILL)
    wait_for(lambda: _health(cluster, "n2") == "SUSPECT", 10, "n2 SUSPECT")
    wait_for(lambda: _health(cluster, "n2") == "LOST", 15, "n2 LOST")
    job = cluster.wait_state(job_id, "RUNNING", timeout=60)
    assert [h for h in job["history"] if h["kind"] == "requeued" and "node_lost" in h["message"]]
    assert runs(job)[-1]["placement"] == {"n1": 1}
    # n2 comes back: its agent still sees the stale attempt running and is told to stop it
    cluster.start_agent("n2")
    exit_file = cluster.root / "nodes" / "n2" / "attempts" / stale / "exit.json"
    wait_for(exit_file.exists, 30, "stale attempt reaped on n2")
    assert _health(cluster, "n2") == "HEALTHY"
    cluster.api("POST", f"/api/v1/jobs/{job_id}/cancel")


def _health(cluster: LocalCluster, node: str) -> str:
    return str(cluster.api("GET", f"/api/v1/nodes/{node}")["health"])


def test_a_job_no_gpu_type_can_hold_runs_across_types_with_speed_balanced_batches(
    cluster: LocalCluster,
) -> None:
    # 4 GPUs: more than the v100 node (2, speed 1.0) or the k80 node (2, speed 0.5) has alone. The
    # placement spans both; each rank's share of the global batch follows its GPU's profiled speed,
    # so the v100 node takes about twice the k80 node's share and neither waits for the other.
    job_id = cluster.submit(gpus="4", iters=60, step=0.02, name="mixed")
    done = cluster.wait_state(job_id, "COMPLETED", timeout=120)
    run = runs(done)[-1]
    assert run["placement"] == {"n1": 2, "n2": 2}
    shares, logs = {}, {}
    for node in ("n1", "n2"):
        logs[node] = (cluster.root / "nodes" / node / "attempts" / run["id"] / "log").read_text()
        line = next(x for x in logs[node].splitlines() if x.startswith("batch share "))
        shares[node] = float(line.split()[2])
    assert "final checksum" in logs["n1"]  # node rank 0 trained to the end
    assert abs(shares["n1"] + shares["n2"] - 1.0) < 1e-3
    assert 1.6 < shares["n1"] / shares["n2"] < 2.5, shares
