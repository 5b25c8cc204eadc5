"""Security of the running master, driven like a user: HTTP (urllib) and the `hopsmgr` CLI.

Authentication on every route, token creation, tenant isolation, the cluster token's reach, protocol
versioning, how tokens are kept (file mode, hashes in SQLite), no secret in any log, and no shell
between a submitted argv and the process that runs it. One real cluster serves the whole module.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.master.api import make_app
from hopsmgr.protocol import PROTOCOL_VERSION
from tests.integration.cluster import LocalCluster, Node

TENANTS = """
[[tenants]]
name = "vision"
guaranteed_gpus = 2
[[tenants]]
name = "nlp"
guaranteed_gpus = 0
"""
JOB = "/api/v1/jobs/j-000001"
ROUTES = [  # every (method, path) the master serves, with a concrete path for the templated ones
    ("GET", "/metrics", "/metrics"),
    ("POST", "/api/v1/jobs", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/{job}", JOB),
    ("POST", "/api/v1/jobs/{job}/cancel", JOB + "/cancel"),
    ("GET", "/api/v1/jobs/{job}/logs", JOB + "/logs"),
    ("GET", "/api/v1/jobs/{job}/explain", JOB + "/explain"),
    ("POST", "/api/v1/forecasts", "/api/v1/forecasts"),
    ("GET", "/api/v1/nodes", "/api/v1/nodes"),
    ("GET", "/api/v1/nodes/{node}", "/api/v1/nodes/n1"),
    ("POST", "/api/v1/nodes/{node}/drain", "/api/v1/nodes/n1/drain"),
    ("POST", "/api/v1/nodes/{node}/undrain", "/api/v1/nodes/n1/undrain"),
    ("POST", "/api/v1/nodes/{node}/calibrate", "/api/v1/nodes/n1/calibrate"),
    ("GET", "/api/v1/tenants", "/api/v1/tenants"),
    ("GET", "/api/v1/cluster", "/api/v1/cluster"),
    ("POST", "/api/v1/tokens", "/api/v1/tokens"),
    ("GET", "/api/v1/tokens", "/api/v1/tokens"),
    ("DELETE", "/api/v1/tokens/{token}", "/api/v1/tokens/0123456789abcdef"),
    ("GET", "/api/v1/users", "/api/v1/users"),
    ("POST", "/api/v1/users", "/api/v1/users"),
    ("GET", "/api/v1/users/{user}", "/api/v1/users/ana"),
    ("POST", "/api/v1/users/{user}", "/api/v1/users/ana"),
    ("DELETE", "/api/v1/users/{user}", "/api/v1/users/ana"),
    ("POST", "/api/v1/agents/heartbeat", "/api/v1/agents/heartbeat"),
]
PUBLIC = [("GET", "/healthz"), ("GET", "/api/v1/openapi.json")]
BAD_AUTH = {
    "none": None,
    "basic": "Basic YWRtaW46YWRtaW4=",
    "no-token": "Bearer",
    "blank-token": "Bearer   ",
    "other-scheme": "Token abcdefghijklmnopqrstuvwxyz",
    "unknown": "Bearer " + "x" * 43,
}


def http(
    cl: LocalCluster, method: str, path: str, body: Any = None, auth: str | None = None
) -> tuple[int, Any]:
    """One request with exactly the Authorization header given (or none)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cl.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if auth is not None:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        with e:
            raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


def beat(node: str = "n1", **extra: Any) -> dict[str, Any]:
    return {"node": node, "gpu_type": "v100", "gpus": 2, "device_mode": "emulated", "workdir": "/x", **extra}


@pytest.fixture(scope="module")
def cl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    nodes = [Node("n1", "v100", 2, 1.0), Node("n2", "k80", 2, 0.5)]
    c = LocalCluster(tmp_path_factory.mktemp("security"), nodes, tenants=TENANTS)
    try:
        yield c.start()
    finally:
        c.close()


