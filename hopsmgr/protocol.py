"""Versioned wire schemas shared by the master, the agent and the CLI, with strict validation.

Every message is JSON and has one schema here (a `hopsmgr.schema.Obj`): `parse_*` checks decoded JSON
against it and returns a frozen dataclass, or raises `WireError(field, message)` naming the offending
field (unknown keys are refused); the master's OpenAPI document is generated from the same schemas.
`*.to_json()` gives the JSON form, and `parse_x(json.loads(json.dumps(x.to_json()))) == x` for every
message (tests round-trip them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from hopsmgr import nodecontract
from hopsmgr.schema import Arr, Bool, Int, Map, Nullable, Num, Obj, Str, WireError, show

__all__ = [
    "PROTOCOL_VERSION",
    "DrainRequest",
    "FinishedAttempt",
    "Heartbeat",
    "HeartbeatReply",
    "Progress",
    "RunningAttempt",
    "Submission",
    "TokenRequest",
    "UserRequest",
    "WireError",
    "parse_drain_request",
    "parse_heartbeat",
    "parse_heartbeat_reply",
    "parse_submission",
    "parse_token_request",
    "parse_user_request",
]

PROTOCOL_VERSION = 3  # 2: Progress carries iteration_s; 3: and work (2026-12-04)
ID_PATTERN = "[A-Za-z0-9_.-]{1,64}"
ID_RE = re.compile(ID_PATTERN)
JOB_ID_PATTERN = "j-[0-9]{6,9}"  # the master numbers jobs j-000001, j-000002, ...
ATTEMPT_ID_PATTERN = "a-[0-9]{6,9}"
MAX_ATTEMPTS_PER_BEAT = 4096
ID = Str(max_len=64, pattern=ID_PATTERN)
CALIBRATION_KEYS = ("compute_factor", "memory_factor", "data_factor", "link_gbps", "net_gbps")
DEVICE_MODES = ("nvml", "emulated", "cpu")


def _json(message: Any) -> dict[str, Any]:
    return asdict(message)


# -- heartbeat --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    iteration: int = 0
    samples: float = 0.0
    samples_per_s: float = 0.0
    td_s: float = 0.0
    tw_s: float = 0.0
    time: float = 0.0
    mode: str = "run"
    iteration_s: float = 0.0  # mean seconds of the recent iterations (0: not measured)
    # the job's work done, in iterations at its smallest GPU count (an iteration on G GPUs does G / R1
    # of them); None from an older runtime (no "work" in its progress file): each iteration counts as one
    work: float | None = None

    def to_json(self) -> dict[str, Any]:
        return _json(self)


PROGRESS = Obj(
    "Progress",
    {
        "iteration": Int(0),
        "samples": Num(0.0),
        "samples_per_s": Num(0.0),
        "td_s": Num(0.0),
        "tw_s": Num(0.0),
        "time": Num(0.0),
        "mode": Str(enum=("run", "profile")),
        "iteration_s": Num(0.0),
        "work": Nullable(Num(0.0)),
    },
    build=Progress,
    description=f"the runtime's {nodecontract.PROGRESS_FILE}",
)


def parse_progress(value: object, name: str) -> Progress | None:
    return None if value is None else PROGRESS.check(value, name)


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    attempt: str
    job: str
    progress: Progress | None = None


RUNNING = Obj(
    "RunningAttempt",
    {"attempt": ID, "job": ID, "progress": Nullable(PROGRESS)},
    required=("attempt", "job"),
    build=RunningAttempt,
)


@dataclass(frozen=True, slots=True)
class FinishedAttempt:
    attempt: str
    job: str
    code: int | None
    signal: int | None = None
    checkpointed: bool = False
    profile: dict[str, float] | None = None
    progress: Progress | None = None
    log_tail: str = ""


FINISHED = Obj(
    "FinishedAttempt",
    {
        "attempt": ID,
        "job": ID,
        "code": Nullable(Int(-255, 255)),
        "signal": Nullable(Int(0, 128)),
        "checkpointed": Bool(description=f"exit code {nodecontract.EXIT_CHECKPOINTED}"),
        "profile": Nullable(Map(Num(), description=f"the runtime's {nodecontract.PROFILE_FILE}")),
        "progress": Nullable(PROGRESS),
        # a job's output may hold NUL bytes: they are replaced, never a reason to refuse the beat. The
        # agent sends at most 4,000 bytes; 8,192 characters (at most 6 bytes each in JSON) keep any
        # tail the document allows under the 64-KiB body limit, so a longer one is a 400, not a 413
        "log_tail": Str(max_len=1 << 13, replace_nul=True),
    },
    required=("attempt", "job", "code"),
    build=FinishedAttempt,
)
CALIBRATION = Obj("Calibration", {k: Num(positive=True) for k in CALIBRATION_KEYS})


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Agent -> master, every `interval_s`: who it is, what it has, what it sees running and finished."""

    node: str
    gpu_type: str
    gpus: int
    device_mode: str  # "nvml" | "emulated" | "cpu"
    workdir: str
    protocol: int = PROTOCOL_VERSION
    agent_version: str = ""
    epoch_seen: int = 0
    calibration: dict[str, float] | None = None
    calibration_source: str = ""
    running: tuple[RunningAttempt, ...] = ()
    finished: tuple[FinishedAttempt, ...] = ()
    healthy: bool = True
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return _json(self)


