"""The leader lease on a real PostgreSQL: one holder at a time, a holder whose session ends or goes
silent is told at once or within lease_s, and the lock passes only after its session is gone."""

from __future__ import annotations

import asyncio
import threading
import time

from hopsmgr.master.leader import LeaderInfo, Lease, read_leader, write_leader
from hopsmgr.master.stores import open_store
from tests.faults.helpers import TcpProxy
from tests.helpers.postgres import PostgresServer


async def take(lease: Lease, timeout: float) -> bool:
    try:
        await asyncio.wait_for(lease.acquire(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


def test_one_holder_and_the_lock_passes_when_its_session_is_terminated(pg_server: PostgresServer) -> None:
    url = pg_server.url(pg_server.new_database())
    first, second = Lease(url, 3.0, 0.2), Lease(url, 3.0, 0.2)
    try:
        assert asyncio.run(take(first, 10))
        assert not asyncio.run(take(second, 1.0))  # held: the second keeps trying
        lost: list[str] = []
        told = threading.Event()
        first.watch(lambda reason: (lost.append(reason), told.set()))
        time.sleep(0.5)
        assert not told.is_set()  # confirmed while it holds
        assert pg_server.terminate("hopsmgr-lease") == 2  # both sessions (the second's is idle)
        assert told.wait(2.0) and "lease connection failed" in lost[0]
        assert asyncio.run(take(second, 10))
    finally:
        first.close()
        second.close()


def test_a_silent_holder_is_told_within_lease_s(pg_server: PostgresServer) -> None:
    database = pg_server.new_database()
    proxy = TcpProxy(pg_server.port).start()
    lease = Lease(pg_server.url(database, tcp=True, port=proxy.port), 2.0, 0.25)
    try:
        assert asyncio.run(take(lease, 10))
        told = threading.Event()
        lost: list[str] = []
        lease.watch(lambda reason: (lost.append(reason), told.set()))
        time.sleep(0.6)
        cut = time.monotonic()
        proxy.freeze()  # no error on either side: the answers just stop coming
        assert told.wait(4.0)
        # lease_s after the last confirmation sent (before the cut), noticed within one check_s
        assert time.monotonic() - cut <= 2.0 + 0.25 + 0.5 and "not confirmed for" in lost[0]
    finally:
        lease.close()
        proxy.stop()


def test_who_leads_is_read_back_by_others(pg_server: PostgresServer) -> None:
    url = pg_server.url(pg_server.new_database())
    writer, reader = open_store(url), open_store(url)
    try:
        assert read_leader(reader) is None
        write_leader(writer, LeaderInfo("http://head01:8470", 1_800_000_000.5, 7))
        assert read_leader(reader) == LeaderInfo("http://head01:8470", 1_800_000_000.5, 7)
    finally:
        writer.close()
        reader.close()
