"""Bad input to a running master, over HTTP (urllib) and through the `hopsmgr` CLI.

Every refusal must give the right status, an error body naming the field at fault, and store nothing
(the job count does not move). Every status seen is recorded; the last test checks that the master is
still healthy and never answered 5xx. One real cluster serves the whole module.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

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
PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(60)"]
BASE: dict[str, Any] = {"command": [PY, "-c", "pass"], "gpus": [1], "batch_size": 8, "iterations": 10}
SEEN: list[tuple[str, str, int]] = []  # (method, path, status) of every request made by the tests


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BASE.items() if k != key}


def raw_json(text: str) -> bytes:
    """BASE with `"iterations": <text>` spliced in as raw JSON text (for what json.dumps cannot write)."""
    return json.dumps(without("iterations"))[:-1].encode() + b', "iterations": ' + text.encode() + b"}"


def call(
    cl: LocalCluster, method: str, path: str, body: Any = None, token: str | None = None, record: bool = True
) -> tuple[int, Any]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(cl.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {cl.admin_token if token is None else token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        with e:
            raw, status = e.read(), e.code
    if record:
        SEEN.append((method, path, status))
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")


def job_count(cl: LocalCluster) -> int:
    status, doc = call(cl, "GET", "/api/v1/jobs?limit=100000")
    assert status == 200, doc
    return len(doc["jobs"])


def refused(status: int, doc: Any, want: int, field: str | tuple[str, ...] | None) -> None:
    assert status == want, doc
    assert isinstance(doc, dict) and doc["error"]["status"] == want, doc
    got = doc["error"]["field"]
    if field is None:
        assert got is None, doc
    else:
        fields = (field,) if isinstance(field, str) else field
        assert got is not None and any(got == f or got.startswith((f + "[", f + ".")) for f in fields), doc


@pytest.fixture(scope="module")
def cl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    nodes = [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)]
    c = LocalCluster(tmp_path_factory.mktemp("badinput"), nodes, tenants=TENANTS)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def sleeper(cl: LocalCluster) -> str:
    status, doc = call(cl, "POST", "/api/v1/jobs", {**BASE, "command": SLEEP, "name": "sleeper"})
    assert status == 201, doc
    assert doc["id"] == "j-000001", "a refused submission used up a job id"
    return str(doc["id"])


SUBMITS = [
    pytest.param(b"{not json", 400, None, id="not-json"),
    pytest.param(b"\xff\xfe", 400, None, id="not-utf8"),
    pytest.param([BASE], 400, None, id="json-array"),
    pytest.param({**BASE, "gpu": [1]}, 400, "gpu", id="unknown-key"),
    *(pytest.param(without(k), 400, k, id=f"missing-{k}") for k in ("command", "gpus", "batch_size")),
    pytest.param({**BASE, "command": []}, 400, "command", id="command-empty"),
    pytest.param({**BASE, "command": [""]}, 400, "command", id="command-empty-program"),
    pytest.param({**BASE, "command": "python x.py"}, 400, "command", id="command-string"),
    pytest.param({**BASE, "command": [PY, "a\x00b"]}, 400, "command", id="command-nul"),
    *(
        pytest.param({**BASE, "gpus": g}, 400, "gpus", id=f"gpus-{json.dumps(g)}")
        for g in ([], [0], [-1], ["a"], [1, 1], True, [1.0], [4097])
    ),
    *(
        pytest.param({**BASE, "batch_size": b}, 400, "batch_size", id=f"batch-{json.dumps(b)}")
        for b in (0, -8, "8", 1.5, None)
    ),
    pytest.param({**BASE, "samples": 100}, 400, ("iterations", "samples"), id="iterations-and-samples"),
    pytest.param(without("iterations"), 400, ("iterations", "samples"), id="neither-iterations-nor-samples"),
    pytest.param({**BASE, "iterations": -1}, 400, "iterations", id="iterations-negative"),
    pytest.param({**BASE, "iterations": 0}, 400, "iterations", id="iterations-zero"),
    pytest.param({**BASE, "iterations": 1e-300}, 400, "iterations", id="iterations-below-one"),
    pytest.param({**without("iterations"), "samples": 0.5}, 400, "samples", id="samples-below-one"),
    pytest.param(raw_json("1e999"), 400, "iterations", id="iterations-1e999"),
    pytest.param(raw_json("NaN"), 400, "iterations", id="iterations-NaN"),
    pytest.param({**BASE, "env": {"A-B": "x"}}, 400, "env", id="env-bad-key"),
    pytest.param({**BASE, "env": {"HOPS_JOB_ID": "j-1"}}, 400, "env", id="env-HOPS_JOB_ID"),
    pytest.param({**BASE, "env": {"CUDA_VISIBLE_DEVICES": "0"}}, 400, "env", id="env-CUDA_VISIBLE_DEVICES"),
    pytest.param({**BASE, "env": {"A": 1}}, 400, "env", id="env-non-string"),
    pytest.param({**BASE, "env": ["A=1"]}, 400, "env", id="env-list"),
    pytest.param({**BASE, "workdir": "relative"}, 400, "workdir", id="workdir-relative"),
    pytest.param({**BASE, "workdir": "/a/../b"}, 400, "workdir", id="workdir-dotdot"),
    pytest.param({**BASE, "launcher": "mpi"}, 400, "launcher", id="launcher-mpi"),
    pytest.param({**BASE, "params": -1}, 400, "params", id="params-negative"),
    pytest.param({**BASE, "name": "x" * 129}, 400, "name", id="name-too-long"),
    pytest.param({**BASE, "tenant": "a/b"}, 400, "tenant", id="tenant-bad-id"),
    pytest.param({**BASE, "tenant": "unknown-tenant"}, 422, "tenant", id="tenant-unknown"),
    pytest.param({**BASE, "gpus": [64]}, 422, "gpus", id="gpus-more-than-the-cluster"),
    pytest.param({**BASE, "gpus": [8, 16]}, 422, "gpus", id="gpus-min-more-than-the-cluster"),
    pytest.param({**BASE, "name": "x" * 70_000}, 413, None, id="body-over-64KiB"),
]


@pytest.mark.parametrize(("body", "status", "field"), SUBMITS)
def test_submit_refused(
    cl: LocalCluster, body: Any, status: int, field: str | tuple[str, ...] | None
) -> None:
    before = job_count(cl)
    got, doc = call(cl, "POST", "/api/v1/jobs", body)
    refused(got, doc, status, field)
    if status == 422 and field == "gpus":
        assert "cluster's 4 GPUs" in doc["error"]["message"], doc
    assert job_count(cl) == before


FORMERLY_BUGS = [
    pytest.param(
        raw_json("1" + "0" * 5000), 400, None, id="huge-integer-literal",
    ),
    pytest.param(
        b'{"env": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2001, 400, None, id="deeply-nested-json",
    ),
    pytest.param(
        {**BASE, "iterations": 1e308}, 400, "iterations", id="iterations-overflow-to-inf",
    ),
    pytest.param(
        {**BASE, "params": 1e308}, 400, "params", id="params-overflow-to-inf",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "field"), FORMERLY_BUGS)
def test_submit_refused_known_bugs(cl: LocalCluster, body: Any, status: int, field: str | None) -> None:
    before = job_count(cl)
    got, doc = call(cl, "POST", "/api/v1/jobs", body, record=True)
    refused(got, doc, status, field)
    assert job_count(cl) == before


@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/api/v1/jobs?state=BOGUS", 400, "state"),
        ("/api/v1/jobs?state=running", 400, "state"),
        ("/api/v1/jobs?limit=0", 400, "limit"),
        ("/api/v1/jobs?limit=-1", 400, "limit"),
        ("/api/v1/jobs?limit=abc", 400, "limit"),
        ("/api/v1/jobs?limit=100001", 400, "limit"),
        ("/api/v1/jobs?tenant=nosuchtenant", 404, "tenant"),
        ("/api/v1/jobs?user=nosuchuser", 404, "user"),
        ("/api/v1/jobs/j-999999", 404, "id"),
        ("/api/v1/jobs/j-999999/logs", 404, "id"),
        ("/api/v1/jobs/j-999999/explain", 404, "id"),
        ("/api/v1/jobs/..%2F..%2Fetc", 400, "id"),
        ("/api/v1/jobs/%00", 400, "id"),
        ("/api/v1/nodes/nowhere", 404, "node"),
    ],
)
def test_bad_query_or_path(cl: LocalCluster, path: str, status: int, field: str) -> None:
    refused(*call(cl, "GET", path), status, field)


def test_dot_dot_path_is_not_a_server_error(cl: LocalCluster) -> None:
    for path in ("/api/v1/jobs/../../etc", "/api/v1/jobs/..", "/api/v1/jobs/%2E%2E/cancel"):
        status, doc = call(cl, "POST" if path.endswith("cancel") else "GET", path)
        assert status in (400, 404) and "error" in doc, (path, doc)


def test_cancel_twice_and_bad_tail(cl: LocalCluster, sleeper: str) -> None:
    refused(*call(cl, "GET", f"/api/v1/jobs/{sleeper}/logs?tail=0"), 400, "tail")
    refused(*call(cl, "GET", f"/api/v1/jobs/{sleeper}/logs?tail=x"), 400, "tail")
    status, doc = call(cl, "POST", f"/api/v1/jobs/{sleeper}/cancel", {})
    assert status == 200 and doc["state"] == "CANCELLED", doc
    refused(*call(cl, "POST", f"/api/v1/jobs/{sleeper}/cancel", {}), 409, "id")
    refused(*call(cl, "POST", "/api/v1/jobs/j-999999/cancel", {}), 404, "id")


NODE_KEYS = ("gpu_type", "gpus", "device_mode", "calibration", "drained")
HEARTBEATS: list[tuple[str, Any, str | None]] = [  # (id, changes to a good beat or a whole body, field)
    ("not-an-object", [1], None),
    ("missing-node", {"node": None}, "node"),
    ("missing-gpu_type", {"gpu_type": None}, "gpu_type"),
    ("unknown-key", {"bogus": 1}, "bogus"),
    ("gpus-negative", {"gpus": -1}, "gpus"),
    ("gpus-string", {"gpus": "2"}, "gpus"),
    ("device_mode", {"device_mode": "gpu"}, "device_mode"),
    ("running-not-a-list", {"running": {}}, "running"),
    ("running-without-attempt", {"running": [{"job": "j-000001"}]}, "running[0].attempt"),
    ("running-attempt-slash", {"running": [{"attempt": "a/b", "job": "j-1"}]}, "running[0].attempt"),
    (
        "finished-attempt-slash",
        {"finished": [{"attempt": "../a", "job": "j", "code": 0}]},
        "finished[0].attempt",
    ),
    ("finished-without-code", {"finished": [{"attempt": "a-1", "job": "j-1"}]}, "finished[0].code"),
    ("calibration-unknown", {"calibration": {"speed": 1.0}}, "calibration.speed"),
]


@pytest.mark.parametrize(("change", "field"), [h[1:] for h in HEARTBEATS], ids=[h[0] for h in HEARTBEATS])
def test_heartbeat_refused(cl: LocalCluster, change: Any, field: str | None) -> None:
    agent = (cl.state_dir / "cluster.token").read_text().strip()
    node = {k: cl.api("GET", "/api/v1/nodes/n1")[k] for k in NODE_KEYS}
    body = change
    if isinstance(change, dict):  # a good beat for n1 (its real identity) with these keys changed or dropped
        good = {"node": "n1", "gpu_type": "v100", "gpus": 2, "device_mode": "emulated"}
        good["workdir"] = str(cl.root / "nodes" / "n1")
        body = {k: v for k, v in {**good, **change}.items() if v is not None}
    refused(*call(cl, "POST", "/api/v1/agents/heartbeat", body, token=agent), 400, field)
    after = {k: cl.api("GET", "/api/v1/nodes/n1")[k] for k in NODE_KEYS}
    assert after == node


SUBMIT = ["submit", "--gpus", "1", "--batch-size", "8", "--iters", "10"]


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (["submit", "--gpus", "0", "--batch-size", "8", "--iters", "1", "--", PY], ["--gpus"]),
        (["submit", "--gpus", "8-2", "--batch-size", "8", "--iters", "1", "--", PY], ["--gpus"]),
        (["submit", "--gpus", "1,,2", "--batch-size", "8", "--iters", "1", "--", PY], ["--gpus"]),
        ([*SUBMIT, "--samples", "10", "--", PY], ["--iters", "--samples"]),
        ([*SUBMIT, "--"], ["command"]),
        (SUBMIT, ["command"]),
        ([*SUBMIT, "--rnum", "3", "--", PY], ["--rnum"]),
        ([*SUBMIT, "--env", "A-B=1", "--", PY], ["--env"]),
        ([*SUBMIT, "--workdir", "rel", "--", PY], ["--workdir"]),
        (["submit", "--gpus", "1", "--batch-size", "0", "--iters", "1", "--", PY], ["--batch-size"]),
        (["logs", "j-000001", "--tail", "0"], ["--tail"]),
    ],
    ids=[
        "gpus-0", "gpus-8-2", "gpus-empty-item", "iters-and-samples", "no-command-after-dashes",
        "no-command", "rnum-without-range", "env-bad-key", "workdir-relative", "batch-size-0", "logs-tail-0",
    ],
)  # fmt: skip
def test_cli_usage_errors(cl: LocalCluster, args: list[str], flags: list[str]) -> None:
    before = job_count(cl)
    proc = cl.cli(*args, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    for flag in flags:
        assert flag in proc.stderr, proc.stderr
    assert not proc.stdout.strip()
    assert job_count(cl) == before


def test_cli_refused_or_unreachable(cl: LocalCluster) -> None:
    proc = cl.cli("show", "j-999999", check=False)
    assert proc.returncode == 1 and "j-999999" in proc.stderr and "no job" in proc.stderr, proc.stderr
    proc = cl.cli(*SUBMIT, "--tenant", "unknown-tenant", "--", PY, check=False)
    assert proc.returncode == 1 and "tenant" in proc.stderr, proc.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = cl.cli("show", "j-000001", "--url", f"http://127.0.0.1:{port}", check=False)
    assert proc.returncode == 1 and "cannot reach" in proc.stderr, proc.stderr
    proc = cl.cli("queue", "--url", "ftp://nowhere", check=False)
    assert proc.returncode == 2 and "--url" in proc.stderr, proc.stderr


def test_master_still_healthy_and_never_5xx(cl: LocalCluster) -> None:
    health = cl.healthz()
    assert health is not None and health["status"] == "ok"
    assert [s for s in SEEN if s[2] >= 500] == []