HEARTBEAT = Obj(
    "Heartbeat",
    {
        "node": ID,
        "gpu_type": Str(max_len=64),
        "gpus": Int(0, 64),
        "device_mode": Str(enum=DEVICE_MODES),
        "workdir": Str(max_len=1024),
        "protocol": Int(PROTOCOL_VERSION, PROTOCOL_VERSION),
        "agent_version": Str(max_len=64),
        "epoch_seen": Int(0),
        "calibration": Nullable(CALIBRATION),
        "calibration_source": Str(max_len=64),
        "running": Arr(RUNNING, MAX_ATTEMPTS_PER_BEAT),
        "finished": Arr(FINISHED, MAX_ATTEMPTS_PER_BEAT),
        "healthy": Bool(),
        "message": Str(max_len=1024),
    },
    required=("node", "gpu_type", "gpus", "device_mode", "workdir"),
    build=Heartbeat,
)


def check_protocol(value: object) -> None:
    """Refuse another protocol version first, with both versions named (before any other field)."""
    version = value.get("protocol", PROTOCOL_VERSION) if isinstance(value, Mapping) else PROTOCOL_VERSION
    if version != PROTOCOL_VERSION:
        raise WireError(
            "protocol",
            f"agent speaks protocol {show(version)}, this master speaks {PROTOCOL_VERSION}: "
            "upgrade the agent and the master to the same hopsmgr release",
        )


def parse_heartbeat(value: object) -> Heartbeat:
    check_protocol(value)
    return HEARTBEAT.check(value, "")


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """Master -> agent: the epoch (for fencing), when to beat next, what to forget and what to stop."""

    epoch: int
    interval_s: float
    ack: tuple[str, ...] = ()  # finished attempts recorded: the agent may forget them
    stop: tuple[str, ...] = ()  # attempts that must not run: the agent stops them (grace, then kill)
    protocol: int = PROTOCOL_VERSION
    calibrate: bool = False  # the operator asked for a new calibration run
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _json(self)


HEARTBEAT_REPLY = Obj(
    "HeartbeatReply",
    {
        "epoch": Int(0),
        "interval_s": Num(positive=True),
        "ack": Arr(ID, 1 << 16),
        "stop": Arr(ID, 1 << 16),
        "protocol": Int(PROTOCOL_VERSION, PROTOCOL_VERSION),
        "calibrate": Bool(),
        "extra": Map(Str()),
    },
    required=("epoch", "interval_s"),
    build=HeartbeatReply,
)


def parse_heartbeat_reply(value: object) -> HeartbeatReply:
    check_protocol(value)
    return HEARTBEAT_REPLY.check(value, "")


# -- requests from users (the CLI builds them, the master checks them) --------------------------------------

