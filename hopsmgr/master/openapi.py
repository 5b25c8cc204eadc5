"""The OpenAPI 3.1 document of the master (served at /api/v1/openapi.json), generated from the schemas.

Request bodies come from the very `hopsmgr.protocol` schemas the API validates with; answers from the
schemas below, which tests check real answers against. Path and query parameters carry the patterns
and bounds `hopsmgr.master.api` enforces; /metrics is Prometheus text; `links` chain a submission to
showing, cancelling, explaining and reading the logs of the job it created.
tests/integration check that every route of the app is described here and every described route exists.
"""

from __future__ import annotations

from typing import Any

from hopsmgr import __version__
from hopsmgr.core.lifecycle import JobState
from hopsmgr.master.state import NodeHealth
from hopsmgr.protocol import (
    ATTEMPT_ID_PATTERN,
    DRAIN_REQUEST,
    HEARTBEAT,
    HEARTBEAT_REPLY,
    ID,
    JOB_ID_PATTERN,
    NEW_USER,
    ROLES,
    SUBMISSION,
    TOKEN_REQUEST,
    USER_CHANGE,
)
from hopsmgr.schema import Anything, Arr, Bool, Int, JsonSchema, Map, Nullable, Num, Obj, Spec, Str

NODE_ID_PATTERN = "[A-Za-z0-9_.-]{1,64}"
MAX_LIMIT = 100_000
GPUS_PATTERN = r"[0-9]{1,4}(,[0-9]{1,4}){0,63}"  # explain's what-if GPU counts: "2,4"
MAX_TAIL = 1 << 20
TEXT = Str(max_len=1 << 24, replace_nul=True)
MANY = 1 << 20
STATES = Str(enum=tuple(s.value for s in JobState))
HEALTH_STATES = Str(enum=(NodeHealth.HEALTHY, NodeHealth.SUSPECT, NodeHealth.LOST, NodeHealth.UNKNOWN))
JOB_ID = Str(max_len=16, pattern=JOB_ID_PATTERN)
NODE_ID = Str(max_len=64, pattern=NODE_ID_PATTERN)
ATTEMPT_ID = Str(max_len=16, pattern=ATTEMPT_ID_PATTERN)
COUNT = Int(0)
PLACEMENT = Map(Int(1), keys=NODE_ID, max_items=MANY, description="GPUs on each node")


def answer(title: str, fields: dict[str, Spec]) -> Obj:
    """An answer's schema: every key is always present."""
    return Obj(title, fields, required=tuple(fields))


