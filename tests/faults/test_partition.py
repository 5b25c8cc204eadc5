"""An agent cut off from the master, and an agent killed and restarted, while its node runs a job.

Jobs are detached from agents and masters: they keep running through both faults. A node that stays
silent past `lost_after_s` (4 s here) is LOST and its job requeued elsewhere; while the node is away
nothing can stop the old attempt, so for that while the job runs twice (split brain, the documented
behaviour). Once the node is back its agent reports the stale attempt, the master answers `stop`, and
from then on the job runs once. An agent back within `lost_after_s` loses nothing: the attempt is kept.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from hopsmgr.node import ops
from tests.faults.conftest import MakeCluster
from tests.faults.helpers import RunWatcher, TcpProxy, all_completed, jobs_by_id, kinds, runs
from tests.integration.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.slow


def health(cluster: LocalCluster, node: str) -> str:
    return str(cluster.api("GET", f"/api/v1/nodes/{node}")["health"])


def attempt_state(cluster: LocalCluster, node: str, attempt: str) -> str:
    return str(ops.status(cluster.root / "nodes" / node, attempt)["attempts"][0]["state"])


def exit_record(cluster: LocalCluster, node: str, attempt: str) -> dict[str, object] | None:
    path = cluster.root / "nodes" / node / "attempts" / attempt / "exit.json"
    return json.loads(path.read_text()) if path.exists() else None


def start_on_n2(cluster: LocalCluster, iters: int) -> tuple[str, str]:
    """A guest job running on n2 (n1 drained meanwhile, then undrained): (job id, attempt id)."""
    cluster.api("POST", "/api/v1/nodes/n1/drain")
    job_id = cluster.submit(iters=iters, step=0.02, tenant="guest", name="long")
    job = cluster.wait_state(job_id, "RUNNING", timeout=60)
    attempt = runs(job)[-1]
    assert attempt["placement"] == {"n2": 1}, attempt
    cluster.api("POST", "/api/v1/nodes/n1/undrain")
    return job_id, attempt["id"]


def relaunched_on_n1(cluster: LocalCluster, job_id: str, stale: str) -> str:
    """Wait until the job runs again, on n1, after a node_lost requeue; the new attempt's id."""

    def moved() -> bool:
        job = cluster.job(job_id)
        return job["state"] == "RUNNING" and runs(job)[-1]["id"] != stale

    wait_for(moved, 30, f"{job_id} running again", lambda: cluster.job(job_id))
    job = cluster.job(job_id)
    assert [h for h in job["history"] if h["kind"] == "requeued" and "node_lost" in h["message"]], job
    assert runs(job)[-1]["placement"] == {"n1": 1}
    return str(runs(job)[-1]["id"])


def reaped(cluster: LocalCluster, node: str, stale: str, log: Path) -> float:
    """Wait for the stale attempt's exit record (the agent stopped it when told); when it was seen."""
    wait_for(lambda: exit_record(cluster, node, stale) is not None, 30, f"{stale} stopped on {node}")
    seen = time.time()

    def logged() -> bool:
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        return any(e.get("event") == "reaped" and e.get("attempt_id") == stale for e in events)

    wait_for(logged, 10, "the agent's log of reaping the stale attempt")
    return seen