@pytest.fixture(scope="module")
def tokens(cl: LocalCluster) -> dict[str, str]:
    status, doc = cl.request("POST", "/api/v1/tokens", {"user": "ana", "tenant": "vision"})
    assert status == 201, doc
    assert doc["user"] == "ana" and doc["tenant"] == "vision" and doc["admin"] is False
    bo = cl.cli("token", "create", "--user", "bo", "--tenant", "nlp").stdout.strip()
    return {"ana": doc["token"], "bo": bo}


@pytest.fixture(scope="module")
def jobs(cl: LocalCluster, tokens: dict[str, str]) -> dict[str, str]:
    ana = cl.submit(token=tokens["ana"], tenant="vision", name="ana-job", iters=200)
    bo = cl.submit(token=tokens["bo"], tenant="nlp", name="bo-job", iters=20)
    return {"ana": ana, "bo": bo}


@pytest.mark.parametrize("how", list(BAD_AUTH))
@pytest.mark.parametrize(("method", "template", "path"), ROUTES, ids=[f"{m} {t}" for m, t, _ in ROUTES])
def test_every_route_needs_a_token(cl: LocalCluster, how: str, method: str, template: str, path: str) -> None:
    body: dict[str, Any] | None = {} if method == "POST" else None
    status, doc = http(cl, method, path, body, BAD_AUTH[how])
    assert status == 401, (template, doc)
    assert doc["error"]["field"] == "Authorization" and doc["error"]["status"] == 401