ERROR = answer(
    "Error",
    {"error": answer("ErrorBody", {"status": Int(400, 599), "field": Nullable(TEXT), "message": TEXT})},
)
FORECAST = Nullable(
    answer(
        "Forecast",
        {
            **{f"{what}_{q}": Nullable(Num()) for what in ("start", "finish") for q in ("p10", "p50", "p90")},
            "futures": COUNT,
            "made": Num(),
            "horizon": Nullable(
                Num(description="how far the futures looked: a null quantile says not before this")
            ),
            "start_within": Nullable(
                Num(0.0, 1.0, description="share of the futures that started the job within the horizon")
            ),
        },
    )
)
JOB_SUMMARY_FIELDS: dict[str, Spec] = {
    "id": JOB_ID,
    "name": TEXT,
    "tenant": ID,
    "user": TEXT,
    "state": STATES,
    "gpus": Arr(Int(1), 64),
    "submitted": Num(),
    "placement": Nullable(PLACEMENT),
    "position": Nullable(Int(1)),
    "priority": Nullable(Num()),
    "latency_ratio": Nullable(Num()),
    "est_wait_s": Nullable(Num(0.0)),
    "progress": Num(0.0, 1.0),
    "restarts": COUNT,
    "reason": Nullable(TEXT),
    "forecast": FORECAST,
}
JOB_SUMMARY = answer("JobSummary", JOB_SUMMARY_FIELDS)
ATTEMPT = answer(
    "Attempt",
    {
        "id": ATTEMPT_ID,
        "placement": PLACEMENT,
        "devices": Map(Arr(Int(0), 64), keys=NODE_ID, max_items=MANY),
        "profiling": Bool(),
        "started": Nullable(Num()),
        "ended": Nullable(Num()),
        "end_reason": Nullable(TEXT),
        "exit_code": Nullable(Int()),
    },
)
EVENT = answer(
    "JobEvent", {"time": Num(), "kind": TEXT, "state": Nullable(STATES), "message": Nullable(TEXT)}
)
THROUGHPUT = answer(
    "Throughput",
    {
        "placement": PLACEMENT,
        "measurements": Int(1, description="throughput measurements taken on this placement"),
        "measured_last": Num(description="samples/s, the latest measurement"),
        "measured_mean": Num(description="samples/s, the mean of the measurements"),
        "expected_last": Nullable(
            Num(description="samples/s the estimator expected just before the latest measurement")
        ),
        "estimate_now": Nullable(Num(description="samples/s the estimator expects now (live jobs only)")),
    },
)
JOB_DETAIL = answer(
    "JobDetail",
    {
        **JOB_SUMMARY_FIELDS,
        "command": Arr(TEXT, 1024),
        "env": Map(TEXT, keys=Str(max_len=128), max_items=256),
        "workdir": TEXT,
        "launcher": Str(enum=("plain", "torchrun")),
        "one_server": Bool(description="every placement on one server (submitted with one_server)"),
        "run_as": Str(max_len=32, description="the Unix account it runs as ('' : the nodes' own)"),
        "mem_mb": Nullable(Int(1)),
        "cpus": Nullable(Num()),
        "batch_size": Int(1),
        "total_samples": Num(),
        "done_samples": Num(),
        "counters": answer(
            "Counters", {k: COUNT for k in ("restarts", "preemptions", "node_losses", "failures")}
        ),
        "history": Arr(EVENT, MANY),
        "attempts": Arr(ATTEMPT, MANY),
        "throughput": Arr(THROUGHPUT, MANY),
    },
)
JOB_LIST = answer("JobList", {"jobs": Arr(JOB_SUMMARY, MAX_LIMIT)})
LOGS = answer("JobLogs", {"id": JOB_ID, "attempt": Nullable(ATTEMPT_ID), "log": TEXT})
TENANT_FIELDS: dict[str, Spec] = {
    "name": ID,
    "tenant": ID,
    "guaranteed_gpus": COUNT,
    "cap_gpus": Nullable(COUNT),
    "weight": Num(),
    "used_gpus": COUNT,
    "borrowed_gpus": COUNT,
    "queued": COUNT,
    "running": COUNT,
    "usage_ref_gpu_h": Num(description="decayed use in reference-GPU-hours (fair share)"),
    "usage_share": Num(description="share of all tenants' decayed use, 0-1"),
    "fairshare_factor": Num(description="multiplies the tenant's weight in job priorities"),
    "usage_history": Arr(
        answer("UsageSample", {"time": Num(), "ref_gpu_h": Num()}), MANY, description="oldest first"
    ),
}
TENANT = answer("Tenant", TENANT_FIELDS)
WHAT_IF = answer(
    "WhatIf",
    {"gpus": Arr(Int(1), 64), "forecast": FORECAST, "note": Nullable(TEXT)},
)
DRY_RUN = answer(
    "DryRun",
    {
        "tenant": ID,
        "user": TEXT,
        "name": TEXT,
        "gpus": Arr(Int(1), 64),
        "total_samples": Num(),
        "forecast": FORECAST,
        "note": Nullable(TEXT),
    },
)
EXPLAIN = answer(
    "Explanation",
    {
        "id": JOB_ID,
        "state": STATES,
        "position": Nullable(Int(1)),
        "priority": Nullable(Num()),
        "latency_ratio": Nullable(Num()),
        "in_window": Nullable(Bool()),
        "window": Nullable(COUNT),
        "sensitivity": Nullable(Num()),
        "may_span": Nullable(Bool()),
        "candidates": Arr(
            answer(
                "Candidate",
                {
                    "config": Anything(),
                    "rate": Num(description="samples/s as the last round (`round`) estimated it"),
                    "value": Num(),
                },
            ),
            MANY,
            description="the configurations the last round weighed (the estimates have learned since)",
        ),
        "chosen": Anything(description="the chosen configuration, or null"),
        "note": Nullable(TEXT),
        "placement": Nullable(PLACEMENT),
        "unplaceable": Nullable(TEXT),
        "profiled_types": Arr(TEXT, MANY),
        "without_runtime": Nullable(TEXT),  # how a job without hopsmgr.runtime is scheduled
        "waits_for": Arr(JOB_ID, 64),  # --after: the dependencies still live
        "estimates": Map(Num(), keys=NODE_ID, max_items=MANY, description="samples/s at R1 per node"),
        "estimates_by_count": Map(
            Map(Num(), keys=Str(pattern="[1-9][0-9]{0,3}"), max_items=64),
            keys=NODE_ID,
            max_items=MANY,
            description="samples/s per node at each GPU count of the job the node holds",
        ),
        "placement_estimate": Nullable(Num(description="samples/s on the placement the job holds")),
        "reason": Nullable(TEXT),
        "forecast": FORECAST,
        "quota": TENANT,
        "what_if": Nullable(WHAT_IF),  # with ?gpus=2,4: the forecast had it asked for those counts
        "round": Nullable(
            answer("Round", {"time": Num(), "kind": TEXT, "method": TEXT, "proven": Nullable(Bool())})
        ),
    },
)
NODE_FIELDS: dict[str, Spec] = {
    "id": NODE_ID,
    "gpu_type": TEXT,
    "gpus": COUNT,
    "health": HEALTH_STATES,
    "drained": Bool(),
    "drain_reason": Nullable(TEXT),
    "emulated": Bool(),
    "device_mode": Nullable(TEXT),
    "calibration": Map(Anything(), max_items=MANY, description="factors and their source"),
    "last_beat_s": Nullable(Num()),
    "free_gpus": COUNT,
    "command_error": Nullable(TEXT),
    "command_error_s": Nullable(Num()),
    "running": Arr(
        answer("NodeAttempt", {"job": JOB_ID, "attempt": ATTEMPT_ID, "gpus": Int(1), "profiling": Bool()}),
        MANY,
    ),
}
NODE = answer("Node", NODE_FIELDS)
CALIBRATING_NODE = answer("CalibratingNode", {**NODE_FIELDS, "calibration_requested": Bool()})
CLUSTER = answer(
    "Cluster",
    {
        **{
            k: COUNT
            for k in ("gpus", "used_gpus", "idle_gpus", "pending", "queued", "running", "checkpointing")
        },
        "gpus_by_type": Map(COUNT, keys=TEXT, max_items=MANY),
        "nodes": Map(COUNT, keys=HEALTH_STATES, max_items=4),
        "raqlr": Nullable(Num()),
        "epoch": COUNT,
        "executor": TEXT,
        "last_round": Anything(description="the latest round's statistics, or null"),
    },
)
TOKEN_ID = Str(max_len=16, pattern="[0-9a-f]{16}")
TOKEN = answer("Token", {"token": TEXT, "id": TOKEN_ID, "user": ID, "tenant": ID, "admin": Bool()})
TOKEN_INFO_FIELDS: dict[str, Spec] = {"id": TOKEN_ID, "user": ID, "tenant": ID, "created": Num()}
TOKEN_INFO = answer("TokenInfo", TOKEN_INFO_FIELDS)
REVOKED = answer("RevokedToken", {**TOKEN_INFO_FIELDS, "revoked": Bool()})
USER = answer(
    "User",
    {
        "name": ID,
        "tenant": ID,
        "unix_user": Str(max_len=32),
        "role": Str(enum=ROLES),
        "created": Num(),
        "tokens": COUNT,
    },
)
REMOVED_USER = answer("RemovedUser", {"name": ID, "removed": Bool(), "tokens_revoked": COUNT})
LEADER = answer(
    "Leader",
    {"url": Str(max_len=2048), "since": Num(), "epoch": COUNT, "first_plan": Nullable(Num())},
)
# a standby answers too (role "standby", the leader it knows of, or null); its epoch is the leader's
HEALTH = answer(
    "Health",
    {
        "status": Str(enum=("ok",)),
        "epoch": COUNT,
        "role": Str(enum=("leader", "standby")),
        "leader": Nullable(LEADER),
    },
)


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {
            "description": _REASONS[c],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for c in sorted(codes)
    }


