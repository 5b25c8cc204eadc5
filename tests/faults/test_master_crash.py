"""The master crashes (os._exit(137) at a named point, hopsmgr.master.faults) and restarts without the
fault on the same state dir and port: no job is lost or failed, no job runs twice at once, attempt ids
never repeat, the epoch goes up, and the attempt caught by the crash is adopted or requeued.

Real processes throughout: a master, two agents (emulated v100 nodes), jobs started through the node
wrapper. A watcher samples the node work dirs for the whole test.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from tests.faults.conftest import CAPPED, MakeCluster
from tests.faults.helpers import (
    RunWatcher,
    all_completed,
    check_attempt_ids,
    db_rows,
    jobs_by_id,
    kinds,
    runs,
)
from tests.integration.cluster import LocalCluster, wait_for

CRASHED = 137


def epoch_of(cluster: LocalCluster) -> int:
    return int(json.loads((cluster.state_dir / "master.json").read_text())["epoch"])


def crash_and_restart(cluster: LocalCluster, point: str, timeout: float = 60) -> int:
    """Start the master with the crash point, wait for it to fire, start it again without it.

    Returns the epoch of the master that crashed."""
    previous = epoch_of(cluster)
    cluster.master_env = {"HOPSMGR_FAULT": point}
    cluster.start_master()
    crashed_epoch = epoch_of(cluster)
    assert crashed_epoch > previous
    code = cluster.wait_master_exit(timeout)
    assert code == CRASHED, f"the master exited with {code}, not at {point}"
    cluster.master_env = {}
    cluster.start_master()
    assert epoch_of(cluster) > crashed_epoch  # every start takes a higher epoch
    assert cluster.healthz()["epoch"] == epoch_of(cluster)  # type: ignore[index]
    return crashed_epoch


def finish_and_check(cluster: LocalCluster, watcher: RunWatcher, ids: list[str], timeout: float = 90) -> None:
    wait_for(lambda: all_completed(cluster, ids), timeout, "every job COMPLETED", lambda: jobs_by_id(cluster))
    watcher.stop()
    assert watcher.samples > 20
    assert not watcher.overlaps, f"a job ran twice at once: {watcher.overlaps[:5]}"
    rows = check_attempt_ids(cluster)
    meta = db_rows(cluster, "SELECT value FROM meta WHERE key = 'epoch'")
    assert int(meta[0]["value"]) == epoch_of(cluster)
    assert all(r["epoch"] <= epoch_of(cluster) for r in rows)
    for j in ids:
        job = cluster.job(j)
        completed = [a for a in runs(job) if a["exit_code"] == 0]
        assert len(completed) == 1, job["attempts"]


def crash_attempts(cluster: LocalCluster, epoch: int) -> list[dict[str, Any]]:
    """Run attempts the crashed master (of `epoch`) stored."""
    return db_rows(cluster, "SELECT * FROM attempts WHERE epoch = ? AND profiling = 0", (epoch,))


def last_first_round(cluster: LocalCluster) -> float:
    rows = db_rows(cluster, "SELECT max(time) AS t FROM rounds WHERE kind = 'first'")
    return float(rows[0]["t"] or 0.0)


def history_after(job: dict[str, Any], t: float) -> list[str]:
    return [h["kind"] for h in job["history"] if h["time"] >= t]


LAUNCH_POINTS = ["launch.before_store", "launch.after_store", "launch.in_command", "launch.after_command"]


@pytest.mark.slow
@pytest.mark.parametrize("point", LAUNCH_POINTS)
def test_master_crash_while_launching_a_run(make_cluster: MakeCluster, point: str) -> None:
    """Three jobs of a tenant capped at one GPU: one runs, two wait. The master is SIGKILLed once all are
    profiled, restarted with the crash point (it fires when the next queued job is launched), then
    restarted without it: everything completes, nothing ran twice, the caught launch is sorted out."""
    cluster = make_cluster(tenants=CAPPED).start()
    with RunWatcher(cluster.root) as watcher:
        ids = [cluster.submit(iters=150, step=0.02, tenant="capped", name=f"c{i}") for i in range(3)]

        def profiled_and_waiting() -> bool:
            states = [jobs_by_id(cluster)[j]["state"] for j in ids]
            return "QUEUED" in states and not {"PENDING", "PROFILING"} & set(states)

        wait_for(profiled_and_waiting, 60, "all profiled, one queued", lambda: jobs_by_id(cluster))
        # profiles reach the state file with the estimator's state, at the next first plan of a round
        saved = time.time()
        wait_for(lambda: last_first_round(cluster) > saved, 10, "the estimator state saved")
        assert "QUEUED" in [jobs_by_id(cluster)[j]["state"] for j in ids]
        cluster.kill_master(signal.SIGKILL)  # a plain crash first: the fault master starts from it
        t_fault = time.time()
        epoch = crash_and_restart(cluster, point)
        caught = crash_attempts(cluster, epoch)
        stored = db_rows(cluster, "SELECT id FROM attempts WHERE epoch = ?", (epoch,))
        finish_and_check(cluster, watcher, ids)

    if point == "launch.before_store":
        assert stored == []  # nothing was stored: nothing to repair
        return
    assert len(caught) == 1 and len(stored) == 1, stored  # the launch of a run, nothing else
    attempt = caught[0]
    job = cluster.job(attempt["job_id"])
    after = history_after(job, t_fault)
    final = next(a for a in job["attempts"] if a["id"] == attempt["id"])
    on_node = list(cluster.root.glob(f"nodes/*/attempts/{attempt['id']}"))
    if point == "launch.after_store":
        # stored, never sent: ended at the node's first beat after the restart, job requeued
        assert final["end_reason"] == "vanished", final
        assert "requeued" in after, job["history"]
        assert on_node == []
        return
    # The node started it: it kept running and finished as the job's one successful attempt, recorded
    # as started by the crashed master itself (its agent reported it before the command returned) or
    # adopted by the new one. In the middle of the command the launch may also not have started by the
    # node's first beat to the new master: then it ended ("vanished") and the job was requeued.
    continued = final["exit_code"] == 0 and "requeued" not in after and {"adopted", "started"} & set(after)
    if point == "launch.after_command":
        assert continued, job
    else:
        assert continued or (final["end_reason"] == "vanished" and "requeued" in after), job


def test_master_crash_while_launching_a_profiling_run(make_cluster: MakeCluster) -> None:
    """The very first launch of a fresh master is a profiling run: crash in the middle of its command."""
    cluster = make_cluster(tenants=CAPPED, master_env={"HOPSMGR_FAULT": "launch.in_command"}).start()
    with RunWatcher(cluster.root) as watcher:
        ids = [cluster.submit(iters=40, step=0.02, tenant="capped", name="p")]
        assert cluster.wait_master_exit(30) == CRASHED
        cluster.master_env = {}
        cluster.start_master()
        finish_and_check(cluster, watcher, ids)
    for j in ids:
        assert "profiled" in kinds(cluster.job(j))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["stop.after_store", "stop.after_command"])
def test_master_crash_while_checkpointing_a_borrower(make_cluster: MakeCluster, point: str) -> None:
    """Two guests borrow the whole cluster; the owner (guaranteed 2 GPUs) arrives and a guest is asked to
    checkpoint-and-stop: the master crashes there and restarts without the fault. The guest is
    checkpointed (not left CHECKPOINTING), the owner runs, everything completes, nothing ran twice."""
    cluster = make_cluster(master_env={"HOPSMGR_FAULT": point}).start()
    with RunWatcher(cluster.root) as watcher:
        guests = [cluster.submit(iters=500, step=0.02, tenant="guest", name=f"g{i}") for i in range(2)]
        wait_for(
            lambda: all(jobs_by_id(cluster)[g]["state"] == "RUNNING" for g in guests),
            60,
            "guests running",
            lambda: jobs_by_id(cluster),
        )
        owner = cluster.submit(gpus="2", iters=40, step=0.02, tenant="owner", name="owner")
        ids = [*guests, owner]
        assert cluster.wait_master_exit(60) == CRASHED
        # the guest asked to checkpoint (with stop.after_command its exit may already be recorded: the
        # agent can report it before the command's reply reaches the master)
        stopping = db_rows(cluster, "SELECT * FROM attempts WHERE stopping = 1")
        assert len(stopping) == 1, stopping
        victim = stopping[0]
        if point == "stop.after_store":
            assert victim["ended"] is None
        cluster.master_env = {}
        cluster.start_master()
        # the interrupted checkpoint-and-stop is carried out (or its result recorded) soon after the restart
        wait_for(
            lambda: "requeued" in kinds(cluster.job(victim["job_id"])),
            30,
            f"{victim['id']} checkpointed after the restart",
            lambda: cluster.job(victim["job_id"])["history"],
        )
        finish_and_check(cluster, watcher, ids, timeout=120)
    job = cluster.job(victim["job_id"])
    first = next(a for a in job["attempts"] if a["id"] == victim["id"])
    assert first["exit_code"] == 75, first  # it saved a checkpoint and exited when asked
    requeued = [h for h in job["history"] if h["kind"] == "requeued"]
    assert "checkpointed" in requeued[0]["message"], requeued
    assert len(runs(job)) >= 2


def test_profiles_survive_a_master_crash(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(tenants=CAPPED)
    config = cluster.write_config()
    config.write_text(config.read_text().replace("round_seconds = 2", "round_seconds = 60"))
    cluster.start()
    ids = [cluster.submit(iters=150, step=0.02, tenant="capped", name=f"c{i}") for i in range(2)]
    queued = ids[1]
    cluster.wait_state(queued, "QUEUED", timeout=30)  # profiled, waiting for the tenant's one GPU
    cluster.kill_master(signal.SIGKILL)
    cluster.start_master()
    wait_for(lambda: all_completed(cluster, ids), 60, "every job COMPLETED", lambda: jobs_by_id(cluster))
    profiling = [a["id"] for a in cluster.job(queued)["attempts"] if a["profiling"]]
    assert len(profiling) == 1, f"{queued} was profiled again after the restart: {profiling}"
