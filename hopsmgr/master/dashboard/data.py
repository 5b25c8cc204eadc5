"""What each dashboard page shows, fetched through the master's own API handlers.

The dashboard never decides what a token may see: every read goes to the API's handler for that route
(routed by the app's own router, so it is the very code `/api/v1/...` runs), on a copy of the browser's
request that carries the session's token as `Authorization: Bearer`. What the API refuses, the page does
not show; what the API hides from a token, the page cannot show.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from hopsmgr.master.access import Principal
from hopsmgr.master.api import CTL, LOOP, principal
from hopsmgr.master.controller import Controller, RequestError
from hopsmgr.master.dashboard.render import WAITING
from hopsmgr.protocol import WireError

LIVE = (*WAITING, "LAUNCHING", "RUNNING", "CHECKPOINTING")
EXPLAINED = 50  # queue rows that get the reason they wait (one explain call each)


class Refused(Exception):
    """The API refused a dashboard read or action: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Api:
    """The API as one token sees it, called in-process from a dashboard request."""

    def __init__(self, request: web.Request, token: str) -> None:
        self.request = request
        self.token = token
        self.app = request.app

    @property
    def ctl(self) -> Controller:
        return self.app[CTL]

    def _clone(self, method: str, path: str) -> web.Request:
        return self.request.clone(
            method=method, rel_url=path, headers={"Authorization": f"Bearer {self.token}"}
        )

    def who(self) -> Principal:
        try:
            return principal(self._clone("GET", "/api/v1/cluster"))
        except RequestError as exc:
            raise Refused(exc.status, exc.message) from None

    async def call(self, method: str, path: str) -> Any:
        """The JSON answer of the API's own handler for `method path`, routed as aiohttp routes it."""
        request = self._clone(method, path)
        match = await self.app.router.resolve(request)
        if match.http_exception is not None or not path.startswith("/api/"):
            raise Refused(404, f"the API serves no {method} {path}")
        match.add_app(self.app)
        match.freeze()
        request._match_info = match  # what aiohttp's own dispatch does before it calls the handler
        try:
            response = await match.handler(request)
        except RequestError as exc:
            raise Refused(exc.status, exc.message) from None
        except WireError as exc:
            raise Refused(400, exc.message) from None
        if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
            raise Refused(500, f"the API's answer to {method} {path} is not JSON")
        return json.loads(response.body)

    async def get(self, path: str) -> Any:
        return await self.call("GET", path)


def _states(states: tuple[str, ...]) -> str:
    return "&".join(f"state={s}" for s in states)


async def cluster_page(api: Api) -> dict[str, Any]:
    nodes = (await api.get("/api/v1/nodes"))["nodes"]
    jobs = (await api.get(f"/api/v1/jobs?{_states(LIVE)}"))["jobs"]
    summary = await api.get("/api/v1/cluster")
    tenants = (await api.get("/api/v1/tenants"))["tenants"]
    return {"nodes": nodes, "jobs": {j["id"]: j for j in jobs}, "cluster": summary, "tenants": tenants}


async def queue_page(api: Api) -> dict[str, Any]:
    jobs = (await api.get(f"/api/v1/jobs?{_states(WAITING)}"))["jobs"]
    jobs.sort(key=lambda j: (j["position"] is None, j["position"] or 0, j["submitted"]))
    reasons: dict[str, str] = {}
    for job in jobs[:EXPLAINED]:
        explained = await api.get(f"/api/v1/jobs/{job['id']}/explain")
        reasons[job["id"]] = wait_reason(job, explained)
    return {"jobs": jobs, "reasons": reasons}


def wait_reason(job: dict[str, Any], explained: dict[str, Any]) -> str:
    """One line on why a waiting job does not run now, from its explanation."""
    state = job["state"]
    if state == "PENDING":
        return "waiting for a GPU to profile on"
    if state == "PROFILING":
        return "being profiled"
    if explained.get("unplaceable"):
        return str(explained["unplaceable"])
    if explained.get("in_window") is False:
        return f"behind the service window ({explained.get('window')} jobs, running ones included)"
    quota = explained.get("quota") or {}
    cap = quota.get("cap_gpus")
    if cap is not None and quota.get("used_gpus", 0) + min(job["gpus"]) > cap:
        return f"tenant {quota.get('name')} is at its cap of {cap} GPUs"
    if explained.get("note"):
        return str(explained["note"])
    if explained.get("round") is None:
        return "no plan yet"
    return "higher-priority jobs hold the GPUs it fits"


async def job_page(api: Api, job_id: str) -> dict[str, Any]:
    detail = await api.get(f"/api/v1/jobs/{job_id}")
    logs = await api.get(f"/api/v1/jobs/{job_id}/logs?tail=6000")
    explained = await api.get(f"/api/v1/jobs/{job_id}/explain")
    return {"job": detail, "logs": logs, "explain": explained}


async def tenants_page(api: Api) -> dict[str, Any]:
    return {"tenants": (await api.get("/api/v1/tenants"))["tenants"]}


async def scheduler_page(api: Api) -> dict[str, Any]:
    summary = await api.get("/api/v1/cluster")
    rounds = api.ctl.store.rounds(200)
    loop = api.app[LOOP]
    return {"cluster": summary, "rounds": rounds, "rounds_total": loop.rounds}
