"""The master's HTTP API (aiohttp): routes, token auth, strict request validation, JSON views.

Every route but /healthz needs a bearer token. A token speaks for its user (hopsmgr.master.identity):
a user sees its own jobs in full and the rest of its tenant's queue without commands, environments or
logs; a tenant admin sees and cancels all of its tenant's jobs; an admin sees all; the cluster token
is good only for agent heartbeats. Bodies are limited in size and validated strictly
(unknown keys refused); every refusal is a JSON error naming the field, and nothing is stored.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from hopsmgr.core.lifecycle import JobState
from hopsmgr.master import heartbeats, identity, views
from hopsmgr.master.access import Principal
from hopsmgr.master.controller import Controller, RequestError
from hopsmgr.master.forecasts import Forecaster
from hopsmgr.master.metrics import prometheus_text
from hopsmgr.master.openapi import openapi_document
from hopsmgr.master.rounds import RoundLoop
from hopsmgr.master.schemas import MAX_LIMIT, MAX_TAIL, NODE_ID
from hopsmgr.master.store import StoreError
from hopsmgr.master.whatif import WhatIfs
from hopsmgr.protocol import (
    ID,
    JOB_ID_PATTERN,
    Submission,
    WireError,
    check_protocol,
    parse_drain_request,
    parse_heartbeat,
    parse_submission,
    parse_token_request,
    parse_user_request,
)

log = structlog.get_logger("hopsmgr.master")
MAX_BODY = 64 * 1024
CTL = web.AppKey("controller", Controller)
LOOP = web.AppKey("rounds", RoundLoop)
CLUSTER_TOKEN = web.AppKey("cluster_token", str)
FORECASTER = web.AppKey("forecaster", Forecaster)
WHAT_IFS = web.AppKey("what_ifs", WhatIfs)
PRINCIPALS = web.AppKey("principals", identity.PrincipalCache)
_DECIMAL = re.compile(r"-?[0-9]{1,12}")
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, field: str | None, message: str) -> web.Response:
    return web.json_response({"error": {"status": status, "field": field, "message": message}}, status=status)


# the query parameters each operation takes (the OpenAPI document lists the same); any other is refused
QUERY_PARAMETERS: dict[str, frozenset[str]] = {
    "/api/v1/jobs": frozenset({"state", "tenant", "user", "limit"}),
    "/api/v1/jobs/{job}/logs": frozenset({"tail"}),
    "/api/v1/jobs/{job}/explain": frozenset({"gpus"}),
}
TOKEN_ID = "[0-9a-f]{16}"


def check_query(request: web.Request) -> None:
    route = request.match_info.route.resource
    known = QUERY_PARAMETERS.get(route.canonical, frozenset()) if route is not None else frozenset()
    for name in request.query:
        if name not in known:
            takes = f"(it takes: {', '.join(sorted(known))})" if known else "(it takes none)"
            raise RequestError(400, name or "query", f"unknown query parameter {name[:40]!r} {takes}")


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        check_query(request)
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, exc.field, exc.message)
    except WireError as exc:
        return error_response(409 if exc.field == "protocol" else 400, exc.field, exc.message)
    except StoreError as exc:
        return error_response(503, None, f"the master cannot write its state: {exc}")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, None, exc.reason)
        raise
    except Exception as exc:  # a bug: answer in the documented shape, log it, keep serving
        log.exception("request_failed", path=request.path, error=repr(exc))
        return error_response(500, None, "internal error (logged by the master)")


def principal(request: web.Request, *, agent: bool = False) -> Principal:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise RequestError(401, "Authorization", "missing bearer token (Authorization: Bearer <token>)")
    token = token.strip()
    if not (token.isascii() and token.isprintable()):
        raise RequestError(401, "Authorization", "malformed bearer token")
    if agent:
        if secrets.compare_digest(token.encode(), request.app[CLUSTER_TOKEN].encode()):
            return Principal("agent", "", agent=True)
        raise RequestError(401, "Authorization", "not the cluster token")
    who = request.app[PRINCIPALS].lookup(request.app[CTL].store, token)
    if who is None:
        raise RequestError(401, "Authorization", "unknown token")
    return who


def admin(request: web.Request) -> Principal:
    who = principal(request)
    if not who.admin:
        raise RequestError(403, None, "this needs an admin token")
    return who


async def body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise RequestError(413, None, f"request body larger than {MAX_BODY} bytes")
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise RequestError(413, None, f"request body larger than {MAX_BODY} bytes")
    try:
        return json.loads(raw or b"{}")
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, huge integers, deep nesting
        raise RequestError(400, None, f"body is not valid JSON: {str(exc)[:200]}") from None


async def no_body(request: web.Request) -> None:
    """An operation that takes no body: none, or an empty JSON object ({}, what the CLI sends)."""
    if await body(request) != {}:
        raise RequestError(400, None, "this operation takes no body (or an empty JSON object)")


def job_id(request: web.Request) -> str:
    value = request.match_info["job"]
    if not re.fullmatch(JOB_ID_PATTERN, value):
        raise RequestError(400, "id", f"not a job id (j-NNNNNN): {value[:80]!r}")
    return value


def node_id(request: web.Request) -> str:
    value = request.match_info["node"]
    try:
        return NODE_ID.check(value, "node")
    except WireError as exc:
        raise RequestError(400, "node", f"not a node id: {exc.message}") from None


def _int_param(request: web.Request, name: str, default: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not _DECIMAL.fullmatch(text):  # int() would also take " 5", "5_0" and other scripts' digits
        raise RequestError(400, name, f"must be an integer, got {text[:40]!r}")
    value = int(text)
    if not 1 <= value <= high:
        raise RequestError(400, name, f"must be in [1, {high}], got {value}")
    return value


# -- handlers --------------------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    ctl, loop = request.app[CTL], request.app[LOOP]
    leader = {**ctl.leader, "first_plan": loop.first_plan_at} if ctl.leader else None
    return web.json_response({"status": "ok", "epoch": ctl.epoch, "role": "leader", "leader": leader})


def _run_as(ctl: Controller, who: Principal, sub: Submission) -> str:
    """The account `who`'s jobs run as; a 422 for memory or CPU limits where none would enforce them."""
    run_as = identity.run_as(ctl.store, ctl.config, who)
    if not run_as and (sub.mem_mb is not None or sub.cpus is not None):
        field = "mem_mb" if sub.mem_mb is not None else "cpus"
        raise RequestError(
            422,
            field,
            "memory and CPU limits are enforced only where jobs run as their users "
            "([master] run_as_users = true, docs/security.md)",
        )
    return run_as


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    sub = parse_submission(await body(request))
    ctl = request.app[CTL]
    row = await ctl.submit(who, sub, _run_as(ctl, who, sub))
    return web.json_response(views.job_summary(ctl, row), status=201)


