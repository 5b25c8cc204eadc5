"""Fixtures for the agent tests: real probe sinks on 127.0.0.1, served by an event loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from hopsmgr_agent.probe import ProbeSink


@pytest.fixture
def probe_sinks() -> Iterator[list[ProbeSink]]:
    """Two probe sinks on 127.0.0.1 (ephemeral ports), closed afterwards."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="probe-sinks", daemon=True)
    thread.start()
    sinks = [ProbeSink("127.0.0.1", 0), ProbeSink("127.0.0.1", 0)]
    try:
        for sink in sinks:
            asyncio.run_coroutine_threadsafe(sink.start(), loop).result(10)
        yield sinks
    finally:
        for sink in sinks:
            asyncio.run_coroutine_threadsafe(sink.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
