"""What a standby master answers while another leads (PostgreSQL store): /healthz and the API document,
and for every other route a 503 that names the leader, so agents and the CLI switch to it.

The answer is the API's error shape plus `leader` (the leader's URL, or null while none is known) and the
header `X-Hopsmgr-Leader`; nothing is read from the request body and nothing is stored. The leader is
read from the store (meta `leader`, written by each new leader) at most once a second. The master
process (hopsmgr.master.server) is seen as a `StandbyMaster`: its store and its advertised URL.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from hopsmgr.master.leader import LeaderInfo, read_leader
from hopsmgr.master.openapi import openapi_document
from hopsmgr.master.store import Store

LEADER_HEADER = "X-Hopsmgr-Leader"


class StandbyMaster(Protocol):
    """What a standby's answers use of the master process."""

    @property
    def store(self) -> Store | None: ...

    def advertised(self) -> str: ...


class LeaderCache:
    def __init__(self, master: StandbyMaster) -> None:
        self.master = master
        self.read_at = 0.0
        self.info: LeaderInfo | None = None

    def get(self) -> LeaderInfo | None:
        now = time.monotonic()
        if now - self.read_at >= 1.0 and self.master.store is not None:
            self.read_at = now
            self.info = read_leader(self.master.store)
        return self.info


CACHE = web.AppKey("leader_cache", LeaderCache)


def leader_json(info: LeaderInfo | None) -> dict[str, Any] | None:
    return None if info is None else {**info.to_json(), "first_plan": None}


async def healthz(request: web.Request) -> web.Response:
    info = request.app[CACHE].get()
    body = {
        "status": "ok",
        "epoch": info.epoch if info else 0,
        "role": "standby",
        "leader": leader_json(info),
    }
    return web.json_response(body)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def elsewhere(request: web.Request) -> web.Response:
    info = request.app[CACHE].get()
    me = request.app[CACHE].master.advertised()
    if info is None or info.url == me:
        message = f"this master ({me}) is a standby and no leader is known yet: retry shortly"
        headers = {}
    else:
        message = f"this master ({me}) is a standby: the leader is {info.url}"
        headers = {LEADER_HEADER: info.url}
    body = {
        "error": {"status": 503, "field": None, "message": message},
        "leader": info.url if info is not None and info.url != me else None,
    }
    return web.json_response(body, status=503, headers={**headers, "Retry-After": "1"})


def make_standby_app(master: StandbyMaster) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[CACHE] = LeaderCache(master)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/openapi.json", openapi)
    app.router.add_route("*", "/{tail:.*}", elsewhere)
    return app
