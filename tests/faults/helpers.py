"""Helpers for the fault-injection tests: a watcher of node work dirs, a TCP proxy, state-DB reads.

`RunWatcher` samples every node's attempt records (hopsmgr.node.ops.status) in a thread for the whole
test and records each sample in which one job had two run attempts running at once. `TcpProxy` sits
between an agent and the master; `stop()` partitions them (connections cut, port closed), `start()`
heals. `state_db` opens the master's SQLite file read-only.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hopsmgr.node import ops
from tests.integration.cluster import LocalCluster

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


# -- what runs on the nodes -----------------------------------------------------------------------------


@dataclass
class Overlap:
    time: float
    job: str
    attempts: tuple[str, ...]


@dataclass
class RunWatcher:
    """Samples the node work dirs under `root/nodes` every `interval_s` (run attempts only)."""

    root: Path
    interval_s: float = 0.1
    samples: int = 0
    overlaps: list[Overlap] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # run attempt id -> job id, every one ever seen
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RunWatcher:
        self._thread = threading.Thread(target=self._run, name="run-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # a half-written record: note it, keep watching
                self.errors.append(repr(exc))
            self._stop.wait(self.interval_s)

    def running(self) -> dict[str, set[str]]:
        """Job id -> ids of its run attempts that some node reports running now."""
        out: dict[str, set[str]] = {}
        for node_dir in sorted((self.root / "nodes").glob("*")):
            for rec in ops.status(node_dir)["attempts"]:
                if rec["job"] is None or rec["mode"] != "run":
                    continue
                self.seen[rec["attempt"]] = rec["job"]
                if rec["state"] == "running":
                    out.setdefault(rec["job"], set()).add(rec["attempt"])
        return out

    def sample(self) -> None:
        now = time.time()
        for job, attempts in self.running().items():
            if len(attempts) > 1:
                self.overlaps.append(Overlap(now, job, tuple(sorted(attempts))))
        self.samples += 1

    def overlaps_after(self, t: float) -> list[Overlap]:
        return [o for o in self.overlaps if o.time >= t]


# -- the master's state file -----------------------------------------------------------------------------


@contextlib.contextmanager
def state_db(cluster: LocalCluster) -> Iterator[sqlite3.Connection]:
    """The state file, read-only (the master may be running)."""
    db = sqlite3.connect(f"file:{cluster.state_dir / 'state.db'}?mode=ro", uri=True, timeout=10)
    db.row_factory = sqlite3.Row
    try:
        yield db
    finally:
        db.close()


def db_rows(cluster: LocalCluster, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with state_db(cluster) as db:
        return [dict(r) for r in db.execute(sql, params)]


def check_attempt_ids(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Attempt ids in the DB are unique, and every attempt directory on a node belongs to the DB's job of
    that id (an id handed out twice would show as a directory of another job). Returns the rows."""
    rows = db_rows(cluster, "SELECT id, seq, job_id, epoch, profiling, end_reason, exit_code FROM attempts")
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"attempt ids repeat: {ids}"
    seqs = [r["seq"] for r in rows]
    assert len(seqs) == len(set(seqs)), f"attempt seqs repeat: {seqs}"
    by_id = {r["id"]: r for r in rows}
    for node_dir in (cluster.root / "nodes").glob("*"):
        for rec in ops.status(node_dir)["attempts"]:
            row = by_id.get(rec["attempt"])
            assert row is not None, f"{node_dir.name} ran {rec['attempt']}, which the state DB never stored"
            assert row["job_id"] == rec["job"], f"{rec['attempt']}: DB job {row['job_id']}, node {rec['job']}"
    return rows


# -- jobs -------------------------------------------------------------------------------------------------


def kinds(job: dict[str, Any]) -> list[str]:
    return [h["kind"] for h in job["history"]]


def runs(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in job["attempts"] if not a["profiling"]]


def jobs_by_id(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    return {j["id"]: j for j in cluster.api("GET", "/api/v1/jobs?limit=100000")["jobs"]}


def all_completed(cluster: LocalCluster, ids: list[str]) -> bool:
    """True once every job completed; fails at once if one ended otherwise or is missing."""
    jobs = jobs_by_id(cluster)
    missing = [j for j in ids if j not in jobs]
    assert not missing, f"jobs lost: {missing}"
    bad = {j: jobs[j]["state"] for j in ids if jobs[j]["state"] in ("FAILED", "CANCELLED")}
    assert not bad, f"jobs ended badly: {bad}: {[cluster.job(j)['history'] for j in bad]}"
    return all(jobs[j]["state"] == "COMPLETED" for j in ids)


# -- a TCP proxy between an agent and the master -----------------------------------------------------------


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`, one pair of threads per connection.

    `stop()` closes the listening socket and every open connection (a partition: the agent's requests
    are refused); `start()` listens on the same port again (healed). `freeze()` is a silent partition:
    connections stay open and their bytes are dropped, so neither end sees an error (until `stop()`).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.frozen = threading.Event()

    def freeze(self) -> None:
        self.frozen.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.frozen.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            # frozen, a closed end is not passed on either: in a silent partition the other side never
            # sees the FIN (a leader's exit would otherwise free its session's lock at once); stop()
            # closes both
            if not self.frozen.is_set():
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
