"""The OpenAPI 3.1 document of the master (served at /api/v1/openapi.json), generated from the schemas.

Request bodies come from the very `hopsmgr.protocol` schemas the API validates with; answers from the
schemas of hopsmgr.master.schemas, which tests check real answers against. Path and query parameters carry the patterns
and bounds `hopsmgr.master.api` enforces; /metrics is Prometheus text; `links` chain a submission to
showing, cancelling, explaining and reading the logs of the job it created.
tests/integration check that every route of the app is described here and every described route exists.
"""

from __future__ import annotations

from typing import Any

from hopsmgr import __version__
from hopsmgr.master.schemas import (
    CALIBRATING_NODE,
    CLUSTER,
    DRY_RUN,
    ERROR,
    EXPLAIN,
    GPUS_PATTERN,
    HEALTH,
    JOB_DETAIL,
    JOB_ID,
    JOB_LIST,
    JOB_SUMMARY,
    LOGS,
    MANY,
    MAX_LIMIT,
    MAX_TAIL,
    NODE,
    NODE_ID,
    REMOVED_USER,
    REVOKED,
    STATES,
    TENANT,
    TOKEN,
    TOKEN_ID,
    TOKEN_INFO,
    USER,
    answer,
)
from hopsmgr.protocol import (
    DRAIN_REQUEST,
    HEARTBEAT,
    HEARTBEAT_REPLY,
    ID,
    NEW_USER,
    SUBMISSION,
    TOKEN_REQUEST,
    USER_CHANGE,
)
from hopsmgr.schema import Arr, Int, JsonSchema, Obj, Str


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
