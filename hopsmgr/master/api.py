"""The master's HTTP API (aiohttp): routes, token auth, strict request validation, JSON views.

Every route but /healthz needs a bearer token; users see only their tenant's jobs, admins see all, the
cluster token is good only for agent heartbeats. Bodies are limited in size and validated strictly
(unknown keys refused); every refusal is a JSON error naming the field, and nothing is stored.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from hopsmgr.core.lifecycle import JobState
from hopsmgr.master import views
from hopsmgr.master.controller import Controller, Principal, RequestError, Submission
from hopsmgr.master.metrics import prometheus_text
from hopsmgr.master.openapi import openapi_document
from hopsmgr.master.rounds import RoundLoop
from hopsmgr.master.store import StoreError
from hopsmgr.protocol import (
    ID_RE,
    WireError,
    array,
    boolean,
    check_protocol,
    integer,
    number,
    parse_heartbeat,
    string,
    table,
)

log = structlog.get_logger("hopsmgr.master")
MAX_BODY = 64 * 1024
CTL = web.AppKey("controller", Controller)
LOOP = web.AppKey("rounds", RoundLoop)
CLUSTER_TOKEN = web.AppKey("cluster_token", str)
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SUBMIT_KEYS = (
    "command",
    "gpus",
    "batch_size",
    "iterations",
    "samples",
    "name",
    "tenant",
    "params",
    "workdir",
    "env",
    "launcher",
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, field: str | None, message: str) -> web.Response:
    return web.json_response({"error": {"status": status, "field": field, "message": message}}, status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
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
    row = request.app[CTL].store.find_token(token)
    if row is None:
        raise RequestError(401, "Authorization", "unknown token")
    return Principal(row["user"], row["tenant"], bool(row["admin"]))


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


def parse_submission(raw: Any) -> Submission:
    doc = table(raw, "", _SUBMIT_KEYS, ("command", "gpus", "batch_size"))
    command = [string(a, f"command[{i}]") for i, a in enumerate(array(doc["command"], "command", 1024))]
    if not command or not command[0]:
        raise WireError("command", "must name a program (a non-empty first item)")
    gpus = [integer(g, f"gpus[{i}]", 1, 4096) for i, g in enumerate(array(doc["gpus"], "gpus", 64))]
    if not gpus:
        raise WireError("gpus", "must list at least one GPU count")
    if len(set(gpus)) != len(gpus):
        raise WireError("gpus", f"must not repeat a count, got {gpus}")
    has_iters, has_samples = "iterations" in doc, "samples" in doc
    if has_iters == has_samples:
        raise WireError("iterations", "give exactly one of iterations and samples")
    env_raw = table(doc.get("env", {}), "env", tuple(doc.get("env", {}) or {}))
    if len(env_raw) > 256:
        raise WireError("env", f"at most 256 variables, got {len(env_raw)}")
    env = {string(k, "env", pattern=_ENV_KEY): string(v, f"env.{k}") for k, v in env_raw.items()}
    reserved = [k for k in env if k.startswith("HOPS_") or k == "CUDA_VISIBLE_DEVICES"]
    if reserved:
        raise WireError(f"env.{reserved[0]}", "is set by hopsmgr and cannot be given")
    workdir = string(doc.get("workdir", ""), "workdir", max_len=1024)
    if workdir and (not workdir.startswith("/") or "/../" in workdir + "/"):
        raise WireError("workdir", f"must be an absolute path without '..', got {workdir!r}")
    launcher = string(doc.get("launcher", "plain"), "launcher", pattern=re.compile("plain|torchrun"))
    name = string(doc.get("name", command[0].rsplit("/", 1)[-1]), "name", max_len=128)
    tenant = doc.get("tenant")
    return Submission(
        command=tuple(command),
        gpus=tuple(gpus),
        batch_size=integer(doc["batch_size"], "batch_size", 1, 1 << 24),
        iterations=_work(doc, "iterations") if has_iters else None,
        samples=_work(doc, "samples") if has_samples else None,
        name=name,
        tenant=None if tenant is None else string(tenant, "tenant", pattern=ID_RE),
        params=_bounded(number(doc.get("params", 0), "params", 0.0), "params", MAX_PARAMS),
        workdir=workdir,
        env=env,
        launcher=launcher,
    )


MAX_WORK = 1e15  # iterations or samples: far above any real job, far below float overflow
MAX_PARAMS = 1e13


def _bounded(value: float, field: str, high: float) -> float:
    if value > high:
        raise WireError(field, f"must be <= {high:g}, got {value:g}")
    return value


def _work(doc: Any, field: str) -> float:
    return _bounded(number(doc[field], field, positive=True), field, MAX_WORK)


def job_id(request: web.Request) -> str:
    value = request.match_info["job"]
    if not ID_RE.fullmatch(value):
        raise RequestError(400, "id", f"not a job id: {value[:80]!r}")
    return value


def _int_param(request: web.Request, name: str, default: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise RequestError(400, name, f"must be an integer, got {text[:40]!r}") from None
    if not 1 <= value <= high:
        raise RequestError(400, name, f"must be in [1, {high}], got {value}")
    return value


# -- handlers --------------------------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "epoch": request.app[CTL].epoch})


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    sub = parse_submission(await body(request))
    ctl = request.app[CTL]
    job = await ctl.submit(who, sub)
    return web.json_response(views.job_summary(ctl, views.row_of(job)), status=201)


async def list_jobs(request: web.Request) -> web.Response:
    who = principal(request)
    states = request.query.getall("state", [])
    for s in states:
        if s not in JobState.__members__:
            raise RequestError(
                400, "state", f"unknown state {s[:40]!r} (known: {', '.join(JobState.__members__)})"
            )
    tenant = request.query.get("tenant")
    if not who.admin:
        if tenant is not None and tenant != who.tenant:
            raise RequestError(403, "tenant", f"user {who.user!r} cannot list tenant {tenant[:64]!r}")
        tenant = who.tenant
    ctl = request.app[CTL]
    rows = ctl.store.jobs(
        states=states,
        tenant=tenant,
        user=request.query.get("user"),
        limit=_int_param(request, "limit", 1000, 100_000),
    )
    ctx = views.wait_context(ctl)
    return web.json_response({"jobs": [views.job_summary(ctl, r, ctx) for r in rows]})


async def show_job(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    return web.json_response(views.job_detail(ctl, row))


async def cancel_job(request: web.Request) -> web.Response:
    who = principal(request)
    ctl = request.app[CTL]
    jid = job_id(request)
    ctl.cancel(who, jid)
    return web.json_response(views.job_summary(ctl, ctl.visible(Principal("", "", admin=True), jid)))


async def job_logs(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    tail = _int_param(request, "tail", ctl.settings.log_tail_bytes, 1 << 20)
    attempt, text = await views.latest_log(ctl, row, tail)
    return web.json_response({"id": row["id"], "attempt": attempt, "log": text})


async def explain_job(request: web.Request) -> web.Response:
    ctl = request.app[CTL]
    row = ctl.visible(principal(request), job_id(request))
    return web.json_response(views.explain(ctl, row))


async def list_nodes(request: web.Request) -> web.Response:
    principal(request)
    ctl = request.app[CTL]
    return web.json_response({"nodes": [views.node_view(ctl, n) for n in ctl.state.nodes.values()]})


async def show_node(request: web.Request) -> web.Response:
    principal(request)
    ctl = request.app[CTL]
    node = ctl.state.nodes.get(request.match_info["node"])
    if node is None:
        raise RequestError(404, "node", f"no node {request.match_info['node'][:64]!r}")
    return web.json_response(views.node_view(ctl, node))


def _drain(drained: bool) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        admin(request)
        ctl = request.app[CTL]
        return web.json_response(views.node_view(ctl, ctl.set_drained(request.match_info["node"], drained)))

    return handler


async def calibrate_node(request: web.Request) -> web.Response:
    admin(request)
    ctl = request.app[CTL]
    node = ctl.request_calibration(request.match_info["node"])
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
    admin(request)
    doc = table(await body(request), "", ("user", "tenant", "admin"), ("user", "tenant"))
    user = string(doc["user"], "user", pattern=ID_RE)
    tenant = string(doc["tenant"], "tenant", pattern=ID_RE)
    is_admin = boolean(doc.get("admin", False), "admin")
    ctl = request.app[CTL]
    if tenant not in ctl.state.tenants:
        raise RequestError(
            422, "tenant", f"unknown tenant {tenant!r} (known: {', '.join(sorted(ctl.state.tenants))})"
        )
    token = secrets.token_urlsafe(32)
    ctl.store.add_token(token, user, tenant, is_admin, ctl.clock())
    return web.json_response({"token": token, "user": user, "tenant": tenant, "admin": is_admin}, status=201)


async def heartbeat(request: web.Request) -> web.Response:
    principal(request, agent=True)
    raw = await body(request)
    if isinstance(raw, dict):
        check_protocol(raw)
    ctl = request.app[CTL]
    reply = ctl.heartbeat(parse_heartbeat(raw))
    await ctl.durable()  # acks only once what they acknowledge is on disk
    return web.json_response(reply.to_json())


async def metrics(request: web.Request) -> web.Response:
    principal(request)
    text = prometheus_text(request.app[CTL], request.app[LOOP])
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def make_app(ctl: Controller, loop: RoundLoop, cluster_token: str) -> web.Application:
    app = web.Application(middlewares=[errors], client_max_size=MAX_BODY)
    app[CTL] = ctl
    app[LOOP] = loop
    app[CLUSTER_TOKEN] = cluster_token
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
    r.add_get("/api/v1/nodes", list_nodes)
    r.add_get("/api/v1/nodes/{node}", show_node)
    r.add_post("/api/v1/nodes/{node}/drain", _drain(True))
    r.add_post("/api/v1/nodes/{node}/undrain", _drain(False))
    r.add_post("/api/v1/nodes/{node}/calibrate", calibrate_node)
    r.add_get("/api/v1/tenants", tenants)
    r.add_get("/api/v1/cluster", cluster)
    r.add_post("/api/v1/tokens", create_token)
    r.add_post("/api/v1/agents/heartbeat", heartbeat)
    return app