def test_partitioned_agent_job_moves_and_stale_attempt_is_stopped_on_heal(make_cluster: MakeCluster) -> None:
    cluster = make_cluster()
    cluster.start_master()
    proxy = TcpProxy(int(cluster.url.rsplit(":", 1)[1])).start()
    try:
        cluster.start_agent("n1")
        cluster.start_agent("n2", master_url=proxy.url)
        wait_for(lambda: health(cluster, "n1") == health(cluster, "n2") == "HEALTHY", 20, "nodes healthy")
        with RunWatcher(cluster.root) as watcher:
            job_id, stale = start_on_n2(cluster, iters=600)
            proxy.stop()  # partition: n2 and its job go on, unheard
            wait_for(lambda: health(cluster, "n2") == "SUSPECT", 10, "n2 SUSPECT")
            wait_for(lambda: health(cluster, "n2") == "LOST", 15, "n2 LOST")
            fresh = relaunched_on_n1(cluster, job_id, stale)
            assert attempt_state(cluster, "n2", stale) == "running"  # nobody could tell it to stop
            # The known limit: both attempts run at once while n2 is away. Let the watcher (0.1-s samples)
            # see it before the heal, so a quick heal cannot hide it.
            pair = tuple(sorted((stale, fresh)))
            wait_for(
                lambda: any(o.attempts == pair for o in watcher.overlaps),
                15,
                "the watcher seeing both attempts run",
                lambda: watcher.running(),
            )
            proxy.start()  # heal
            t_reaped = reaped(cluster, "n2", stale, cluster.root / "agent-n2.log")
            wait_for(lambda: health(cluster, "n2") == "HEALTHY", 10, "n2 HEALTHY again")
            wait_for(
                lambda: all_completed(cluster, [job_id]), 60, "job COMPLETED", lambda: jobs_by_id(cluster)
            )
            watcher.stop()
        assert not watcher.overlaps_after(t_reaped), watcher.overlaps_after(t_reaped)[:5]
        # while n2 was away its attempt and the new one ran at once (and the watcher saw it): that pair only
        split = {o.attempts for o in watcher.overlaps}
        assert split == {tuple(sorted((stale, fresh)))}, split
        job = cluster.job(job_id)
        assert runs(job)[-1]["id"] == fresh and runs(job)[-1]["exit_code"] == 0
        stale_row = next(a for a in job["attempts"] if a["id"] == stale)
        assert stale_row["end_reason"] == "node_lost", stale_row
    finally:
        proxy.stop()


def test_agent_restarted_in_time_keeps_its_attempt_and_late_one_loses_it(make_cluster: MakeCluster) -> None:
    cluster = make_cluster().start()
    with RunWatcher(cluster.root) as watcher:
        job_id, first = start_on_n2(cluster, iters=500)
        wait_for(lambda: ops.status(cluster.root / "nodes" / "n2", first)["attempts"][0]["pid"], 10, "pid")
        # (1) killed and back within lost_after_s: nothing happens to the job
        cluster.stop_agent("n2", signal.SIGKILL)
        cluster.start_agent("n2")
        wait_for(lambda: health(cluster, "n2") == "HEALTHY", 10, "n2 HEALTHY again")
        job = cluster.job(job_id)
        assert job["state"] == "RUNNING" and runs(job)[-1]["id"] == first, job
        assert "requeued" not in kinds(job)
        assert attempt_state(cluster, "n2", first) == "running"
        # the restarted agent still reports it: its progress keeps coming
        before = job["progress"]
        wait_for(lambda: cluster.job(job_id)["progress"] > before, 10, "progress after the restart")
        # (2) killed and away past lost_after_s: the job is requeued on n1; the old attempt runs on
        assert "LOST" not in {health(cluster, "n1"), health(cluster, "n2")}
        cluster.stop_agent("n2", signal.SIGKILL)
        wait_for(lambda: health(cluster, "n2") == "LOST", 15, "n2 LOST")
        fresh = relaunched_on_n1(cluster, job_id, first)
        cluster.start_agent("n2")
        t_reaped = reaped(cluster, "n2", first, cluster.root / "agent-n2.log")
        wait_for(lambda: all_completed(cluster, [job_id]), 60, "job COMPLETED", lambda: jobs_by_id(cluster))
        watcher.stop()
    assert not watcher.overlaps_after(t_reaped), watcher.overlaps_after(t_reaped)[:5]
    job = cluster.job(job_id)
    assert kinds(job).count("requeued") == 1, job["history"]
    assert [a["id"] for a in runs(job)] == [first, fresh]