def test_public_routes_and_openapi_lists_every_route(cl: LocalCluster) -> None:
    for method, path in PUBLIC:
        status, _ = http(cl, method, path)
        assert status == 200, path
    status, doc = http(cl, "GET", "/api/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    exercised = {(m, t) for m, t, _ in ROUTES} | set(PUBLIC)
    app = make_app(None, None, "-", None)  # type: ignore[arg-type]  # only the router is read
    served = {
        (r.method, r.resource.canonical) for r in app.router.routes() if r.resource and r.method != "HEAD"
    }
    assert documented == exercised == served


def test_token_creation(cl: LocalCluster, tokens: dict[str, str]) -> None:
    assert tokens["ana"] != tokens["bo"] and len(tokens["bo"]) >= 43  # 32 random bytes, URL-safe base64
    for user, tenant in (("ana", "vision"), ("bo", "nlp")):
        status, doc = cl.request("GET", "/api/v1/tenants", token=tokens[user])
        assert status == 200 and [t["name"] for t in doc["tenants"]] == [tenant]
    status, doc = cl.request("POST", "/api/v1/tokens", {"user": "eve", "tenant": "vision"}, tokens["ana"])
    assert status == 403, doc
    proc = cl.cli("token", "create", "--user", "eve", "--tenant", "nlp", token=tokens["bo"], check=False)
    assert proc.returncode == 1 and "admin" in proc.stderr and not proc.stdout.strip()
    status, doc = cl.request("POST", "/api/v1/tokens", {"user": "eve", "tenant": "unknown-tenant"})
    assert status == 422 and doc["error"]["field"] == "tenant", doc
    status, doc = cl.request("POST", "/api/v1/tokens", {"user": "ev/e", "tenant": "nlp"})
    assert status == 400 and doc["error"]["field"] == "user", doc


def test_tenant_isolation(cl: LocalCluster, tokens: dict[str, str], jobs: dict[str, str]) -> None:
    ana, bo = tokens["ana"], tokens["bo"]
    j = f"/api/v1/jobs/{jobs['ana']}"
    for method, path in (("GET", j), ("POST", j + "/cancel"), ("GET", j + "/logs"), ("GET", j + "/explain")):
        status, doc = cl.request(method, path, {} if method == "POST" else None, bo)
        assert status == 404 and doc["error"]["field"] == "id", (path, doc)
        assert jobs["ana"] in doc["error"]["message"]
    assert cl.job(jobs["ana"])["state"] != "CANCELLED"
    proc = cl.cli("cancel", jobs["ana"], token=bo, check=False)
    assert proc.returncode == 1 and "no job" in proc.stderr
    for query in ("", "?state=COMPLETED&state=PENDING&state=PROFILING&state=QUEUED&state=RUNNING"):
        listed = [x["id"] for x in cl.api("GET", "/api/v1/jobs" + query, token=bo)["jobs"]]
        assert jobs["ana"] not in listed and jobs["bo"] in listed
    assert cl.api("GET", "/api/v1/jobs?user=ana", token=bo)["jobs"] == []
    status, doc = cl.request("GET", "/api/v1/jobs?tenant=vision", token=bo)
    assert status == 403 and doc["error"]["field"] == "tenant"
    body = {"command": [sys.executable, "-c", "pass"], "gpus": [1], "batch_size": 8, "iterations": 1}
    status, doc = cl.request("POST", "/api/v1/jobs", {**body, "tenant": "vision"}, bo)
    assert status == 403 and doc["error"]["field"] == "tenant", doc
    proc = cl.cli("queue", "--all", "--json", token=ana)
    assert {x["tenant"] for x in json.loads(proc.stdout)["jobs"]} == {"vision"}
    listed = cl.api("GET", "/api/v1/jobs", token=ana)["jobs"]
    assert {x["tenant"] for x in listed} == {"vision"} and jobs["bo"] not in {x["id"] for x in listed}
    every = {x["id"] for x in cl.api("GET", "/api/v1/jobs")["jobs"]}
    assert {jobs["ana"], jobs["bo"]} <= every
    assert {t["name"] for t in cl.api("GET", "/api/v1/tenants")["tenants"]} == {"vision", "nlp"}
    for verb in ("drain", "undrain", "calibrate"):
        status, doc = cl.request("POST", f"/api/v1/nodes/n1/{verb}", {}, ana)
        assert status == 403, doc
    for args in (("drain", "n2"), ("undrain", "n2"), ("nodes", "calibrate", "n2")):
        assert cl.cli(*args, token=bo, check=False).returncode == 1
    assert not any(n["drained"] for n in cl.api("GET", "/api/v1/nodes")["nodes"])


def test_cluster_token_only_for_heartbeats(cl: LocalCluster, tokens: dict[str, str]) -> None:
    agent = (cl.state_dir / "cluster.token").read_text().strip()
    for path in ("/api/v1/jobs", "/api/v1/nodes", "/api/v1/tenants", "/metrics"):
        status, doc = http(cl, "GET", path, auth=f"Bearer {agent}")
        assert status == 401 and doc["error"]["field"] == "Authorization", path
    status, _ = http(cl, "POST", "/api/v1/tokens", {"user": "x", "tenant": "nlp"}, f"Bearer {agent}")
    assert status == 401
    for token in (cl.admin_token, tokens["ana"]):
        status, doc = http(cl, "POST", "/api/v1/agents/heartbeat", beat(), f"Bearer {token}")
        assert status == 401 and doc["error"]["field"] == "Authorization"
    # the cluster token gets past authentication: these are refused for what they say, not who says it
    status, doc = http(cl, "POST", "/api/v1/agents/heartbeat", beat("nowhere"), f"Bearer {agent}")
    assert status == 404 and doc["error"]["field"] == "node" and "nowhere" in doc["error"]["message"]
    other = PROTOCOL_VERSION + 1
    status, doc = http(cl, "POST", "/api/v1/agents/heartbeat", beat(protocol=other), f"Bearer {agent}")
    assert status == 409 and doc["error"]["field"] == "protocol", doc
    assert str(other) in doc["error"]["message"] and str(PROTOCOL_VERSION) in doc["error"]["message"]
    assert all(n["health"] == "HEALTHY" for n in cl.api("GET", "/api/v1/nodes")["nodes"])


def test_authentication_comes_before_input_checks(cl: LocalCluster) -> None:
    for method, path in (("POST", "/api/v1/jobs/a%20b/cancel"), ("GET", "/api/v1/jobs/a%20b")):
        status, doc = http(cl, method, path, {} if method == "POST" else None)
        assert status == 401 and doc["error"]["field"] == "Authorization", (path, doc)


def test_tokens_kept_secret_on_disk(cl: LocalCluster, tokens: dict[str, str]) -> None:
    for name in ("admin.token", "cluster.token"):
        assert (cl.state_dir / name).stat().st_mode & 0o777 == 0o600, name
    db = sqlite3.connect(f"file:{cl.state_dir / 'state.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT hash, user, tenant, admin FROM tokens").fetchall()
    finally:
        db.close()
    stored = json.dumps(rows)
    for token in (cl.admin_token, *tokens.values()):
        assert token not in stored
        assert hashlib.sha256(token.encode()).hexdigest() in {r[0] for r in rows}
    assert {(r[1], r[2], r[3]) for r in rows} >= {("ana", "vision", 0), ("bo", "nlp", 0)}
    for path in cl.state_dir.glob("state.db*"):  # the database and its WAL, byte for byte
        data = path.read_bytes()
        for token in (cl.admin_token, *tokens.values()):
            assert token.encode() not in data, path.name


def test_no_shell_between_argv_and_process(
    cl: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("inject")
    tag = secrets.token_hex(4)
    name = f"x; touch {tmp}/PWNED_{tag}"
    env_value = f"$(touch {tmp}/pwned2)"
    script = "import os, sys; print('ARGV', sys.argv[1:], os.environ['EVIL']); print('ENV', dict(os.environ))"
    argv = [
        sys.executable,
        "-c",
        script,
        f"`touch {tmp}/pwned3`",
        f"$(touch {tmp}/pwned4)",
        f"; touch {tmp}/p5 #",
    ]
    proc = cl.cli(
        "submit", "--gpus", "1", "--batch-size", "8", "--iters", "5", "--name", name,
        "--env", f"EVIL={env_value}", "--", *argv,
    )  # fmt: skip
    job_id = proc.stdout.strip()
    job = cl.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["command"] == argv and job["name"] == name and job["env"] == {"EVIL": env_value}
    assert any(a["exit_code"] == 0 for a in job["attempts"]), job  # the program ran, and ran fine
    # each argument arrived verbatim (the attempt's own output; the API's log is the latest attempt's)
    outputs = [p.read_text() for p in cl.root.glob(f"nodes/*/attempts/{job['attempts'][0]['id']}/log")]
    api_log = cl.api("GET", f"/api/v1/jobs/{job_id}/logs")["log"]
    assert f"ARGV {argv[3:]!r} {env_value}" in "".join([*outputs, api_log, job["reason"] or ""]), outputs
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert not Path(f"/tmp/PWNED_{tag}").exists()


def test_no_secret_in_logs(cl: LocalCluster, tokens: dict[str, str]) -> None:
    secrets_ = [cl.admin_token, (cl.state_dir / "cluster.token").read_text().strip(), *tokens.values()]

    def files() -> list[Path]:
        return [cl.root / "master.log", *cl.root.glob("agent-*.log"), *cl.root.glob("nodes/*/attempts/*/*")]

    logs = files()
    assert len(logs) >= 5  # with the jobs' own output (the injection job prints its whole environment)
    read: set[Path] = set()
    seen: set[Path] = set()
    pending = logs
    # Attempts still running write files atomically: a temporary listed here may be renamed before it
    # is read, so the files are listed again after each pass and the new ones read (a few passes).
    for _ in range(5):
        for path in pending:
            seen.add(path)
            try:
                text = path.read_text(errors="replace")
            except FileNotFoundError:
                continue
            read.add(path)
            for secret in secrets_:
                assert secret not in text, f"a token appears in {path}"
        pending = [p for p in files() if p not in seen]
        if not pending:
            break
    assert len(read) >= 5
    assert "job_submitted" in (cl.root / "master.log").read_text()
