"""The store writer (hopsmgr.master.writer) on SQLite and PostgreSQL: writes commit in the order they
were handed over, off the event loop's thread and connection; a write that fails is rolled back alone
and fails only its own future; the loop's connection reads only what committed; `settled` and `close`
wait for what was handed over. And the controller's side: node commands go out only once their
records are committed, in the order their events came."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from pathlib import Path

import pytest

from hopsmgr.config import ClusterConfig
from hopsmgr.control.commands import Command, JobNote, Persist, StopAttempt
from hopsmgr.core.model import Config, Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.controller import Controller
from hopsmgr.master.store import Store, StoreError
from hopsmgr.master.writer import InlineWriter, ThreadWriter
from tests.control.test_drivers import NoExecutor
from tests.master.conftest import Backend
from tests.master.test_store import job_row


def insert(store: Store, job_id: str, seq: int) -> None:
    store.insert_job(job_row(job_id, seq))


def note_thread(seen: list[str], store: Store) -> None:
    seen.append(threading.current_thread().name)


def test_writes_commit_in_order_off_the_loop_and_a_failing_one_is_rolled_back_alone(backend: Backend) -> None:
    store = backend.open()

    async def scenario() -> None:
        writer = ThreadWriter(store.sibling(), asyncio.get_running_loop())
        threads: list[str] = []
        try:
            first = writer.write([partial(insert, job_id="j-1", seq=1), partial(note_thread, threads)])
            # j-1 again: the primary key refuses it, and with it this write's j-2
            bad = writer.write([partial(insert, job_id="j-2", seq=2), partial(insert, job_id="j-1", seq=3)])
            last = writer.write([partial(Store.update_job, job_id="j-1", state="QUEUED")])
            order: list[str] = []
            for name, future in (("first", first), ("bad", bad), ("last", last)):
                future.add_done_callback(lambda _, n=name: order.append(n))
            assert writer.pending() == 3
            await first
            with pytest.raises(StoreError):
                await bad
            await last
            await asyncio.sleep(0)
            assert order == ["first", "bad", "last"]
            assert writer.pending() == 0
            assert threads == ["hopsmgr-store-writer"]
            row = store.job("j-1")  # the loop's own connection sees what committed
            assert row is not None and row["state"] == "QUEUED"
            assert store.job("j-2") is None
        finally:
            writer.close()

    asyncio.run(scenario())
    store.close()


def test_settled_and_close_wait_for_every_write_handed_over(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")

    async def scenario() -> None:
        writer = ThreadWriter(store.sibling(), asyncio.get_running_loop())
        for i in range(1, 201):
            writer.write([partial(insert, job_id=f"j-{i}", seq=i)])
        await writer.settled()
        assert writer.pending() == 0 and len(store.jobs()) == 200
        assert writer.batches < 200  # waiting writes share a transaction
        later = writer.write([partial(insert, job_id="j-x", seq=1000)])
        writer.close()  # commits what waits first
        assert store.job("j-x") is not None
        await later
        refused = writer.write([partial(insert, job_id="j-y", seq=1001)])
        with pytest.raises(StoreError, match="closed"):
            await refused

    asyncio.run(scenario())
    store.close()


def test_the_inline_writer_writes_at_once_and_raises_to_its_caller(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    writer = InlineWriter(store)
    assert writer.write([partial(insert, job_id="j-1", seq=1)]) is None
    assert store.job("j-1") is not None
    with pytest.raises(StoreError):
        writer.write([partial(insert, job_id="j-2", seq=2), partial(insert, job_id="j-1", seq=3)])
    assert store.job("j-2") is None  # the whole write rolled back
    store.close()


def test_node_commands_go_out_once_their_records_are_committed_in_the_order_their_events_came(
    tmp_path: Path,
) -> None:
    config = ClusterConfig("writer", (Server("n1", "v100", 4),), SchedulerSettings(), ())
    store = Store(tmp_path / "state.db")
    ctl = Controller(config, store, NoExecutor(), clock=lambda: 10.0)  # type: ignore[arg-type]
    ctl.open(str(tmp_path / "checkpoints"))
    stop = partial(StopAttempt, job_id="j-1", placement=Config.of({"n1": 1}), reason="cancelled")
    note = Persist("s1", (JobNote("j-1", 1.0, "moving", "to n1"),))

    async def scenario() -> list[tuple[str, int]]:
        ctl.start_writer()
        sent: list[tuple[str, int]] = []
        ctl.on_command = lambda c: sent.append((c.attempt_id, len(store.events("j-1"))))  # type: ignore[attr-defined]
        gate = threading.Event()
        ctl.store_ops([lambda _: gate.wait(10)])  # the writer is busy with an earlier write
        first: list[Command] = [note, stop("s1", attempt_id="a-1")]
        ctl.dispatch(first, after=ctl.persist(first))
        second: list[Command] = [stop("s2", attempt_id="a-2")]  # records nothing: waits all the same
        ctl.dispatch(second, after=ctl.persist(second))
        await asyncio.sleep(0.05)
        assert sent == []
        gate.set()
        await ctl.settled()
        await asyncio.sleep(0)
        ctl.close_writer()
        return sent

    sent = asyncio.run(scenario())
    assert sent == [("a-1", 1), ("a-2", 1)]  # the note was in the store when a-1's stop went out
    store.close()
