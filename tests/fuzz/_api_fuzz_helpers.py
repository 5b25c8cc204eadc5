"""Shared by the fuzz tests of the master's HTTP API (test_api_fuzz.py, test_api_fuzz_submissions.py) and
their `api` fixture (conftest.py): the cluster's tenants, a client (Api) that sends requests exactly as
drawn, strategies for JSON documents (with NaN, huge numbers and lone surrogates written as raw text), the
drawn request, and the checks on each answer and on what the store holds.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.integration.cluster import LocalCluster

TENANTS = """
[[tenants]]
name = "vision"
guaranteed_gpus = 2
[[tenants]]
name = "nlp"
guaranteed_gpus = 0
"""
PY = sys.executable
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
IDENTITY = ("id", "name", "tenant", "user", "gpus", "submitted")  # never change once stored
FINAL = (*IDENTITY, "state", "reason", "restarts")  # a finished job changes no more
EXAMPLES = 150  # per group of operations
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


# -- the client of the cluster --------------------------------------------------------------------------


@dataclass
class Api:
    cl: LocalCluster
    host: str
    port: int
    tokens: dict[str, str]  # admin, ana (vision: owns the seeded jobs), bo (nlp), cluster
    doc: dict[str, Any]
    finished: list[str]  # seeded jobs that have ended (completed, failed, cancelled)
    sleeper: str  # ana's job that keeps running
    last_seq: int  # the highest job sequence number handed out so far
    hits: Counter[str] = field(default_factory=Counter)  # "METHOD path -> status" seen

    def send(
        self, method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, resp.getheader("Content-Type") or "", raw
        finally:
            conn.close()

    def admin(self, method: str, target: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, _, raw = self.send(method, target, data, {"Authorization": f"Bearer {self.tokens['admin']}"})
        assert status < 300, (method, target, status, raw[:500])
        return json.loads(raw)

    def snapshot(self) -> tuple[dict[str, dict[str, Any]], dict[str, bool]]:
        jobs = {j["id"]: j for j in self.admin("GET", "/api/v1/jobs?limit=100000")["jobs"]}
        drained = {n["id"]: bool(n["drained"]) for n in self.admin("GET", "/api/v1/nodes")["nodes"]}
        return jobs, drained


def job_seq(job_id: str) -> int:
    return int(job_id.rsplit("-", 1)[1])


# -- strategies -------------------------------------------------------------------------------------------


class Raw(str):
    """JSON text written as is (what json.dumps cannot write: NaN, Infinity, 1e999, lone surrogates)."""


SPECIAL_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "0e0", "1E+2", "-0.0"]
HUGE_INTS = [2**31, 2**53 + 1, 2**63, -(2**63) - 1, 2**64, 10**30, 10**308, 10**400, 10**4299]
UNICODE = st.characters(exclude_categories=["Cs"])
# a lone surrogate (JSON "\ud800") decodes to a Python str that cannot be encoded as UTF-8
LONE_SURROGATE = st.tuples(
    st.text(UNICODE, max_size=8), st.integers(0xD800, 0xDFFF), st.text(UNICODE, max_size=8)
).map(lambda t: t[0] + chr(t[1]) + t[2])
TEXT = st.text(UNICODE, max_size=40) | LONE_SURROGATE
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(HUGE_INTS),
    st.sampled_from(["1" + "0" * 5000, "-" + "9" * 4400]).map(Raw),  # more digits than json.loads reads
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(SPECIAL_NUMBERS).map(Raw),
    TEXT,
    st.sampled_from(["", "\x00", "a\x00b", "..", "../../etc/passwd", "j-000001", "n1", "vision", "\u202e"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=25,
)


def dump(value: Any, ascii_only: bool = True) -> str:
    """JSON text of `value`, with Raw pieces spliced in verbatim."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        items = (
            f"{json.dumps(str(k), ensure_ascii=ascii_only)}: {dump(v, ascii_only)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


SUBMIT_KEYS = (
    "command", "gpus", "batch_size", "iterations", "samples", "name", "tenant", "params", "workdir", "env",
    "launcher", "mem_mb", "cpus",
)  # fmt: skip


@dataclass
class Request:
    method: str
    template: str
    target: str
    auth: str
    headers: dict[str, str]
    body: bytes | None


# -- checks -------------------------------------------------------------------------------------------------


def check_answer(req: Request, status: int, ctype: str, raw: bytes) -> Any:
    where = f"{req.method} {req.target[:300]} (auth {req.auth}) -> {status}: {raw[:500]!r}"
    assert status < 500, where
    if status < 400:
        if req.template == "/metrics":
            assert ctype.startswith("text/plain"), where
            assert raw.decode("utf-8").startswith("# HELP"), where
            return None
        assert ctype.startswith("application/json"), where
        doc = json.loads(raw)
        assert isinstance(doc, dict), where
        return doc
    assert ctype.startswith("application/json"), where
    doc = json.loads(raw)
    assert isinstance(doc, dict) and set(doc) == {"error"}, where
    error = doc["error"]
    assert isinstance(error, dict) and {"status", "field", "message"} <= set(error), where
    assert error["status"] == status, where
    assert error["field"] is None or isinstance(error["field"], str), where
    assert isinstance(error["message"], str) and error["message"], where
    return doc


def check_unchanged(
    api: Api,
    before: tuple[dict[str, dict[str, Any]], dict[str, bool]],
    after: tuple[dict[str, dict[str, Any]], dict[str, bool]],
    *,
    new_job: str | None = None,
    cancelled: str | None = None,
    drained: dict[str, bool] | None = None,
) -> None:
    jobs0, nodes0 = before
    jobs1, nodes1 = after
    added = set(jobs1) - set(jobs0)
    assert added == ({new_job} if new_job else set()), f"jobs appeared: {sorted(added)}"
    assert set(jobs0) <= set(jobs1), f"jobs vanished: {sorted(set(jobs0) - set(jobs1))}"
    for jid, old in jobs0.items():
        new = jobs1[jid]
        if jid == cancelled:
            assert new["state"] == "CANCELLED" and {k: new[k] for k in IDENTITY} == {
                k: old[k] for k in IDENTITY
            }
            continue
        keys = FINAL if old["state"] in TERMINAL else IDENTITY
        assert {k: new[k] for k in keys} == {k: old[k] for k in keys}, (jid, old, new)
        if old["state"] not in TERMINAL:  # scheduling moves it on, but only a request could end it
            assert new["state"] not in TERMINAL, (jid, old, new)
    assert nodes1 == {**nodes0, **(drained or {})}, (nodes0, nodes1)
