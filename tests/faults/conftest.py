"""Fixtures for the fault-injection tests: a small local cluster whose processes are always cleaned up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, Node

# cap_gpus = 1: one job of the tenant runs at a time, the others wait QUEUED (after their profiling)
CAPPED = """
[[tenants]]
name = "capped"
guaranteed_gpus = 0
cap_gpus = 1
"""

# an owner whose guarantee is the whole cluster, and a tenant that borrows it meanwhile
OWNER_GUEST = """
[[tenants]]
name = "owner"
guaranteed_gpus = 2
[[tenants]]
name = "guest"
guaranteed_gpus = 0
"""

FAST_PROFILE = "profiling_iterations = 10"

MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """`make_cluster(tenants=..., gpus=1, **fields)`: two emulated v100 nodes (n1, n2), not started."""
    made: list[LocalCluster] = []

    def make(*, tenants: str = OWNER_GUEST, gpus: int = 1, **fields: object) -> LocalCluster:
        nodes = [Node("n1", "v100", gpus, 1.0), Node("n2", "v100", gpus, 1.0)]
        c = LocalCluster(tmp_path, nodes, tenants=tenants, scheduler=FAST_PROFILE, **fields)  # type: ignore[arg-type]
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