async def list_jobs(request: web.Request) -> web.Response:
    who = principal(request)
    states = request.query.getall("state", [])
    for s in states:
        if s not in JobState.__members__:
            raise RequestError(
                400, "state", f"unknown state {s[:40]!r} (known: {', '.join(JobState.__members__)})"
            )
    tenant, user = request.query.get("tenant"), request.query.get("user")
    for key, value in (("tenant", tenant), ("user", user)):
        if value is not None:
            ID.check(value, key)
    if not who.admin:
        if tenant is not None and tenant != who.tenant:
            raise RequestError(403, "tenant", f"user {who.user!r} cannot list tenant {tenant[:64]!r}")
        tenant = who.tenant
    ctl = request.app[CTL]
    rows = ctl.store.jobs(
        states=states,
        tenant=tenant,
        user=user,
        limit=_int_param(request, "limit", 1000, MAX_LIMIT),
    )
    if not rows and who.admin:  # an empty list must mean "no such jobs", not a misspelt name
        known = ctl.state.tenants
        if tenant is not None and tenant not in known:
            raise RequestError(
                404, "tenant", f"unknown tenant {tenant!r} (known: {', '.join(sorted(known))})"
            )
        if user is not None and ctl.store.user(user) is None:
            raise RequestError(404, "user", f"unknown user {user!r}")
    ctx = views.wait_context(ctl)
    return web.json_response(
        {"jobs": [views.job_summary(ctl, r, ctx, redact=not who.acts_for(r)) for r in rows]}
    )