_REASONS = {
    400: "the request is malformed: the error names the field",
    401: "no token, or not one this operation accepts",
    403: "the token may not do this",
    404: "no such job, node, tenant, user or token",
    405: "method not allowed",
    409: "conflict (the job has ended; another protocol version; the user exists; acting on oneself)",
    413: "body over 64 KiB",
    422: "valid, but the cluster can never meet it",
    429: "too many what-if forecasts in line: try again soon",
    503: "the master cannot write its state",
}


def _op(
    op_id: str,
    summary: str,
    answer_schema: Obj | JsonSchema,
    *,
    errors: tuple[int, ...] = (),
    params: list[dict[str, Any]] | None = None,
    body: Obj | None = None,
    ok: int = 200,
    auth: bool = True,
    links: dict[str, Any] | None = None,
    body_required: bool = True,
) -> dict[str, Any]:
    schema = answer_schema.json_schema() if isinstance(answer_schema, Obj) else answer_schema
    success: dict[str, Any] = {"description": "OK", "content": {"application/json": {"schema": schema}}}
    if links:
        success["links"] = links
    codes = {400, *errors} | ({401} if auth else set()) | ({413} if body is not None else set())
    op: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "responses": {str(ok): success, **_errors(*codes)},
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": body.json_schema()}},
        }
    if not auth:
        op["security"] = []
    return op


