"""One real cluster for the dashboard tests: the master (aiohttp, SQLite, local executor) with in-process
agents on emulated devices, tokens for an admin and for users of two tenants, and an HTTP client that
keeps cookies like a browser (no redirects followed, so each answer can be checked)."""

from __future__ import annotations

import http.cookiejar
import json
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.inprocess import InProcessCluster

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "emulated_train.py")
CONFIG: dict[str, Any] = {
    "cluster": {"name": "dashboard"},
    "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 2}, {"id": "n2", "gpu_type": "k80", "gpus": 2}],
    "tenants": [
        {"name": "vision", "guaranteed_gpus": 2},
        {"name": "nlp", "cap_gpus": 3, "cap_gpus_by_type": {"k80": 2}},
    ],
    "scheduler": {"round_seconds": 2, "profiling_iterations": 10},
    "master": {"heartbeat_interval_s": 0.5, "suspect_after_s": 3, "lost_after_s": 8},
}
DEADLINE_S = 300


def job(iters: int, tenant: str, gpus: list[int] | None = None, name: str = "") -> dict[str, Any]:
    command = [sys.executable, EXAMPLE, "--iters", str(iters), "--step-seconds", "0.02"]
    body = {"command": command, "gpus": gpus or [1], "batch_size": 16, "iterations": iters, "tenant": tenant}
    return {**body, "name": name} if name else body


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Answer:
    status: int
    headers: Any
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Browserish:
    """urllib with a cookie jar: what a browser sends, minus the browser."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if form is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.opener.open(req, timeout=20) as r:
                return Answer(r.status, r.headers, r.read().decode())
        except urllib.error.HTTPError as err:
            with err:
                return Answer(err.code, err.headers, err.read().decode())


@dataclass
class Dash:
    cluster: InProcessCluster
    tokens: dict[str, str]  # admin, ana (vision), bo (nlp)

    @property
    def url(self) -> str:
        return self.cluster.url

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.tokens['admin']}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=20) as answer:
            return json.load(answer)

    def browser(self) -> Browserish:
        return Browserish(self.url)


@pytest.fixture(scope="package")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"the dashboard tests ran past their deadline of {DEADLINE_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)
    cluster = InProcessCluster(tmp_path_factory.mktemp("dashboard"), CONFIG)
    try:
        cluster.start({"n1": 1.0, "n2": 0.5})
        cluster.wait(
            lambda: all(n["health"] == "HEALTHY" for n in cluster.api("GET", "/api/v1/nodes")["nodes"]),
            30,
            "healthy nodes",
        )
        tokens = {"admin": cluster.admin}
        for user, tenant in (("ana", "vision"), ("bo", "nlp")):
            tokens[user] = cluster.api("POST", "/api/v1/tokens", {"user": user, "tenant": tenant})["token"]
        yield Dash(cluster, tokens)
        cluster.check()
    finally:
        try:
            cluster.close()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
