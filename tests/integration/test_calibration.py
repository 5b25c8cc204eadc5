"""Servers of one GPU type that differ: calibration reaches `hopsmgr nodes` and the estimator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, Node, wait_for


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, [Node("fast", "v100", 1, 1.0), Node("slow", "v100", 1, 0.5)])
    try:
        yield c.start()
    finally:
        c.close()


def test_emulated_speed_factors_show_in_nodes_and_change_estimates(twins: LocalCluster) -> None:
    table = twins.cli("nodes").stdout
    assert "1.00 (emulated)" in table and "0.50 (emulated)" in table
    nodes = {n["id"]: n for n in twins.api("GET", "/api/v1/nodes")["nodes"]}
    assert nodes["fast"]["calibration"]["compute_factor"] == 1.0
    assert nodes["slow"]["calibration"]["compute_factor"] == 0.5
    assert nodes["slow"]["emulated"] and nodes["slow"]["calibration"]["source"] == "emulated"
    job_id = twins.submit(iters=4000, step=0.02, name="long")
    wait_for(
        lambda: twins.api("GET", f"/api/v1/jobs/{job_id}/explain")["profiled_types"] == ["v100"],
        60,
        "profiled",
    )
    explained = twins.api("GET", f"/api/v1/jobs/{job_id}/explain")
    estimates = explained["estimates"]
    # one profile of the type, two servers: the estimator scales it by each server's calibration
    assert set(estimates) == {"fast", "slow"}
    assert estimates["fast"] > 1.3 * estimates["slow"], estimates
    # per GPU count the node holds too (this job has one count: the same figures)
    assert explained["estimates_by_count"] == {n: {"1": rate} for n, rate in estimates.items()}
    # and on the placement it holds once it runs (what the dashboard shows beside a placement over
    # several servers, which has no per-node estimate)
    wait_for(lambda: twins.api("GET", f"/api/v1/jobs/{job_id}")["state"] == "RUNNING", 60, "running")
    explained = twins.api("GET", f"/api/v1/jobs/{job_id}/explain")
    (node,) = explained["placement"]
    assert explained["placement_estimate"] == pytest.approx(explained["estimates"][node], rel=1e-6)

    # the job detail's throughput (what the dashboard's job page shows): measured where it runs,
    # beside the estimate there now, the one explain gives (the two read between two observations)
    def measured_beside_its_estimate() -> bool:
        found = twins.api("GET", f"/api/v1/jobs/{job_id}")["throughput"]
        pe = twins.api("GET", f"/api/v1/jobs/{job_id}/explain")["placement_estimate"]
        return any(
            t["placement"] == {node: 1} and t["measured_last"] > 0 and t["estimate_now"] == pe for t in found
        )

    wait_for(measured_beside_its_estimate, 60, "a measurement beside the estimate now")
    twins.api("POST", f"/api/v1/jobs/{job_id}/cancel")
