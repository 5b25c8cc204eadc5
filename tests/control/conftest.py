"""Fixtures for the state machine tests: a harness checked at teardown."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.control.harness import Harness
from tests.helpers.inprocess import InProcessCluster

DEADLINE_S = 120


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.fixture
def in_process_cluster(tmp_path: Path) -> Iterator[Callable[..., InProcessCluster]]:
    """Start with `in_process_cluster(config, speeds)`; the invariants are checked at teardown, and the
    test has DEADLINE_S seconds in all (SIGALRM) so that a stuck one fails instead of hanging."""
    started: list[InProcessCluster] = []

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test ran past its deadline of {DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)

    def make(config: dict[str, Any], speeds: dict[str, float] | None = None) -> InProcessCluster:
        cluster = InProcessCluster(tmp_path, config)
        started.append(cluster)
        return cluster.start(speeds)

    try:
        yield make
        for cluster in started:
            cluster.check()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for cluster in started:
            cluster.close()
