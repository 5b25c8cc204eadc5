"""Work off the master's interpreter: a function called in a long-lived worker process of its own.

The master's event loop serves heartbeats and the API; CPU-heavy work beside it (the queue's
forecasts, what-if forecasts) in a thread of the same process would share the interpreter lock with
the loop and slow every reply (measured: a forecast thread held it half the time at 10,000 jobs). A
`WorkerProcess` runs such work in a process started with `spawn` (it shares nothing with the loop) at a
lower CPU priority (`nice`), so the loop wins the cores when both want them. Arguments are pickled on
the loop in one step (so the worker gets a consistent copy of the state they describe, without a deep
copy first), the bytes written in a thread; the answer is awaited without blocking the loop. A call
that does not answer within its timeout has its worker killed (the next call starts a fresh one) and
raises `WorkerTimeout`; an error inside the function comes back as `WorkerError` with its repr.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import time
from collections.abc import Callable
from typing import Any


class WorkerTimeout(Exception):
    """The worker did not answer within the call's timeout; it was killed."""


class WorkerError(Exception):
    """The function raised inside the worker (the message is its repr), or the worker died."""


def _serve(conn: multiprocessing.connection.Connection, nice: int) -> None:
    """The worker's loop: (function, args) in, ("ok", value) or ("error", repr) out, until the pipe closes."""
    if nice:
        with contextlib.suppress(OSError):  # not allowed here: run at the master's priority
            os.nice(nice)
    while True:
        try:
            fn, args = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", fn(*args))
        except Exception as exc:
            answer = ("error", repr(exc))
        conn.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))


class WorkerProcess:
    """One worker process, started on the first call; calls are answered one at a time, in order."""

    def __init__(self, name: str, nice: int = 10) -> None:
        self.name = name
        self.nice = nice
        self.context = multiprocessing.get_context("spawn")
        self.process: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.lock = asyncio.Lock()
        self.replaced = 0
        self.pickle_ms: list[float] = []  # time the loop spent pickling each call's arguments
        self.waiting: asyncio.Future[None] | None = None  # the answer a call waits for
        self.closed = False

    def _start(self) -> None:
        parent, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_serve, args=(child, self.nice), name=self.name, daemon=True
        )
        self.process.start()
        child.close()
        self.conn = parent

    def stop(self) -> None:
        """Kill the worker and close the pipe (only when no thread is reading or writing it: see
        `_stop_after`). A call waiting for an answer is told at once."""
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_exception(WorkerError(f"{self.name} was stopped"))
        if self.process is not None:
            self.process.kill()
            self.process.join(timeout=5)
            self.process = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        """Stop for good (the master stops): later calls raise WorkerError, no new worker starts."""
        self.closed = True
        self.stop()

    async def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """`fn(*args)` in the worker (fn importable by name); its value, within `timeout_s`."""
        t0 = time.perf_counter()
        payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)  # before any wait: a copy now
        self.pickle_ms.append((time.perf_counter() - t0) * 1000)
        del self.pickle_ms[:-100]
        async with self.lock:
            if self.closed:
                raise WorkerError(f"{self.name} is closed")
            return await self._call(payload, timeout_s)

    async def _stop_after(self, io: asyncio.Future[Any] | None) -> None:
        """Stop with a thread maybe still in the pipe: kill the worker first (the thread's read or write
        then ends), wait for the thread, and only then close the pipe, so that the thread never
        touches a file number the system has given to something else meanwhile."""
        self.waiting = None  # the caller is told by what it raises
        if self.process is not None:
            self.process.kill()
        if io is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(io), timeout=10)
        self.stop()

    async def _call(self, payload: bytes, timeout_s: float) -> Any:
        if self.conn is None or self.process is None or not self.process.is_alive():
            self.stop()
            self._start()
        assert self.conn is not None
        conn = self.conn
        fd = conn.fileno()
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        answered: asyncio.Future[None] = loop.create_future()
        self.waiting = answered
        io: asyncio.Future[Any] | None = None

        def readable() -> None:
            if not answered.done():
                answered.set_result(None)

        try:
            io = loop.run_in_executor(None, conn.send_bytes, payload)
            await io
            io = None
            loop.add_reader(fd, readable)
            try:
                await asyncio.wait_for(answered, timeout=max(0.0, deadline - time.monotonic()))
            finally:
                loop.remove_reader(fd)
            io = loop.run_in_executor(None, conn.recv_bytes)
            data = await io
            io = None
        except asyncio.TimeoutError:
            self.replaced += 1
            await self._stop_after(io)
            raise WorkerTimeout(
                f"{self.name} did not answer within {timeout_s:.0f} s: it was replaced"
            ) from None
        except (EOFError, OSError) as exc:
            await self._stop_after(io)
            raise WorkerError(f"{self.name} died: {exc!r}") from exc
        except asyncio.CancelledError:
            # an answer may still come: this worker's pipe cannot be reused in order
            await self._stop_after(io)
            raise
        finally:
            self.waiting = None
        status, value = pickle.loads(data)
        if status != "ok":
            raise WorkerError(value)
        return value
