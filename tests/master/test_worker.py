"""The worker process the master offloads forecasts to (hopsmgr.master.worker): answers, errors,
a worker that does not answer in time is replaced, and it runs at a lower CPU priority."""

from __future__ import annotations

import asyncio
import math
import os
import time

import pytest

from hopsmgr.master.worker import WorkerError, WorkerProcess, WorkerTimeout


def test_a_call_is_answered_an_error_comes_back_and_a_stalled_worker_is_replaced() -> None:
    async def scenario() -> None:
        worker = WorkerProcess("test-worker", nice=5)
        try:
            assert await worker.call(math.sqrt, 16.0, timeout_s=30) == 4.0
            first = worker.process.pid
            with pytest.raises(WorkerError, match="math domain error"):
                await worker.call(math.sqrt, -1.0, timeout_s=30)
            assert worker.process.pid == first  # an error in the function keeps the worker
            niced = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
            assert await worker.call(os.getpriority, os.PRIO_PROCESS, 0, timeout_s=30) == niced
            t0 = time.monotonic()
            with pytest.raises(WorkerTimeout, match="within 1 s"):
                await worker.call(time.sleep, 30, timeout_s=1)
            assert time.monotonic() - t0 < 10
            assert worker.process is None and worker.replaced == 1
            assert await worker.call(math.sqrt, 9.0, timeout_s=30) == 3.0  # a fresh worker
            assert worker.process.pid != first
        finally:
            worker.stop()

    asyncio.run(scenario())


def test_the_arguments_are_copied_when_the_call_is_made() -> None:
    async def scenario() -> None:
        worker = WorkerProcess("test-worker")
        state = [1, 2, 3]
        try:
            call = asyncio.ensure_future(worker.call(sum, state, timeout_s=30))
            await asyncio.sleep(0)  # the call has pickled its arguments
            state.append(100)
            assert await call == 6
        finally:
            worker.stop()

    asyncio.run(scenario())


def test_a_worker_closed_while_a_call_waits_answers_it_at_once_and_takes_no_more() -> None:
    async def scenario() -> None:
        worker = WorkerProcess("test-worker")
        call = asyncio.ensure_future(worker.call(time.sleep, 30, timeout_s=60))
        try:
            while worker.waiting is None:  # the call has sent its request and waits for the answer
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            worker.close()
            with pytest.raises(WorkerError, match="stopped"):
                await call
            assert time.monotonic() - t0 < 5 and worker.process is None
            with pytest.raises(WorkerError, match="closed"):
                await worker.call(math.sqrt, 4.0, timeout_s=30)
            assert worker.process is None  # no new worker was started
        finally:
            worker.stop()

    asyncio.run(scenario())


def test_a_cancelled_call_stops_its_worker_and_the_next_call_gets_a_fresh_one() -> None:
    async def scenario() -> None:
        worker = WorkerProcess("test-worker")
        try:
            call = asyncio.ensure_future(worker.call(time.sleep, 30, timeout_s=60))
            while worker.waiting is None:
                await asyncio.sleep(0.01)
            first = worker.process.pid
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert worker.process is None
            assert await worker.call(math.sqrt, 25.0, timeout_s=30) == 5.0
            assert worker.process.pid != first
        finally:
            worker.stop()

    asyncio.run(scenario())
