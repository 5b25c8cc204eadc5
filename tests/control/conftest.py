"""Fixtures for the state machine tests: a harness checked at teardown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.control.harness import Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()
