"""Fixtures for the node tests: a node work directory whose leftover processes are killed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .util import kill_leftovers


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    workdir = tmp_path / "work"
    yield workdir
    kill_leftovers(workdir)