async def show_job(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    return web.json_response(views.job_detail(ctl, row))


async def cancel_job(request: web.Request) -> web.Response:
    who = principal(request)
    ctl = request.app[CTL]
    jid = job_id(request)
    await ctl.cancel(who, jid)
    return web.json_response(views.job_summary(ctl, ctl.visible(Principal("", "", admin=True), jid)))


async def job_logs(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    tail = _int_param(request, "tail", ctl.settings.log_tail_bytes, MAX_TAIL)
    attempt, text = await views.latest_log(ctl, row, tail)
    return web.json_response({"id": row["id"], "attempt": attempt, "log": text})


async def explain_job(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    doc = views.explain(ctl, row)
    gpus = request.query.get("gpus")
    if gpus is not None:  # what if it asked for these GPU counts instead
        doc["what_if"] = await request.app[WHAT_IFS].other_gpus(row["id"], gpus)
    return web.json_response(doc)


async def dry_run(request: web.Request) -> web.Response:
    """The forecast of a job as if submitted now: checked as a submission, nothing stored."""
    who = principal(request)
    sub = parse_submission(await body(request))
    _run_as(request.app[CTL], who, sub)  # refused as a submission would be
    return web.json_response(await request.app[WHAT_IFS].dry_run(who, sub))


NODES_PER_SLICE = 100  # a listing of 1,000 nodes is built in slices, the loop serving others between


async def list_nodes(request: web.Request) -> web.Response:
    """Every node; built and encoded in slices (each node's view is of one moment, not all of them)."""
    principal(request)
    ctl = request.app[CTL]
    nodes = list(ctl.state.nodes.values())
    parts = []
    for start in range(0, len(nodes), NODES_PER_SLICE):
        views_ = [views.node_view(ctl, n) for n in nodes[start : start + NODES_PER_SLICE]]
        parts.append(json.dumps(views_)[1:-1])
        await asyncio.sleep(0)
    text = '{"nodes": [' + ", ".join(p for p in parts if p) + "]}"
    return web.Response(text=text, content_type="application/json")


async def show_node(request: web.Request) -> web.Response:
    principal(request)
    ctl = request.app[CTL]
    name = node_id(request)
    node = ctl.state.nodes.get(name)
    if node is None:
        raise RequestError(404, "node", f"no node {name!r}")
    return web.json_response(views.node_view(ctl, node))


def _drain(drained: bool) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        admin(request)
        ctl = request.app[CTL]
        if drained:
            reason = parse_drain_request(await body(request)).reason
        else:
            await no_body(request)
            reason = ""
        node = await heartbeats.set_drained(ctl, node_id(request), drained, reason)
        return web.json_response(views.node_view(ctl, node))

    return handler


async def calibrate_node(request: web.Request) -> web.Response:
    admin(request)
    await no_body(request)
    ctl = request.app[CTL]
    node = heartbeats.request_calibration(ctl, node_id(request))
    return web.json_response({**views.node_view(ctl, node), "calibration_requested": True})


async def tenants(request: web.Request) -> web.Response:
    who = principal(request)
    ctl = request.app[CTL]
    rows = [
        views.tenant_view(ctl, name) for name in sorted(ctl.state.tenants) if who.admin or name == who.tenant
    ]
    return web.json_response({"tenants": rows})


async def cluster(request: web.Request) -> web.Response:
    principal(request)
    return web.json_response(views.cluster_view(request.app[CTL], request.app[LOOP]))


async def create_token(request: web.Request) -> web.Response:
    who = principal(request)
    req = parse_token_request(await body(request))
    ctl = request.app[CTL]
    doc = identity.create_token(ctl.store, ctl.config, who, req, ctl.clock())
    return web.json_response(doc, status=201)


def _token_id(request: web.Request) -> str:
    value = request.match_info["token"]
    if not re.fullmatch(TOKEN_ID, value):
        raise RequestError(400, "token", f"not a token id (16 hex digits, see token list): {value[:40]!r}")
    return value


def _user_name(request: web.Request) -> str:
    value = request.match_info["user"]
    try:
        return ID.check(value, "user")
    except WireError as exc:
        raise RequestError(400, "user", f"not a user name: {exc.message}") from None


async def list_tokens(request: web.Request) -> web.Response:
    who = principal(request)
    return web.json_response({"tokens": identity.list_tokens(request.app[CTL].store, who)})


async def revoke_token(request: web.Request) -> web.Response:
    who = principal(request)
    ctl = request.app[CTL]
    request.app[PRINCIPALS].clear()
    return web.json_response(identity.revoke_token(ctl.store, who, _token_id(request)))


async def list_users(request: web.Request) -> web.Response:
    who = principal(request)
    return web.json_response({"users": identity.list_users(request.app[CTL].store, who)})


async def add_user(request: web.Request) -> web.Response:
    who = principal(request)
    req = parse_user_request(await body(request), new=True)
    ctl = request.app[CTL]
    row = identity.add_user(ctl.store, ctl.config, who, req, ctl.clock())
    return web.json_response(identity.user_view(row, ctl.store), status=201)


async def show_user(request: web.Request) -> web.Response:
    who = principal(request)
    return web.json_response(identity.show_user(request.app[CTL].store, who, _user_name(request)))


async def set_user(request: web.Request) -> web.Response:
    who = principal(request)
    name = _user_name(request)
    req = parse_user_request(await body(request), new=False)
    ctl = request.app[CTL]
    request.app[PRINCIPALS].clear()
    row = identity.set_user(ctl.store, ctl.config, who, name, req, ctl.clock())
    return web.json_response(identity.user_view(row, ctl.store))


async def remove_user(request: web.Request) -> web.Response:
    who = principal(request)
    ctl = request.app[CTL]
    request.app[PRINCIPALS].clear()
    return web.json_response(identity.remove_user(ctl.store, who, _user_name(request)))


async def heartbeat(request: web.Request) -> web.Response:
    principal(request, agent=True)
    raw = await body(request)
    if isinstance(raw, dict):
        check_protocol(raw)
    ctl = request.app[CTL]
    reply = heartbeats.answer(ctl, parse_heartbeat(raw))
    return web.json_response(reply.to_json())


async def metrics(request: web.Request) -> web.Response:
    principal(request)
    text = prometheus_text(request.app[CTL], request.app[LOOP])
    return web.Response(text=text, headers={"Content-Type": PROMETHEUS_TEXT})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def make_app(ctl: Controller, loop: RoundLoop, cluster_token: str, forecaster: Forecaster) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[CTL] = ctl
    app[LOOP] = loop
    app[PRINCIPALS] = identity.PrincipalCache()
    app[CLUSTER_TOKEN] = cluster_token
    app[FORECASTER] = forecaster
    app[WHAT_IFS] = WhatIfs(ctl, forecaster)
    r = app.router
    r.add_get("/healthz", healthz)
    r.add_get("/metrics", metrics)
    r.add_get("/api/v1/openapi.json", openapi)
    r.add_post("/api/v1/jobs", submit)
    r.add_get("/api/v1/jobs", list_jobs)
    r.add_get("/api/v1/jobs/{job}", show_job)
    r.add_post("/api/v1/jobs/{job}/cancel", cancel_job)
    r.add_get("/api/v1/jobs/{job}/logs", job_logs)
    r.add_get("/api/v1/jobs/{job}/explain", explain_job)
    r.add_post("/api/v1/forecasts", dry_run)
    r.add_get("/api/v1/nodes", list_nodes)
    r.add_get("/api/v1/nodes/{node}", show_node)
    r.add_post("/api/v1/nodes/{node}/drain", _drain(True))
    r.add_post("/api/v1/nodes/{node}/undrain", _drain(False))
    r.add_post("/api/v1/nodes/{node}/calibrate", calibrate_node)
    r.add_get("/api/v1/tenants", tenants)
    r.add_get("/api/v1/cluster", cluster)
    r.add_post("/api/v1/tokens", create_token)
    r.add_get("/api/v1/tokens", list_tokens)
    r.add_delete("/api/v1/tokens/{token}", revoke_token)
    r.add_get("/api/v1/users", list_users)
    r.add_post("/api/v1/users", add_user)
    r.add_get("/api/v1/users/{user}", show_user)
    r.add_post("/api/v1/users/{user}", set_user)
    r.add_delete("/api/v1/users/{user}", remove_user)
    r.add_post("/api/v1/agents/heartbeat", heartbeat)
    return app
