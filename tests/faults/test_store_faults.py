"""Faults of the master's state file: SIGKILL in the middle of a burst of writes, and a full disk.

The API acknowledges a submission (201) only once its transaction is on disk, so whatever it
acknowledged survives a SIGKILL, and the SQLite file stays intact. A master that cannot write its state
(file size limit: EFBIG on the WAL) refuses with 503 naming the state file, and keeps what it stored.
No agents: nothing runs, the jobs stay PENDING.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import threading
from typing import Any

import pytest

from tests.faults.conftest import MakeCluster
from tests.faults.helpers import jobs_by_id
from tests.integration.cluster import EXAMPLE, PYTHON, LocalCluster, wait_for


def submission(name: str) -> dict[str, Any]:
    return {
        "command": [PYTHON, EXAMPLE, "--iters", "10"],
        "gpus": [1],
        "batch_size": 8,
        "iterations": 10,
        "tenant": "guest",
        "name": name,
    }


def integrity(cluster: LocalCluster) -> str:
    db = sqlite3.connect(f"file:{cluster.state_dir / 'state.db'}?mode=ro", uri=True)
    try:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        db.close()


def check_intact(cluster: LocalCluster, acked: dict[str, str]) -> None:
    """Every acknowledged job is there, as submitted (name, state, command)."""
    assert integrity(cluster) == "ok"
    jobs = jobs_by_id(cluster)
    missing = sorted(set(acked) - set(jobs))
    assert not missing, f"acknowledged jobs lost: {missing}"
    for job_id, name in acked.items():
        assert jobs[job_id]["name"] == name and jobs[job_id]["state"] == "PENDING", jobs[job_id]
    for job_id in list(acked)[:5]:
        assert cluster.job(job_id)["command"] == submission("x")["command"]


def test_master_sigkilled_in_a_burst_of_writes_keeps_every_acknowledged_job(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster()
    cluster.start_master()
    acked: dict[str, str] = {}
    errors: list[str] = []
    lock = threading.Lock()
    go = threading.Event()

    def submitter(k: int) -> None:
        n = 0
        while go.is_set():
            name = f"t{k}-{n}"
            n += 1
            try:
                status, data = cluster.request("POST", "/api/v1/jobs", submission(name))
            except OSError as exc:  # the master died under us
                errors.append(repr(exc))
                return
            if status == 201:
                with lock:
                    acked[data["id"]] = name

    go.set()
    threads = [threading.Thread(target=submitter, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 80, 60, "80 acknowledged submissions")
        cluster.kill_master(signal.SIGKILL)  # requests still in flight
    finally:
        go.clear()
        for t in threads:
            t.join(40)
    cluster.start_master()
    check_intact(cluster, acked)
    ids = sorted(jobs_by_id(cluster))
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_master_on_a_full_disk_answers_503_and_keeps_what_it_stored(make_cluster: MakeCluster) -> None:
    cluster = make_cluster()
    cluster.start_master()
    acked: dict[str, str] = {}
    for i in range(5):
        data = cluster.api("POST", "/api/v1/jobs", submission(f"early{i}"))
        acked[data["id"]] = f"early{i}"
    cluster.kill_master(signal.SIGTERM)  # a clean stop: the WAL is folded into state.db
    db = cluster.state_dir / "state.db"
    used = db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob("state.db-*"))
    (cluster.root / "master.log").rename(cluster.root / "master-1.log")  # its log must fit too
    # RLIMIT_FSIZE: no file of the master may grow past this (the WAL reaches it first)
    cluster.master_prefix = ["prlimit", f"--fsize={used + 48 * 1024}"]
    cluster.start_master()
    refused: dict[str, Any] | None = None
    for i in range(500):
        status, data = cluster.request("POST", "/api/v1/jobs", submission(f"late{i}"))
        if status == 201:
            acked[data["id"]] = f"late{i}"
            continue
        assert status == 503, (status, data)
        refused = data["error"]
        break
    assert refused is not None, "the master never ran out of room"
    assert str(db) in refused["message"] and "cannot write" in refused["message"], refused
    assert cluster.healthz() is not None  # still serving: reads work, writes are refused
    status, _ = cluster.request("GET", "/api/v1/jobs")
    assert status == 200
    cluster.kill_master(signal.SIGKILL)
    cluster.master_prefix = []
    cluster.start_master()
    check_intact(cluster, acked)
    data = cluster.api("POST", "/api/v1/jobs", submission("after"))  # room again: writes work
    assert data["id"] not in acked
