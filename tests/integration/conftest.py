from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, Node

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
