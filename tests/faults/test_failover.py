"""Failover of masters sharing a PostgreSQL store: real masters, agents, jobs and a real PostgreSQL.

The leader is SIGKILLed; its lease connection is terminated (pg_terminate_backend); PostgreSQL is
restarted under it; two masters start at once. Every time: at most one master says it leads, no job is
lost or fails, none runs twice at once (a watcher samples the node work dirs throughout), and a job that
ran at the fault goes on with the same attempt (the new leader adopts it, it is not restarted).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.master.server import STEPPED_DOWN
from tests.faults.helpers import RunWatcher, TcpProxy
from tests.faults.pgcluster import PgCluster
from tests.helpers.postgres import PostgresServer, missing_reason
from tests.integration.cluster import Node, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def cluster(tmp_path: Path, pg_server: PostgresServer) -> Iterator[PgCluster]:
    c = PgCluster(tmp_path, pg_server, [Node("n1", "v100", 1), Node("n2", "v100", 1)])
    try:
        yield c
    finally:
        c.close()


class LeaderWatch:
    """Samples every master's /healthz in a thread: records any moment two said they lead."""

    def __init__(self, cluster: PgCluster) -> None:
        self.cluster = cluster
        self.both: list[tuple[float, list[int]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                found = self.cluster.leaders()
                if len(found) > 1:
                    self.both.append((time.time(), found))
                self.samples += 1
            self._stop.wait(0.1)


def running_attempts(cluster: PgCluster) -> dict[str, str]:
    """Job id -> its run attempt that the store has open and started."""
    rows = cluster.rows(
        "SELECT job_id, id FROM attempts WHERE ended IS NULL AND started IS NOT NULL AND profiling = 0"
    )
    return {r["job_id"]: r["id"] for r in rows}


def submit_and_wait_running(cluster: PgCluster, n: int, iters: int = 120) -> tuple[list[str], dict[str, str]]:
    ids = [cluster.submit(iters=iters, name=f"j{k}") for k in range(n)]
    wait_for(lambda: len(running_attempts(cluster)) >= 2, 60, "two jobs running", cluster.jobs)
    return ids, running_attempts(cluster)


def check_outcome(
    cluster: PgCluster, watcher: RunWatcher, leaders: LeaderWatch, ids: list[str], before: dict[str, str]
) -> None:
    def done() -> bool:
        jobs = cluster.jobs()
        missing = [j for j in ids if j not in jobs]
        assert not missing, f"jobs lost: {missing}"
        bad = {j: jobs[j]["state"] for j in ids if jobs[j]["state"] in ("FAILED", "CANCELLED")}
        assert not bad, f"jobs ended badly: {bad}"
        return all(jobs[j]["state"] == "COMPLETED" for j in ids)

    wait_for(done, 120, "every job COMPLETED", cluster.jobs)
    watcher.stop()
    assert watcher.samples > 20 and not watcher.overlaps, f"a job ran twice at once: {watcher.overlaps[:5]}"
    assert leaders.samples > 10 and not leaders.both, f"two masters led at once: {leaders.both[:5]}"
    for job_id in ids:
        job = cluster.job(job_id)
        run = [a for a in job["attempts"] if not a["profiling"]]
        completed = [a for a in run if a["exit_code"] == 0]
        assert len(completed) == 1, attempts_text(job)
        if job_id in before:  # it ran at the fault: adopted, never restarted
            assert [a["id"] for a in run] == [before[job_id]], attempts_text(job)


def attempts_text(job: dict[str, Any]) -> str:
    """A job's attempts and events in full (pytest shortens a list of dicts to its first keys)."""
    keys = ("id", "profiling", "placement", "started", "ended", "end_reason", "exit_code")
    lines = [" ".join(f"{k}={a.get(k)!r}" for k in keys) for a in job["attempts"]]
    lines += [f"{e['time']:.3f} {e['kind']} {e['state']} {e['message']}" for e in job.get("history", [])]
    return "\n".join(lines)


def old_epoch_acts_after(cluster: PgCluster, epoch: int, t: float) -> list[dict[str, Any]]:
    """Attempts the old leader (`epoch`) created after `t`: what it did once it should have stopped."""
    return cluster.rows("SELECT id, created FROM attempts WHERE epoch = %s AND created > %s", (epoch, t))


def test_leader_sigkilled_the_standby_takes_over_and_adopts_what_runs(cluster: PgCluster) -> None:
    cluster.start()
    with RunWatcher(cluster.root) as watcher, LeaderWatch(cluster) as leaders:
        ids, before = submit_and_wait_running(cluster, 4)
        old = cluster.leader()
        assert old is not None
        old_epoch = cluster.health(old)["epoch"]  # type: ignore[index]
        killed_at = time.time()
        cluster.kill_master(old, signal.SIGKILL)
        new, _ = cluster.wait_leader(40, other_than=old)
        health = cluster.health(new)
        assert health is not None and health["epoch"] > old_epoch
        assert health["leader"]["url"] == cluster.url(new) and health["leader"]["since"] >= killed_at
        cluster.start_master(old)  # back as a standby
        assert cluster.health(old)["role"] == "standby"  # type: ignore[index]
        status = cluster.cli("status").stdout
        assert f"leader: {cluster.url(new)}" in status and f"(epoch {health['epoch']})" in status
        check_outcome(cluster, watcher, leaders, ids, before)
    assert old_epoch_acts_after(cluster, old_epoch, killed_at) == []


def test_lease_connection_terminated_the_leader_steps_down(cluster: PgCluster) -> None:
    cluster.start()
    with RunWatcher(cluster.root) as watcher, LeaderWatch(cluster) as leaders:
        ids, before = submit_and_wait_running(cluster, 4)
        old = cluster.leader()
        assert old is not None
        old_epoch = cluster.health(old)["epoch"]  # type: ignore[index]
        cut = time.time()
        assert cluster.pg.terminate("hopsmgr-lease") >= 1
        wait_for(lambda: cluster.exit_code(old) is not None, 20, "the old leader to step down")
        assert cluster.exit_code(old) == STEPPED_DOWN
        log = (cluster.root / f"master{old}.log").read_text()
        assert "leader_step_down" in log and "lease connection failed" in log
        stepped_down = time.time()
        cluster.procs.pop(old)
        new, _ = cluster.wait_leader(40, other_than=old)
        assert cluster.health(new)["leader"]["since"] >= cut  # type: ignore[index]
        cluster.start_master(old)
        check_outcome(cluster, watcher, leaders, ids, before)
    assert old_epoch_acts_after(cluster, old_epoch, stepped_down) == []


def test_two_masters_started_at_once_one_leads_the_other_sends_callers_to_it(cluster: PgCluster) -> None:
    for i in range(cluster.masters):
        cluster.start_master(i, wait=False)
    for n in cluster.nodes:
        cluster.start_agent(n.id)
    wait_for(lambda: all(cluster.health(i) is not None for i in range(2)), 30, "both masters answer")
    wait_for(lambda: cluster.leader() is not None, 30, "a leader")
    with RunWatcher(cluster.root) as watcher, LeaderWatch(cluster) as leaders:
        leader = cluster.leader()
        assert leader is not None
        standby = 1 - leader

        def knows_the_leader() -> bool:  # a standby learns the leader from the store a moment later
            h = cluster.health(standby)
            return bool(
                h and h["role"] == "standby" and h["leader"] and h["leader"]["url"] == cluster.url(leader)
            )

        wait_for(knows_the_leader, 30, "the standby naming the leader")
        # the standby stores nothing and names the leader
        import json
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            cluster.url(standby) + "/api/v1/jobs",
            data=b'{"gpus": "1"}',
            method="POST",
            headers={"Authorization": f"Bearer {cluster.admin_token}", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 503
        assert json.loads(refused.value.read())["leader"] == cluster.url(leader)
        # the CLI given the standby first follows the leader
        ids = [cluster.submit(iters=30, name=f"j{k}", first=standby) for k in range(3)]
        assert cluster.rows("SELECT COUNT(*) AS n FROM jobs") == [{"n": 3}]
        check_outcome(cluster, watcher, leaders, ids, {})


def test_postgres_restarted_under_the_leader(cluster: PgCluster) -> None:
    cluster.start()
    with RunWatcher(cluster.root) as watcher, LeaderWatch(cluster) as leaders:
        ids, before = submit_and_wait_running(cluster, 4, iters=200)
        old = cluster.leader()
        assert old is not None
        cluster.pg.restart()
        wait_for(lambda: cluster.exit_code(old) is not None, 30, "the leader to step down")
        assert cluster.exit_code(old) == STEPPED_DOWN
        cluster.procs.pop(old)
        cluster.start_master(old)  # as its supervisor would: it comes back as a standby
        wait_for(lambda: cluster.leader() is not None, 40, "a leader once PostgreSQL is back")
        cluster.wait_leader(40)
        check_outcome(cluster, watcher, leaders, ids, before)


def test_leader_cut_from_postgres_steps_down_before_the_lease_can_pass(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    """Master 0 reaches PostgreSQL through a TCP proxy, the nodes directly. The proxy goes silent (bytes
    dropped, no connection closed): master 0 must stop within lease_s of its last confirmation. The
    proxy then closes its connections at the earliest moment the server itself could drop the silent
    session (its TCP keepalive: lease_s + 3 s after the last bytes it got, which came at most
    lease_check_s before the cut), and only then can master 1 take over."""
    database = pg_server.new_database()
    proxy = TcpProxy(pg_server.port).start()
    cluster = PgCluster(
        tmp_path,
        pg_server,
        [Node("n1", "v100", 1), Node("n2", "v100", 1)],
        store_url=pg_server.url(database),
        master_store={0: pg_server.url(database, tcp=True, port=proxy.port)},
    )
    try:
        cluster.start_master(0)
        wait_for(lambda: cluster.leader() == 0, 30, "master 0 to lead")
        cluster.start_master(1)
        for n in cluster.nodes:
            cluster.start_agent(n.id)
        with RunWatcher(cluster.root) as watcher, LeaderWatch(cluster) as leaders:
            ids, before = submit_and_wait_running(cluster, 4, iters=200)
            epoch = cluster.health(0)["epoch"]  # type: ignore[index]
            cut = time.monotonic()
            proxy.freeze()
            server_drops = cut - cluster.lease_check_s + cluster.lease_s + 3
            wait_for(lambda: cluster.exit_code(0) is not None, cluster.lease_s + 5, "master 0 to step down")
            stepped = time.monotonic()
            assert cluster.exit_code(0) == STEPPED_DOWN and stepped < server_drops
            assert "was not confirmed for" in (cluster.root / "master0.log").read_text()
            leader = cluster.leader()
            if time.monotonic() < server_drops:  # the lock is still held by the silent session: nobody leads
                assert leader is None  # (asked later, under load, the server may have dropped it already)
            time.sleep(max(0.0, server_drops - time.monotonic()))
            proxy.stop()  # the server drops the silent session (and with it the lock)
            wall_stepped = time.time() - (time.monotonic() - stepped)
            cluster.procs.pop(0)
            new, _ = cluster.wait_leader(40, other_than=0)
            assert new == 1 and cluster.health(1)["epoch"] > epoch  # type: ignore[index]
            check_outcome(cluster, watcher, leaders, ids, before)
        assert old_epoch_acts_after(cluster, epoch, wall_stepped) == []
    finally:
        cluster.close()
        proxy.stop()
