"""The leader lease of masters that share one PostgreSQL database: who acts, and when it must stop.

The lease is a session advisory lock (`pg_try_advisory_lock(LEASE_KEY)`) held on a connection of its
own, never pooled (hopsmgr.master.pgstore.check_session refuses a transaction-mode pooler). A standby
tries to take it every `lease_check_s`. The leader confirms it every `lease_check_s` with a liveness query
that checks, on the server, that this very session still holds the lock; the lease counts from the moment
the last confirming query was *sent*. When a query fails (connection lost, backend terminated) or no
confirmation came for `lease_s`, the leader steps down at once (`on_lost`: the master exits without
writing anything). The confirming runs in a watchdog thread: a database call that hangs on the event
loop cannot keep the leader acting. The server keeps a dead session, and so the lock, for at least its TCP keepalive time
(`lease_s` + 3 s, set on this connection): a partitioned leader has stopped before the lock can pass.

Who leads is also written to the store (meta key `leader`: url, since, epoch) for standbys and status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import structlog

from hopsmgr.master.pgstore import check_session, connect, redact
from hopsmgr.master.store import Store, StoreError

log = structlog.get_logger("hopsmgr.master")

LEASE_KEY = 0x686F_7073_6D67_0002  # "hopsmg" 2: the leader lease's advisory lock
_CONFIRM = (
    "SELECT pg_backend_pid() = %s AND EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
    "AND pid = pg_backend_pid() AND granted AND ((classid::bigint << 32) | objid::bigint) = %s)"
)


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    url: str
    since: float
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "since": self.since, "epoch": self.epoch}


def read_leader(store: Store) -> LeaderInfo | None:
    """Who leads, as the leader wrote it (None when no leader ever did, or the store cannot be read)."""
    try:
        text = store.meta("leader", "")
    except StoreError:
        return None
    if not text:
        return None
    try:
        raw = json.loads(text)
        return LeaderInfo(str(raw["url"]), float(raw["since"]), int(raw["epoch"]))
    except (ValueError, KeyError, TypeError):
        return None


def write_leader(store: Store, info: LeaderInfo) -> None:
    with store.transaction():
        store.set_meta("leader", json.dumps(info.to_json(), sort_keys=True))


class Lease:
    """The advisory lock on its own connection: `acquire` (standby), then `hold` (leader)."""

    def __init__(
        self,
        url: str,
        lease_s: float,
        check_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.lease_s = lease_s
        self.check_s = check_s
        self.clock = clock
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="lease")
        self.conn: Any = None
        self.pid = 0
        self.confirmed_at = 0.0  # send time of the last confirming query (monotonic)
        self.attempts = 0
        self.last_error = ""
        self._stopped = threading.Event()

    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def _try(self) -> bool:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = connect(self.url, application="hopsmgr-lease", keepalive_s=self.lease_s)
            check_session(self.conn, self.url)  # a lock taken through a transaction pooler is no lease
            self.pid = int(self.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        sent = self.clock()
        got = bool(self.conn.execute("SELECT pg_try_advisory_lock(%s)", (LEASE_KEY,)).fetchone()[0])
        if got:
            self.confirmed_at = sent
        return got

    async def acquire(self, on_wait: Callable[[], None] | None = None) -> None:
        """Return once this master holds the lease (trying every check_s; the database may be down)."""
        while True:
            self.attempts += 1
            try:
                if await self._call(self._try):
                    log.info("leader_lease_taken", store=redact(self.url), backend_pid=self.pid)
                    return
                self.last_error = ""
            except Exception as exc:  # the database is down or refuses: keep trying
                self.last_error = str(exc)
                self._drop()
                if self.attempts % 10 == 1:
                    log.warning("leader_lease_unavailable", error=str(exc))
            if on_wait is not None:
                on_wait()
            await asyncio.sleep(self.check_s)

    def _confirm(self) -> bool:
        sent = self.clock()
        ok = bool(self.conn.execute(_CONFIRM, (self.pid, LEASE_KEY)).fetchone()[0])
        if ok:
            self.confirmed_at = max(self.confirmed_at, sent)
        return ok

    def watch(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Confirm the lease every check_s from a thread of its own, and call `on_lost(reason)` from it
        (once) the moment the lease is not certain. A thread, not a task: a database call that hangs (a
        network cut) may block the event loop, and the leader must still stop in time."""

        def run() -> None:
            pending: Future[bool] | None = None
            while not self._stopped.is_set():
                if pending is None:
                    pending = self.pool.submit(self._confirm)
                try:
                    ok: bool | None = pending.result(timeout=self.check_s)
                except FutureTimeout:
                    ok = None  # still waiting for the answer: the deadline decides
                except Exception as exc:
                    on_lost(f"the lease connection failed: {exc}".strip())
                    return
                else:
                    pending = None
                    if not ok:
                        on_lost("the lease's advisory lock is no longer held by this session")
                        return
                age = self.clock() - self.confirmed_at
                if age >= self.lease_s:
                    on_lost(f"the lease was not confirmed for {age:.1f} s (lease_s = {self.lease_s:g})")
                    return
                if ok:
                    self._stopped.wait(max(0.0, self.check_s - age))

        thread = threading.Thread(target=run, name="lease-watchdog", daemon=True)
        thread.start()
        return thread

    def remaining(self) -> float:
        return self.lease_s - (self.clock() - self.confirmed_at)

    def _drop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None

    def close(self) -> None:
        """Release the lock by closing its session (a clean stop hands over at once)."""
        self._stopped.set()
        self._drop()
        self.pool.shutdown(wait=False, cancel_futures=True)
