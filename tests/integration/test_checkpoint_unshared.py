"""Nodes without a shared filesystem: a preempted job resumes on another node from a moved checkpoint."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import EXAMPLE, PYTHON, LocalCluster, Node, wait_for

TENANTS = """
[[tenants]]
name = "owner"
guaranteed_gpus = 1
[[tenants]]
name = "guest"
"""


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path,
        [Node("n1", "v100", 1), Node("n2", "v100", 1)],
        tenants=TENANTS,
        master_extra="checkpoint_shared = false",
    )
    try:
        yield c.start()
    finally:
        c.close()


def test_checkpoint_moves_to_the_next_node_and_the_run_ends_as_uninterrupted(pair: LocalCluster) -> None:
    iters = 600
    pair.api("POST", "/api/v1/nodes/n2/drain")
    guest = pair.submit(iters=iters, step=0.02, tenant="guest", name="guest")
    first = pair.wait_state(guest, "RUNNING")
    assert [a for a in first["attempts"] if not a["profiling"]][-1]["placement"] == {"n1": 1}
    wait_for(lambda: pair.job(guest)["progress"] > 0.1, 60, "guest progress")
    owner = pair.submit(iters=2000, step=0.02, tenant="owner", name="owner")
    wait_for(lambda: "requeued" in [h["kind"] for h in pair.job(guest)["history"]], 60, "guest checkpointed")
    pair.api("POST", "/api/v1/nodes/n1/drain")
    pair.api("POST", "/api/v1/nodes/n2/undrain")
    done = pair.wait_state(guest, "COMPLETED", timeout=120)
    pair.request("POST", f"/api/v1/jobs/{owner}/cancel")  # it may have finished already
    runs = [a for a in done["attempts"] if not a["profiling"]]
    assert runs[0]["placement"] == {"n1": 1} and runs[-1]["placement"] == {"n2": 1}
    moved = [h for h in done["history"] if h["kind"] == "checkpoint_moved"]
    assert moved and "n1 -> n2" in moved[0]["message"]
    # nothing shared: the checkpoint the run resumed from lives in n2's own work directory
    assert list((pair.root / "nodes" / "n2" / "checkpoints" / guest).glob("ckpt-*.pkl"))
    log = pair.api("GET", f"/api/v1/jobs/{guest}/logs?tail=65536")["log"]
    assert "resumed at iteration" in log
    got = re.search(r"final checksum (\d+)", log)
    alone = subprocess.run(
        [PYTHON, EXAMPLE, "--iters", str(iters), "--batch-size", "8", "--step-seconds", "0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    want = re.search(r"final checksum (\d+)", alone.stdout)
    assert got and want and got.group(1) == want.group(1)
