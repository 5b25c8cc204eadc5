"""The OpenAPI 3.1 document of /api/v1 (served at /api/v1/openapi.json), kept beside the routes.

tests/integration check that every route of the app is described here and every described route exists.
"""

from __future__ import annotations

from typing import Any

from hopsmgr import __version__

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "field", "message"],
            "properties": {
                "status": {"type": "integer"},
                "field": {"type": ["string", "null"]},
                "message": {"type": "string"},
            },
        }
    },
}
_SUBMIT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["command", "gpus", "batch_size"],
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1024},
        "gpus": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1, "maxItems": 64},
        "batch_size": {"type": "integer", "minimum": 1},
        "iterations": {"type": "number", "exclusiveMinimum": 0},
        "samples": {"type": "number", "exclusiveMinimum": 0},
        "name": {"type": "string", "maxLength": 128},
        "tenant": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "params": {"type": "number", "minimum": 0},
        "workdir": {"type": "string", "maxLength": 1024},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "launcher": {"enum": ["plain", "torchrun"]},
    },
}
_TOKEN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["user", "tenant"],
    "properties": {
        "user": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "tenant": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "admin": {"type": "boolean"},
    },
}
_JOB = {"name": "job", "in": "path", "required": True, "schema": {"type": "string"}}
_NODE = {"name": "node", "in": "path", "required": True, "schema": {"type": "string"}}


def _op(
    summary: str,
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    ok: int = 200,
    auth: bool = True,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            str(ok): {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            "default": {"description": "error", "content": {"application/json": {"schema": _ERROR}}},
        },
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if not auth:
        op["security"] = []
    return op


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def openapi_document() -> dict[str, Any]:
    states = {
        "enum": [
            "PENDING",
            "PROFILING",
            "QUEUED",
            "LAUNCHING",
            "RUNNING",
            "CHECKPOINTING",
            "COMPLETED",
            "FAILED",
            "CANCELLED",
        ]
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "hopsmgr master", "version": __version__},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": _op("Liveness and epoch", auth=False)},
            "/metrics": {"get": _op("Prometheus metrics (text)")},
            "/api/v1/openapi.json": {"get": _op("This document", auth=False)},
            "/api/v1/jobs": {
                "post": _op("Submit a job", body=_SUBMIT, ok=201),
                "get": _op(
                    "List jobs",
                    params=[
                        _query("tenant", {"type": "string"}),
                        _query("user", {"type": "string"}),
                        _query("state", states),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 100000}),
                    ],
                ),
            },
            "/api/v1/jobs/{job}": {"get": _op("Show a job", params=[_JOB])},
            "/api/v1/jobs/{job}/cancel": {"post": _op("Cancel a job", params=[_JOB])},
            "/api/v1/jobs/{job}/logs": {
                "get": _op(
                    "The latest attempt's log",
                    params=[_JOB, _query("tail", {"type": "integer", "minimum": 1, "maximum": 1048576})],
                )
            },
            "/api/v1/jobs/{job}/explain": {
                "get": _op("Why a job waits or runs where it does", params=[_JOB])
            },
            "/api/v1/nodes": {"get": _op("List nodes")},
            "/api/v1/nodes/{node}": {"get": _op("Show a node", params=[_NODE])},
            "/api/v1/nodes/{node}/drain": {"post": _op("Drain a node (admin)", params=[_NODE])},
            "/api/v1/nodes/{node}/undrain": {"post": _op("Undrain a node (admin)", params=[_NODE])},
            "/api/v1/nodes/{node}/calibrate": {
                "post": _op("Run the node's calibration kernels (admin)", params=[_NODE])
            },
            "/api/v1/tenants": {"get": _op("Tenant quotas and usage")},
            "/api/v1/cluster": {"get": _op("Cluster summary")},
            "/api/v1/tokens": {"post": _op("Create a token (admin)", body=_TOKEN, ok=201)},
            "/api/v1/agents/heartbeat": {
                "post": _op("Agent heartbeat (cluster token)", body={"type": "object"})
            },
        },
    }