MAX_WORK = 1e15  # iterations or samples: far above any real job, far below float overflow
MAX_PARAMS = 1e13
ENV_NAME = "[A-Za-z_][A-Za-z0-9_]{0,127}"


CHECKPOINT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")
MAX_TIME_S = 366 * 86400.0
MAX_ARRAY_INDEX = 1_000_000


@dataclass(frozen=True, slots=True)
class Submission:
    """User -> master (POST /api/v1/jobs): a job to run. `name` defaults to the program's basename.

    With `runtime` (the default) the command uses hopsmgr.runtime: `batch_size` and one of
    `iterations` and `samples` are required. With `runtime` False it does not: it gets no profiling
    run, takes none of the three, and is never preempted unless `checkpoint_signal` names the signal
    it saves its own checkpoint on (then `grace_s` is how long it may take before SIGTERM). `time_s`:
    the job's time limit (it fails past it); for a job without the runtime also its expected run time.
    """

    command: tuple[str, ...]
    gpus: tuple[int, ...]
    batch_size: int | None = None
    iterations: float | None = None
    samples: float | None = None
    name: str = ""
    tenant: str | None = None
    params: float = 0.0
    workdir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = "plain"
    mem_mb: int | None = None
    cpus: float | None = None
    runtime: bool = True
    time_s: float | None = None
    checkpoint_signal: str | None = None
    grace_s: float | None = None
    after: tuple[str, ...] = ()
    array_index: int | None = None
    one_server: bool = False

    def to_json(self) -> dict[str, Any]:
        """The request body: given fields only (defaults and None left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("command", "gpus") or (value is not None and value != _default(f)):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _default(f: Any) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default


_WORK = ("batch_size", "iterations", "samples")
_SIGNAL = ("checkpoint_signal", "grace_s")


def _submission(**given: Any) -> Submission:
    if given.get("runtime", True):
        if "batch_size" not in given:
            raise WireError("batch_size", "is required (unless runtime is false)")
        if ("iterations" in given) == ("samples" in given):
            raise WireError(
                "iterations", "give exactly one of iterations and samples (unless runtime is false)"
            )
        for key in _SIGNAL:
            if key in given:
                raise WireError(key, "applies only to a job without the runtime (runtime false)")
    else:
        for key in _WORK:
            if key in given:
                raise WireError(
                    key,
                    "a job without the runtime (runtime false) takes none of batch_size, iterations and "
                    "samples: its work is its run time (time_s)",
                )
        if "grace_s" in given and "checkpoint_signal" not in given:
            raise WireError("grace_s", "needs checkpoint_signal (the signal the grace period follows)")
    given.setdefault("name", given["command"][0].rsplit("/", 1)[-1][:128])
    return Submission(**given)


def _required(*keys: str) -> list[dict[str, Any]]:
    return [{"required": [k]} for k in keys]


_RULES = (
    {
        "anyOf": [
            {
                "properties": {"runtime": {"const": True}},
                "required": ["batch_size"],
                "oneOf": _required("iterations", "samples"),
                "not": {"anyOf": _required(*_SIGNAL)},
            },
            {
                "properties": {"runtime": {"const": False}},
                "required": ["runtime"],
                "not": {"anyOf": _required(*_WORK)},
                "anyOf": [{"not": {"required": ["grace_s"]}}, {"required": ["checkpoint_signal"]}],
            },
        ]
    },
)

SUBMISSION = Obj(
    "Submission",
    {
        "command": Arr(
            Str(), 1024, min_items=1, first=Str(min_len=1), description="argv, never run through a shell"
        ),
        "gpus": Arr(Int(1, 4096), 64, min_items=1, unique=True, description="the GPU counts the job can use"),
        "batch_size": Int(1, 1 << 24, description="per-GPU batch size"),
        "iterations": Num(
            low=1.0, high=MAX_WORK, description="iterations at the smallest GPU count (at least one)"
        ),
        "samples": Num(low=1.0, high=MAX_WORK, description="total samples of work (at least one)"),
        "name": Str(max_len=128),
        "tenant": ID,
        "params": Num(0.0, MAX_PARAMS, description="model parameters"),
        "workdir": Str(
            max_len=1024,
            pattern="(/[\\s\\S]*)?",
            forbid=("(^|/)\\.\\.(/|(?![\\s\\S]))", "must be an absolute path without '..'"),
        ),
        "env": Map(
            Str(),
            keys=Str(
                max_len=128,
                pattern=ENV_NAME,
                forbid=(nodecontract.RESERVED_ENV, "is set by hopsmgr and cannot be given"),
            ),
            max_items=256,
        ),
        "launcher": Str(enum=("plain", "torchrun")),
        "mem_mb": Int(1, 1 << 30, description="memory limit of each attempt's cgroup on a node (MiB)"),
        "cpus": Num(positive=True, high=4096.0, description="CPU limit of each attempt's cgroup on a node"),
        "runtime": Bool(description="the command uses hopsmgr.runtime (default true)"),
        "time_s": Num(
            positive=True,
            high=MAX_TIME_S,
            description="time limit; without the runtime also the expected run time",
        ),
        "checkpoint_signal": Str(
            enum=CHECKPOINT_SIGNALS, description="without the runtime: the signal that asks for a checkpoint"
        ),
        "grace_s": Num(0.0, 86400.0, description="seconds from the checkpoint signal to SIGTERM"),
        "after": Arr(
            Str(max_len=16, pattern=JOB_ID_PATTERN),
            64,
            unique=True,
            description="jobs that must complete before this one starts",
        ),
        "array_index": Int(
            0, MAX_ARRAY_INDEX, description="the job's index in an array (submit --array): HOPS_ARRAY_INDEX"
        ),
        "one_server": Bool(
            description="every placement on one server (a script that cannot meet its peers on others)"
        ),
    },
    required=("command", "gpus"),
    build=_submission,
    rules=_RULES,
)


def parse_submission(value: object) -> Submission:
    return SUBMISSION.check(value, "")


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """Admin -> master (POST /api/v1/tokens): a token for `user` (created in `tenant` if new)."""

    user: str
    tenant: str | None = None
    admin: bool = False

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in _json(self).items() if v is not None}


TOKEN_REQUEST = Obj(
    "TokenRequest",
    {
        "user": ID,
        "tenant": Str(max_len=64, pattern=ID_PATTERN, description="needed only for a user not yet known"),
        "admin": Bool(),
    },
    required=("user",),
    build=TokenRequest,
)


def parse_token_request(value: object) -> TokenRequest:
    return TOKEN_REQUEST.check(value, "")


ROLES = ("user", "tenant-admin", "admin")
# a POSIX account name as useradd takes it (Debian's default NAME_REGEX, without the trailing '$')
UNIX_USER_PATTERN = "[a-z_][a-z0-9_-]{0,31}"


@dataclass(frozen=True, slots=True)
class UserRequest:
    """Admin -> master (POST /api/v1/users, POST /api/v1/users/{user}): a user's identity. `name` is
    given when adding (not when changing); fields left out keep their value (or take the default)."""

    name: str | None = None
    tenant: str | None = None
    unix_user: str | None = None
    role: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in _json(self).items() if v is not None}


USER_FIELDS = {
    "tenant": ID,
    "unix_user": Str(
        max_len=32,
        pattern=f"({UNIX_USER_PATTERN})?",
        description="the Unix account the user's jobs run as ('' for none)",
    ),
    "role": Str(enum=ROLES),
}
NEW_USER = Obj("NewUser", {"name": ID, **USER_FIELDS}, required=("name", "tenant"), build=UserRequest)
USER_CHANGE = Obj("UserChange", dict(USER_FIELDS), build=UserRequest)


def parse_user_request(value: object, *, new: bool) -> UserRequest:
    return (NEW_USER if new else USER_CHANGE).check(value, "")


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """Admin -> master (POST /api/v1/nodes/{node}/drain, body optional): why the node is drained."""

    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return _json(self)


DRAIN_REQUEST = Obj("DrainRequest", {"reason": Str(max_len=512)}, build=DrainRequest)


def parse_drain_request(value: object) -> DrainRequest:
    return DRAIN_REQUEST.check(value, "")
