"""Fixtures of the CLI tests: an isolated environment and a real tiny aiohttp master in a thread.

`FakeMaster` answers a few canned routes of docs/api.md and records every request (method, path,
query, headers, JSON body). It runs its own event loop in a background thread, so the synchronous
client under test talks to it over a real socket.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from hopsmgr.cli.main import main

GOOD_TOKEN = "good-token"


def job_summary(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": "j-000001",
        "name": "resnet",
        "tenant": "vision",
        "user": "ana",
        "state": "RUNNING",
        "gpus": [1, 2, 4],
        "submitted": 1796035200.0,
        "placement": {"node-a": 2},
        "position": None,
        "priority": 1.8,
        "latency_ratio": 1.8,
        "est_wait_s": None,
        "progress": 0.42,
        "attempts": 2,
        "restarts": 1,
        "reason": None,
    }
    job.update(overrides)
    return job


def error(status: int, field_name: str | None, message: str) -> web.Response:
    body = {"error": {"status": status, "field": field_name, "message": message}}
    return web.json_response(body, status=status)


@dataclass
class Seen:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeMaster:
    requests: list[Seen] = field(default_factory=list)
    log_chunks: list[str] = field(default_factory=lambda: ["step 1\n", "step 2\n", "step 3\n", "done\n"])
    log_polls: int = 0
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    # -- routes

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append(
            Seen(
                request.method,
                request.path,
                list(request.query.items()),
                dict(request.headers),
                json.loads(raw) if raw else None,
            )
        )
        if request.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
            return error(401, None, "missing or unknown token")
        return await handler(request)

    async def submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        if max(body["gpus"]) > 32:
            return error(422, "gpus", f"gpus: the cluster has 32 GPUs, the job asks for {max(body['gpus'])}")
        return web.json_response(job_summary(id="j-000007", state="PENDING", gpus=body["gpus"]), status=201)

    async def jobs(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"jobs": [job_summary(), job_summary(id="j-000002", state="QUEUED", position=1)]}
        )

    async def job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        if job_id == "j-404":
            return error(404, "id", "no job j-404")
        done = self.log_polls >= len(self.log_chunks)
        return web.json_response(job_summary(id=job_id, state="COMPLETED" if done else "RUNNING"))

    async def logs(self, request: web.Request) -> web.Response:
        self.log_polls += 1
        text = "".join(self.log_chunks[: self.log_polls])
        tail = request.query.get("tail")
        if tail is not None:
            text = text[-int(tail) :]
        return web.json_response({"id": request.match_info["id"], "attempt": 1, "log": text})

    async def cancel(self, request: web.Request) -> web.Response:
        if request.match_info["id"] == "j-404":
            return error(404, "id", "no job j-404")
        return web.json_response(job_summary(id=request.match_info["id"], state="CANCELLED"))

    async def broken(self, request: web.Request) -> web.Response:
        return web.Response(status=500, text="Internal Server Error")

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response({})

    async def tokens(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"token": "new-secret", **body}, status=201)

    async def tenants(self, request: web.Request) -> web.Response:
        tenant = {"name": "vision", "guaranteed_gpus": 16, "cap_gpus": None, "weight": 1.0}
        tenant |= {"used_gpus": 8, "borrowed_gpus": 0, "queued": 3, "running": 2}
        return web.json_response({"tenants": [tenant]})

    async def canned(self, request: web.Request) -> web.Response:
        """Small answers for the read-only and node routes (enough to render)."""
        path = request.path
        if path.endswith("/explain"):
            return web.json_response({"id": request.match_info["id"], "state": "QUEUED", "candidates": []})
        node = {"id": request.match_info.get("id", "node-a"), "gpu_type": "v100", "gpus": 4, "running": []}
        if path.endswith("/drain"):
            return web.json_response(node | {"drained": True})
        if path.endswith("/undrain"):
            return web.json_response(node | {"drained": False})
        if path == "/api/v1/nodes":
            return web.json_response({"nodes": [node]})
        return web.json_response({"gpus": 4, "epoch": 1})

    # -- lifecycle

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_post("/api/v1/jobs", self.submit)
        app.router.add_get("/api/v1/jobs", self.jobs)
        app.router.add_get("/api/v1/jobs/{id}", self.job)
        app.router.add_get("/api/v1/jobs/{id}/logs", self.logs)
        app.router.add_post("/api/v1/jobs/{id}/cancel", self.cancel)
        app.router.add_post("/api/v1/tokens", self.tokens)
        app.router.add_get("/api/v1/tenants", self.tenants)
        app.router.add_get("/api/v1/jobs/{id}/explain", self.canned)
        app.router.add_get("/api/v1/nodes", self.canned)
        app.router.add_post("/api/v1/nodes/{id}/drain", self.canned)
        app.router.add_post("/api/v1/nodes/{id}/undrain", self.canned)
        app.router.add_get("/api/v1/cluster", self.canned)
        app.router.add_get("/broken", self.broken)
        app.router.add_get("/slow", self.slow)
        return app

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        async def setup() -> None:
            self._runner = web.AppRunner(self.app(), shutdown_timeout=1.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            host, port = self._runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(setup())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fake-master", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the fake master did not start"

    def stop(self) -> None:
        assert self._loop is not None and self._thread is not None and self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No real ~/.config/hopsmgr/client.toml and no HOPSMGR_URL/HOPSMGR_TOKEN from the caller."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.delenv("HOPSMGR_URL", raising=False)
    monkeypatch.delenv("HOPSMGR_TOKEN", raising=False)


@pytest.fixture
def master() -> Iterator[FakeMaster]:
    server = FakeMaster()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def refused_url() -> str:
    """A URL on which nothing listens (a port just bound and released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


Result = tuple[int, str, str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run `hopsmgr ARGV...` in-process: (exit status, stdout, stderr); argparse's SystemExit included."""

    def run(*argv: str) -> Result:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
