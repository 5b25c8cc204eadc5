"""The answers of the master's HTTP API as schemas (hopsmgr.schema): one `answer(...)` shape per kind of
answer (a job's summary and detail, a node, a tenant, the cluster, tokens, users, health, errors), and
the id patterns, bounds and enums that the API's path and query parameters share with them.
hopsmgr.master.openapi builds the OpenAPI document from these; tests check real answers against them.
"""

from __future__ import annotations

from hopsmgr.core.lifecycle import JobState
from hopsmgr.master.state import NodeHealth
from hopsmgr.protocol import ATTEMPT_ID_PATTERN, ID, JOB_ID_PATTERN, ROLES
from hopsmgr.schema import Anything, Arr, Bool, Int, Map, Nullable, Num, Obj, Spec, Str

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
    "cap_gpus_by_type": Map(
        COUNT, keys=TEXT, max_items=MANY, description="the most GPUs of each type its jobs may hold together"
    ),
    "guaranteed_gpus_by_type": Map(
        COUNT,
        keys=TEXT,
        max_items=MANY,
        description="GPUs of each type it gets back when it has work for them",
    ),
    "weight": Num(),
    "used_gpus": COUNT,
    "used_gpus_by_type": Map(COUNT, keys=TEXT, max_items=MANY, description="GPUs of each type its jobs hold"),
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
