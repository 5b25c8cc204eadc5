"""The master's store writer: records written in order, off the event loop, one commit per batch.

The controller turns the state machine's records into `Op`s on the event loop (each a call on the
store with values fixed at that moment, never a live object) and hands them over as one write. Its
node commands and replies wait until that write is committed (durable before acting); the loop does
not wait.

Two writers with one interface, as a transport is swapped in httpx:

- `ThreadWriter` (the master): a thread of its own with a connection of its own (`Store.sibling()`).
  Writes commit in the order they were handed over (one queue, one thread). Whatever waits when the
  thread takes the next batch goes into one transaction (a group commit: one fsync for a plan's records
  and the heartbeats that came meanwhile), each write in a savepoint of its own, so one that fails is
  rolled back alone and fails only its own future. SQLite and psycopg release the interpreter lock
  while they work, so statements and fsyncs no longer hold up heartbeats and API calls. The loop's
  own connection still serves reads; in WAL mode (SQLite) or MVCC (PostgreSQL) a read sees the last
  commit, so an API call that changed state replies once its write is durable.
- `InlineWriter` (tools, and a controller driven without an event loop): the same writes at once on
  the caller's thread and connection, errors raised to the caller, as before there was a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from hopsmgr.master.store import Store, StoreError

log = structlog.get_logger("hopsmgr.master")

Op = Callable[[Store], object]  # one call on the store, with its values already fixed
MAX_BATCH = 5_000  # writes per transaction at most (a plan's records are one write)


class Writer:
    """What the controller needs of a writer."""

    def write(self, ops: Sequence[Op]) -> asyncio.Future[None] | None:
        """Hand over `ops`: None when they are already committed (raises StoreError if they could not
        be), else a future done once they are (StoreError as its exception if not)."""
        raise NotImplementedError

    def pending(self) -> int:
        """Writes handed over and not yet committed."""
        return 0

    async def settled(self) -> None:
        """Wait until everything handed over so far is committed (or has failed)."""

    def close(self) -> None:
        """Commit what waits, then stop."""


class InlineWriter(Writer):
    """Each write in a transaction of its own, at once, on the caller's connection."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write(self, ops: Sequence[Op]) -> None:
        if ops:
            try:
                with self.store.transaction():
                    for op in ops:
                        op(self.store)
            except StoreError:
                raise
            except Exception as exc:  # a refused statement (a constraint): as the thread writer says it
                raise StoreError(f"the state could not be written: {exc!r}") from exc
        return None


@dataclass(slots=True)
class _Write:
    ops: Sequence[Op]
    future: asyncio.Future[None]
    error: BaseException | None = field(default=None)


class ThreadWriter(Writer):
    """Writes on a thread of its own (see the module); `write` is called on the event loop's thread."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store  # this writer's own connection: only its thread uses it
        self.loop = loop
        self._queue: deque[_Write] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._waiting = 0  # handed over, not yet resolved on the loop
        self.batches = 0
        self.thread = threading.Thread(target=self._run, name="hopsmgr-store-writer", daemon=True)
        self.thread.start()

    def write(self, ops: Sequence[Op]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = self.loop.create_future()
        if self._closing:
            future.set_exception(StoreError("the store writer is closed"))
            return future
        self._waiting += 1
        with self._ready:
            self._queue.append(_Write(tuple(ops), future))
            self._ready.notify()
        return future

    def pending(self) -> int:
        return self._waiting

    async def settled(self) -> None:
        if self._waiting:
            with contextlib.suppress(StoreError):
                await self.write(())

    def close(self) -> None:
        """Stop taking writes, commit what waits, join the thread and close its connection."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self.thread.join()
        self.store.close()

    # -- the writer's thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return  # closing, and nothing waits
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
            self._commit(batch)
            self.batches += 1
            try:
                self.loop.call_soon_threadsafe(self._resolve, batch)
            except RuntimeError:  # the loop closed under us (a master stopped without close())
                return

    def _commit(self, batch: list[_Write]) -> None:
        store = self.store
        try:
            with store.transaction():
                for write in batch:
                    if not write.ops:
                        continue
                    try:
                        with store.savepoint():
                            for op in write.ops:
                                op(store)
                    except Exception as exc:  # this write alone is rolled back
                        write.error = exc
                        log.critical("state_not_written", error=repr(exc))
        except Exception as exc:  # the transaction itself failed (disk full, connection lost, deposed)
            log.critical("state_not_written", error=repr(exc), writes=len(batch))
            for write in batch:
                write.error = write.error or exc

    def _resolve(self, batch: list[_Write]) -> None:
        """On the loop, in the order written: each future done (done callbacks run in this order)."""
        for write in batch:
            self._waiting -= 1
            if write.future.done():
                continue
            if write.error is None:
                write.future.set_result(None)
            else:
                error = write.error
                if not isinstance(error, StoreError):
                    error = StoreError(f"the state could not be written: {error!r}")
                write.future.set_exception(error)
