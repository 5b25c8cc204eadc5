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
    shown = cluster.cli("show", job_id).stdout
    assert shown.count("completed") >= 1
    # its measured throughput outlives its estimates: beside each, what the estimator expected there
    # from the profiles just before (no estimate now: the job ended)
    (measured,) = job["throughput"]
    assert measured["placement"] == runs[0]["placement"] and measured["measurements"] >= 1
    assert measured["expected_last"] > 0 and measured["estimate_now"] is None
    assert "throughput (samples/s):" in shown and "EXPECTED THEN" in shown


def test_a_new_job_is_profiled_on_every_gpu_type_in_one_plan(cluster: LocalCluster) -> None:
    job_id = cluster.submit(gpus="1", iters=20, tenant="vision")
    job = cluster.wait_state(job_id, "QUEUED", "LAUNCHING", "RUNNING", "COMPLETED")
    profiling = [a for a in job["attempts"] if a["profiling"]]
    assert sorted(n for a in profiling for n in a["placement"]) == ["n1", "n2"]
    assert len({round(a["started"] or 0) for a in profiling}) <= 2  # launched together, not one per round
