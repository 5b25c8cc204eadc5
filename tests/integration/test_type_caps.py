"""Caps per GPU type on a real local cluster: a tenant allowed one GPU of the fast type runs its second
job on the slow one, and `hopsmgr quota` shows what it holds of its capped type."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, Node, wait_for

TENANTS = """
[[tenants]]
name = "vision"
cap_gpus_by_type = { v100 = 1 }
"""


def two_types(root: Path, tenants: str) -> Iterator[LocalCluster]:
    """A local cluster of two nodes, 2 v100s and 2 k80s (half as fast), with these tenants."""
    c = LocalCluster(root, [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)], tenants=tenants)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from two_types(tmp_path, TENANTS)


def nodes_of(cluster: LocalCluster, job_id: str) -> set[str]:
    runs = [a for a in cluster.job(job_id)["attempts"] if not a["profiling"] and a["ended"] is None]
    return {node for a in runs for node in a["placement"]}


def test_a_tenant_capped_on_a_type_runs_the_rest_of_its_work_elsewhere(capped: LocalCluster) -> None:
    jobs = [capped.submit(iters=3000, step=0.02, tenant="vision", name=f"j{i}") for i in range(2)]
    for j in jobs:
        capped.wait_state(j, "RUNNING", timeout=90)
    wait_for(lambda: set().union(*(nodes_of(capped, j) for j in jobs)) == {"n1", "n2"}, 60, "one job a type")
    (vision,) = capped.api("GET", "/api/v1/tenants")["tenants"]
    assert vision["cap_gpus_by_type"] == {"v100": 1}
    assert vision["used_gpus_by_type"] == {"v100": 1, "k80": 1}
    out = capped.cli("quota").stdout
    assert "caps per GPU type (used / cap):" in out and "vision: v100 1 / 1" in out
    for j in jobs:
        capped.cli("cancel", j)


OWNED = """
[[tenants]]
name = "vision"
guaranteed_gpus_by_type = { v100 = 2 }
[[tenants]]
name = "nlp"
"""


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from two_types(tmp_path, OWNED)


def test_an_owner_gets_its_guaranteed_gpus_of_a_type_back_from_borrowers(owned: LocalCluster) -> None:
    guests = [owned.submit(iters=3000, step=0.02, tenant="nlp", name=f"guest{i}") for i in range(4)]
    for g in guests:
        owned.wait_state(g, "RUNNING", timeout=90)
    wait_for(lambda: all(nodes_of(owned, g) for g in guests), 60, "guests on all four GPUs")
    owner = owned.submit(gpus="2", iters=60, step=0.02, tenant="vision", name="owner")
    done = owned.wait_state(owner, "COMPLETED", timeout=120)
    ran = [a for a in done["attempts"] if not a["profiling"] and a["exit_code"] == 0]
    assert ran and set(ran[-1]["placement"]) == {"n1"}  # on the v100s it is guaranteed
    preempted = [g for g in guests if any(h["kind"] == "preempted" for h in owned.job(g)["history"])]
    assert len(preempted) >= 2  # the borrowers on the v100s were checkpointed, and run on
    (vision,) = [t for t in owned.api("GET", "/api/v1/tenants")["tenants"] if t["name"] == "vision"]
    assert vision["guaranteed_gpus_by_type"] == {"v100": 2}
    assert "guarantees per GPU type (used / guarantee):" in owned.cli("quota").stdout
    for g in guests:
        owned.cli("cancel", g, check=False)
