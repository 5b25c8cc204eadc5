"""Fixtures shared by the fuzz tests of this directory: a temporary directory for a module, and a real
cluster (master and two emulated agents, as processes) holding jobs in every kind of state, whose HTTP API
the API fuzz tests fuzz (tests/fuzz/_api_fuzz_helpers.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz._api_fuzz_helpers import PY, TENANTS, Api, job_seq
from tests.integration.cluster import EXAMPLE, FAIL_EXAMPLE, LocalCluster, Node


@pytest.fixture(scope="module")
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="configfuzz") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    nodes = [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)]
    cl = LocalCluster(
        tmp_path_factory.mktemp("apifuzz"), nodes, tenants=TENANTS, scheduler="profiling_iterations = 10"
    )
    try:
        cl.start()
        host, port = cl.url.removeprefix("http://").rsplit(":", 1)
        tokens = {"admin": cl.admin_token, "cluster": (cl.state_dir / "cluster.token").read_text().strip()}
        for user, tenant in (("ana", "vision"), ("bo", "nlp")):
            tokens[user] = cl.api("POST", "/api/v1/tokens", {"user": user, "tenant": tenant})["token"]
        doc = cl.api("GET", "/api/v1/openapi.json")

        def submit(argv: list[str], iterations: float) -> str:
            body = {"command": argv, "gpus": [1], "batch_size": 8, "iterations": iterations}
            return str(cl.api("POST", "/api/v1/jobs", body, token=tokens["ana"])["id"])

        quick = [PY, EXAMPLE, "--iters", "30", "--batch-size", "8", "--step-seconds", "0.01"]
        done, failed = submit(quick, 30), submit([PY, FAIL_EXAMPLE], 1)
        cancelled = submit([PY, "-c", "import time; time.sleep(60)"], 1)
        cl.api("POST", f"/api/v1/jobs/{cancelled}/cancel", {})
        endless = [PY, EXAMPLE, "--iters", "100000000", "--batch-size", "8", "--step-seconds", "0.05"]
        sleeper = submit(endless, 1e8)
        cl.wait_state(done, "COMPLETED", timeout=30)
        cl.wait_state(failed, "FAILED", timeout=30)
        cl.wait_state(sleeper, "RUNNING", timeout=30)
        yield Api(cl, host, int(port), tokens, doc, [done, failed, cancelled], sleeper, job_seq(sleeper))
    finally:
        cl.close()
