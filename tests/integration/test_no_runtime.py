"""Scripts that do not use hopsmgr.runtime, on a real local cluster (master and agent processes, the
CLI): `hopsmgr submit job.sh` with `#HOPS` lines and `--no-runtime` runs without a profiling run and
completes; explain says how it was placed; a submission no placement can hold is refused with the
reason; a profiling run of a script that never writes a profile is cut off after
`scheduler.profiling_timeout_s` with the reason, long before the script would end."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import PYTHON, LocalCluster, Node

SCRIPT = f"""#!/bin/sh
#HOPS --gpus 1 --no-runtime
#HOPS --time 10m --name plain-script
echo "started in $(pwd) with HOPS_GPUS=$HOPS_GPUS"
{PYTHON} -c 'print("step", 1); print("step", 2)'
echo done
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path, [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)], scheduler="profiling_timeout_s = 3"
    )
    try:
        yield c.start()
    finally:
        c.close()


def test_a_script_without_the_runtime_runs_from_its_hops_lines_without_profiling(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    job_id = cluster.cli("submit", "job.sh").stdout.strip()
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED", job
    assert job["name"] == "plain-script" and job["workdir"] == str(tmp_path)
    assert [a for a in job["attempts"] if a["profiling"]] == []
    kinds = [h["kind"] for h in job["history"]]
    assert "profiling" not in kinds and kinds[-1] == "completed"
    queued = next(h for h in job["history"] if h["kind"] == "queued")
    assert "no profiling run" in queued["message"]
    log = cluster.api("GET", f"/api/v1/jobs/{job_id}/logs")["log"]
    assert f"started in {tmp_path} with HOPS_GPUS=1" in log and "done" in log
    explain = cluster.cli("explain", job_id).stdout
    assert "no profile (the command does not use hopsmgr.runtime)" in explain
    assert "expected run time of 600 s (its --time); never preempted" in explain


def test_a_job_no_placement_can_hold_is_refused_at_submit(cluster: LocalCluster) -> None:
    proc = cluster.cli("submit", "--gpus", "3", "--no-runtime", "--", "true", check=False)
    assert proc.returncode == 1
    assert "gpus: no placement can ever hold 3 GPUs" in proc.stderr
    assert "(k80: 2, v100: 2)" in proc.stderr
    assert cluster.api("GET", "/api/v1/jobs?state=PENDING&state=QUEUED")["jobs"] == []


def test_a_profiling_run_that_never_writes_a_profile_fails_after_the_timeout(cluster: LocalCluster) -> None:
    t0 = time.monotonic()
    job_id = cluster.cli(
        "submit", "--gpus", "1", "--batch-size", "8", "--iters", "10", "--",
        PYTHON, "-c", "import time; time.sleep(120)",
    ).stdout.strip()  # fmt: skip
    job = cluster.wait_state(job_id, "FAILED", timeout=60)
    assert time.monotonic() - t0 < 60
    assert "wrote no profile within 3 s" in job["reason"] and "--no-runtime" in job["reason"]


def test_a_failure_reason_quotes_the_last_lines_of_the_log_not_the_first(cluster: LocalCluster) -> None:
    code = "print('loading data'); print('epoch 1'); import json; json.loads('{broken')"
    job_id = cluster.cli("submit", "--gpus", "1", "--no-runtime", "--", PYTHON, "-c", code).stdout.strip()
    job = cluster.wait_state(job_id, "FAILED", timeout=60)
    first, *rest = job["reason"].splitlines()
    assert "exited with 1: json.decoder.JSONDecodeError: Expecting property name" in first, job["reason"]
    assert rest[0] == "last lines of the log:" and "JSONDecodeError" in rest[-1]
    assert "loading data" not in job["reason"]  # the log's first lines are not the reason
    shown = cluster.cli("show", job_id).stdout
    assert "JSONDecodeError" in shown.split("reason:", 1)[1].splitlines()[0]


def test_logs_follow_streams_into_a_pipe_while_the_job_runs(cluster: LocalCluster) -> None:
    code = "import time\nfor i in range(200):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
    job_id = cluster.cli("submit", "--gpus", "1", "--no-runtime", "--", PYTHON, "-c", code).stdout.strip()
    cluster.wait_state(job_id, "RUNNING")
    env = {**os.environ, "HOPSMGR_URL": cluster.url, "HOPSMGR_TOKEN": cluster.admin_token}
    follow = subprocess.Popen(
        [PYTHON, "-m", "hopsmgr.cli.main", "logs", "-f", job_id], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # a pipe, not a terminal: the CLI must flush what it prints
        assert first.startswith("tick "), first
        assert cluster.job(job_id)["state"] == "RUNNING"  # it arrived while the job still ran
    finally:
        follow.kill()
        follow.communicate()
    cluster.cli("cancel", job_id)


def test_after_starts_a_job_once_its_dependency_completed_and_refuses_a_failed_one(
    cluster: LocalCluster,
) -> None:
    def submit(*args: str, code: str = "import time; time.sleep(1)") -> str:
        argv = ["submit", "--gpus", "1", "--no-runtime", *args, "--", PYTHON, "-c", code]
        return cluster.cli(*argv).stdout.strip()

    first = submit(code="import time; time.sleep(8)")
    second = submit("--after", first)
    explain = cluster.cli("explain", second).stdout
    if cluster.job(first)["state"] != "COMPLETED":  # (a slow machine may take 8 s to get here)
        assert f"waits for:      {first}" in explain, explain
    done = cluster.wait_state(second, "COMPLETED", "FAILED", "CANCELLED", timeout=90)
    assert done["state"] == "COMPLETED", done
    ended_first = cluster.job(first)["attempts"][-1]["ended"]
    assert done["attempts"][0]["started"] >= ended_first  # it waited for the first to end
    failing = submit(code="raise SystemExit(3)")
    cluster.wait_state(failing, "FAILED")
    proc = cluster.cli("submit", "--gpus", "1", "--no-runtime", "--after", failing, "--", "true", check=False)
    assert proc.returncode == 1 and f"after: job {failing} ended FAILED" in proc.stderr, proc.stderr
    proc = cluster.cli(
        "submit", "--gpus", "1", "--no-runtime", "--after", "j-999999", "--", "true", check=False
    )
    assert proc.returncode == 1 and "after: no job 'j-999999'" in proc.stderr, proc.stderr


def test_an_array_submits_a_job_per_index_each_seeing_its_index(cluster: LocalCluster) -> None:
    code = "import os; print('index', os.environ['HOPS_ARRAY_INDEX'])"
    out = cluster.cli(
        "submit", "--gpus", "1", "--no-runtime", "--array", "0-4:2", "--name", "sweep", "--", PYTHON, "-c", code
    ).stdout.split()  # fmt: skip
    assert len(out) == 3 and len(set(out)) == 3, out
    for index, job_id in zip((0, 2, 4), out, strict=True):
        job = cluster.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED", job
        assert job["name"] == f"sweep[{index}]" and job["env"] == {"HOPS_ARRAY_INDEX": str(index)}
        assert f"index {index}" in cluster.api("GET", f"/api/v1/jobs/{job_id}/logs")["log"]
    refused = cluster.cli(
        "submit", "--gpus", "1", "--no-runtime", "--array", "0-2%1", "--", "true", check=False
    )
    assert refused.returncode == 2 and "not supported" in refused.stderr
    # the index is the master's to set: a user's own HOPS_ARRAY_INDEX is refused as every HOPS_ variable
    bad = cluster.cli(
        "submit", "--gpus", "1", "--no-runtime", "--env", "HOPS_ARRAY_INDEX=1", "--", "true", check=False
    )
    assert bad.returncode != 0 and "HOPS_" in bad.stderr