def _query(name: str, schema: JsonSchema, **extra: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, **extra}


def _path(name: str, spec: Str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": spec.json_schema()}


def _links(ops: dict[str, str], param: str) -> dict[str, Any]:
    return {
        name: {"operationId": op_id, "parameters": {param: "$response.body#/id"}}
        for name, op_id in ops.items()
    }


JOB_LINKS = {"ShowJob": "showJob", "CancelJob": "cancelJob", "JobLogs": "jobLogs", "ExplainJob": "explainJob"}
NODE_LINKS = {"DrainNode": "drainNode", "UndrainNode": "undrainNode", "CalibrateNode": "calibrateNode"}


def openapi_document() -> dict[str, Any]:
    job, node = _path("job", JOB_ID), _path("node", NODE_ID)
    user, token = _path("user", ID), _path("token", TOKEN_ID)
    metrics_text = {"type": "string", "description": "Prometheus text exposition format 0.0.4"}
    metrics = _op("metrics", "Prometheus metrics", {}, errors=())
    metrics["responses"]["200"] = {"description": "OK", "content": {"text/plain": {"schema": metrics_text}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "hopsmgr master", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR.json_schema()},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": _op("health", "Liveness and epoch", HEALTH, auth=False)},
            "/metrics": {"get": metrics},
            "/api/v1/openapi.json": {"get": _op("openapi", "This document", {"type": "object"}, auth=False)},
            "/api/v1/jobs": {
                "post": _op(
                    "submitJob",
                    "Submit a job",
                    JOB_SUMMARY,
                    body=SUBMISSION,
                    ok=201,
                    errors=(403, 422, 503),
                    links=_links(JOB_LINKS, "job"),
                ),
                "get": _op(
                    "listJobs",
                    "List jobs (newest first)",
                    JOB_LIST,
                    errors=(403, 404),
                    params=[
                        _query("tenant", ID.json_schema()),
                        _query("user", ID.json_schema()),
                        _query(
                            "state",
                            {"type": "array", "items": STATES.json_schema()},
                            style="form",
                            explode=True,
                        ),
                        _query("limit", Int(1, MAX_LIMIT).json_schema()),
                    ],
                ),
            },
            "/api/v1/jobs/{job}": {
                "get": _op("showJob", "Show a job", JOB_DETAIL, errors=(404,), params=[job])
            },
            "/api/v1/jobs/{job}/cancel": {
                "post": _op("cancelJob", "Cancel a job", JOB_SUMMARY, errors=(404, 409, 503), params=[job])
            },
            "/api/v1/jobs/{job}/logs": {
                "get": _op(
                    "jobLogs",
                    "The latest attempt's log",
                    LOGS,
                    errors=(404,),
                    params=[job, _query("tail", Int(1, MAX_TAIL).json_schema())],
                )
            },
            "/api/v1/jobs/{job}/explain": {
                "get": _op(
                    "explainJob",
                    "Why a job waits or runs where it does",
                    EXPLAIN,
                    errors=(404, 409, 422, 429),
                    params=[
                        job,
                        _query(
                            "gpus",
                            Str(max_len=320, pattern=GPUS_PATTERN).json_schema(),
                            description="GPU counts (2,4): also forecast the waiting job had it asked for these",
                        ),
                    ],
                )
            },
            "/api/v1/forecasts": {
                "post": _op(
                    "dryRun",
                    "Forecast a job as if submitted now (a dry run: checked as a submission, nothing stored)",
                    DRY_RUN,
                    body=SUBMISSION,
                    errors=(403, 422, 429),
                )
            },
            "/api/v1/nodes": {
                "get": _op("listNodes", "List nodes", answer("NodeList", {"nodes": Arr(NODE, MANY)}))
            },
            "/api/v1/nodes/{node}": {
                "get": _op(
                    "showNode",
                    "Show a node",
                    NODE,
                    errors=(404,),
                    params=[node],
                    links=_links(NODE_LINKS, "node"),
                )
            },
            "/api/v1/nodes/{node}/drain": {
                "post": _op(
                    "drainNode",
                    "Drain a node (admin)",
                    NODE,
                    errors=(403, 404, 503),
                    params=[node],
                    body=DRAIN_REQUEST,
                    body_required=False,
                )
            },
            "/api/v1/nodes/{node}/undrain": {
                "post": _op(
                    "undrainNode", "Undrain a node (admin)", NODE, errors=(400, 403, 404, 503), params=[node]
                )
            },
            "/api/v1/nodes/{node}/calibrate": {
                "post": _op(
                    "calibrateNode",
                    "Run the node's calibration kernels (admin)",
                    CALIBRATING_NODE,
                    errors=(400, 403, 404, 503),
                    params=[node],
                )
            },
            "/api/v1/tenants": {
                "get": _op(
                    "listTenants",
                    "Tenant quotas and usage",
                    answer("TenantList", {"tenants": Arr(TENANT, MANY)}),
                )
            },
            "/api/v1/cluster": {"get": _op("cluster", "Cluster summary", CLUSTER)},
            "/api/v1/tokens": {
                "post": _op(
                    "createToken",
                    "Create a token (admin)",
                    TOKEN,
                    body=TOKEN_REQUEST,
                    ok=201,
                    errors=(403, 422, 503),
                ),
                "get": _op(
                    "listTokens",
                    "Tokens one may revoke (admin: all; tenant admin: the tenant's; user: its own)",
                    answer("TokenList", {"tokens": Arr(TOKEN_INFO, MANY)}),
                ),
            },
            "/api/v1/tokens/{token}": {
                "delete": _op("revokeToken", "Revoke a token", REVOKED, errors=(404, 503), params=[token])
            },
            "/api/v1/users": {
                "get": _op(
                    "listUsers",
                    "Users (admin: all; tenant admin: the tenant's; user: itself)",
                    answer("UserList", {"users": Arr(USER, MANY)}),
                ),
                "post": _op(
                    "addUser", "Add a user (admin)", USER, body=NEW_USER, ok=201, errors=(403, 409, 422, 503)
                ),
            },
            "/api/v1/users/{user}": {
                "get": _op("showUser", "Show a user", USER, errors=(404,), params=[user]),
                "post": _op(
                    "setUser",
                    "Change a user's tenant, Unix account or role (admin)",
                    USER,
                    body=USER_CHANGE,
                    errors=(403, 404, 409, 422, 503),
                    params=[user],
                ),
                "delete": _op(
                    "removeUser",
                    "Remove a user and revoke its tokens (admin)",
                    REMOVED_USER,
                    errors=(403, 404, 409, 503),
                    params=[user],
                ),
            },
            "/api/v1/agents/heartbeat": {
                "post": _op(
                    "heartbeat",
                    "Agent heartbeat (cluster token)",
                    HEARTBEAT_REPLY,
                    body=HEARTBEAT,
                    errors=(404, 409, 503),
                )
            },
        },
    }
