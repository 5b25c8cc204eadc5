"""A job's whole life through the CLI and HTTP on a real local cluster."""

from __future__ import annotations

from tests.integration.cluster import LocalCluster


def test_submit_profile_run_complete(cluster: LocalCluster) -> None:
    job_id = cluster.submit(gpus="1,2", iters=60, tenant="vision")
    assert job_id.startswith("j-")
    job = cluster.wait_state(job_id, "COMPLETED")
    kinds = [h["kind"] for h in job["history"]]
    assert kinds[:2] == ["submitted", "profiling"]
    assert kinds.count("profiled") == 2  # one profiling run per GPU type
    assert "started" in kinds and kinds[-1] == "completed"
    runs = [a for a in job["attempts"] if not a["profiling"]]
    assert len(runs) == 1 and runs[0]["exit_code"] == 0
    logs = cluster.api("GET", f"/api/v1/jobs/{job_id}/logs")
    assert "final checksum" in logs["log"]
    assert cluster.cli("show", job_id).stdout.count("completed") >= 1
