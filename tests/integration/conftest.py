"""Fixtures shared by the integration tests: a local two-node cluster with two tenants, and a real OpenSSH
server on 127.0.0.1 (tests/integration/sshd.py) for the SSH executor's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, Node
from tests.integration.sshd import Sshd, require_sshd

TENANTS = """
[[tenants]]
name = "vision"
guaranteed_gpus = 2
[[tenants]]
name = "nlp"
guaranteed_gpus = 0
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)], tenants=TENANTS)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    require_sshd()
    server = Sshd.start(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()
