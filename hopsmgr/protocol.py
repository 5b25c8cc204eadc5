"""Versioned wire schemas shared by the master, the agent and the CLI, with strict validation.

Every message is JSON. `parse_*` functions take the decoded JSON and return frozen dataclasses, or raise
`WireError(field, message)` naming the offending field; unknown keys are refused. `*.to_json()` gives the
JSON form, and `parse_x(x.to_json()) == x` for every message (tests round-trip them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_ATTEMPTS_PER_BEAT = 4096


class WireError(ValueError):
    """A message that does not match its schema: `field` (dotted path) and why."""

    def __init__(self, field_name: str | None, message: str) -> None:
        self.field = field_name
        self.message = message
        super().__init__(f"{field_name}: {message}" if field_name else message)


def _repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def table(
    value: object, name: str, allowed: Sequence[str], required: Sequence[str] = ()
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WireError(name or None, f"must be a JSON object, got {_repr(value)}")
    for key in value:
        if key not in allowed:
            raise WireError(_join(name, key), f"unknown field (known: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise WireError(_join(name, key), "is required")
    return value


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def string(value: object, name: str, *, pattern: re.Pattern[str] | None = None, max_len: int = 4096) -> str:
    if not isinstance(value, str):
        raise WireError(name, f"must be a string, got {_repr(value)}")
    if len(value) > max_len:
        raise WireError(name, f"must be at most {max_len} characters, got {len(value)}")
    if "\x00" in value:
        raise WireError(name, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise WireError(name, "must be valid Unicode (it holds a lone surrogate)") from None
    if pattern is not None and not pattern.fullmatch(value):
        raise WireError(name, f"must match {pattern.pattern}, got {_repr(value)}")
    return value


def integer(value: object, name: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(name, f"must be an integer, got {_repr(value)}")
    if low is not None and value < low:
        raise WireError(name, f"must be >= {low}, got {value}")
    if high is not None and value > high:
        raise WireError(name, f"must be <= {high}, got {value}")
    return value


def number(value: object, name: str, low: float | None = None, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WireError(name, f"must be a number, got {_repr(value)}")
    result = float(value)
    if not math.isfinite(result):
        raise WireError(name, f"must be a finite number, got {_repr(value)}")
    if positive and result <= 0:
        raise WireError(name, f"must be > 0, got {value}")
    if low is not None and result < low:
        raise WireError(name, f"must be >= {low}, got {value}")
    return result


def boolean(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(name, f"must be true or false, got {_repr(value)}")
    return value


def array(value: object, name: str, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        raise WireError(name, f"must be a JSON array, got {_repr(value)}")
    if len(value) > max_items:
        raise WireError(name, f"must have at most {max_items} items, got {len(value)}")
    return value


def number_map(value: object, name: str) -> dict[str, float]:
    raw = table(value, name, tuple(value) if isinstance(value, Mapping) else ())
    if len(raw) > 64:
        raise WireError(name, f"must have at most 64 entries, got {len(raw)}")
    return {string(k, _join(name, k), max_len=64): number(v, _join(name, k)) for k, v in raw.items()}


# -- heartbeat --------------------------------------------------------------------------------------------

_PROGRESS_KEYS = ("iteration", "samples", "samples_per_s", "td_s", "tw_s", "time", "mode")
CALIBRATION_KEYS = ("compute_factor", "memory_factor", "data_factor", "link_gbps", "net_gbps")


@dataclass(frozen=True, slots=True)
class Progress:
    iteration: int = 0
    samples: float = 0.0
    samples_per_s: float = 0.0
    td_s: float = 0.0
    tw_s: float = 0.0
    time: float = 0.0
    mode: str = "run"


def parse_progress(value: object, name: str) -> Progress | None:
    if value is None:
        return None
    raw = table(value, name, _PROGRESS_KEYS)
    return Progress(
        iteration=integer(raw.get("iteration", 0), f"{name}.iteration", 0),
        samples=number(raw.get("samples", 0.0), f"{name}.samples", 0.0),
        samples_per_s=number(raw.get("samples_per_s", 0.0), f"{name}.samples_per_s", 0.0),
        td_s=number(raw.get("td_s", 0.0), f"{name}.td_s", 0.0),
        tw_s=number(raw.get("tw_s", 0.0), f"{name}.tw_s", 0.0),
        time=number(raw.get("time", 0.0), f"{name}.time", 0.0),
        mode=string(raw.get("mode", "run"), f"{name}.mode", pattern=re.compile("run|profile")),
    )


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    attempt: str
    job: str
    progress: Progress | None = None


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
        return asdict(self)


_BEAT_KEYS = tuple(Heartbeat.__dataclass_fields__)
_RUNNING_KEYS = ("attempt", "job", "progress")
_FINISHED_KEYS = tuple(FinishedAttempt.__dataclass_fields__)
DEVICE_MODES = re.compile("nvml|emulated|cpu")


def check_protocol(value: Mapping[str, Any]) -> None:
    """Refuse another protocol version first, with both versions named (before any other field)."""
    version = value.get("protocol", PROTOCOL_VERSION) if isinstance(value, Mapping) else PROTOCOL_VERSION
    if version != PROTOCOL_VERSION:
        raise WireError(
            "protocol",
            f"agent speaks protocol {_repr(version)}, this master speaks {PROTOCOL_VERSION}: "
            "upgrade the agent and the master to the same hopsmgr release",
        )


def parse_heartbeat(value: object) -> Heartbeat:
    raw = table(value, "", _BEAT_KEYS, ("node", "gpu_type", "gpus", "device_mode", "workdir"))
    check_protocol(raw)
    running = tuple(
        _running(item, f"running[{i}]")
        for i, item in enumerate(array(raw.get("running", []), "running", MAX_ATTEMPTS_PER_BEAT))
    )
    finished = tuple(
        _finished(item, f"finished[{i}]")
        for i, item in enumerate(array(raw.get("finished", []), "finished", MAX_ATTEMPTS_PER_BEAT))
    )
    calibration = raw.get("calibration")
    return Heartbeat(
        node=string(raw["node"], "node", pattern=ID_RE),
        gpu_type=string(raw["gpu_type"], "gpu_type", max_len=64),
        gpus=integer(raw["gpus"], "gpus", 0, 64),
        device_mode=string(raw["device_mode"], "device_mode", pattern=DEVICE_MODES),
        workdir=string(raw["workdir"], "workdir", max_len=1024),
        protocol=PROTOCOL_VERSION,
        agent_version=string(raw.get("agent_version", ""), "agent_version", max_len=64),
        epoch_seen=integer(raw.get("epoch_seen", 0), "epoch_seen", 0),
        calibration=None if calibration is None else _calibration(calibration),
        calibration_source=string(raw.get("calibration_source", ""), "calibration_source", max_len=64),
        running=running,
        finished=finished,
        healthy=boolean(raw.get("healthy", True), "healthy"),
        message=string(raw.get("message", ""), "message", max_len=1024),
    )


def _calibration(value: object) -> dict[str, float]:
    raw = table(value, "calibration", CALIBRATION_KEYS)
    return {k: number(v, f"calibration.{k}", positive=True) for k, v in raw.items()}


def _no_nul(value: object) -> object:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _running(value: object, name: str) -> RunningAttempt:
    raw = table(value, name, _RUNNING_KEYS, ("attempt", "job"))
    return RunningAttempt(
        attempt=string(raw["attempt"], f"{name}.attempt", pattern=ID_RE),
        job=string(raw["job"], f"{name}.job", pattern=ID_RE),
        progress=parse_progress(raw.get("progress"), f"{name}.progress"),
    )


def _finished(value: object, name: str) -> FinishedAttempt:
    raw = table(value, name, _FINISHED_KEYS, ("attempt", "job", "code"))
    code, sig, profile = raw["code"], raw.get("signal"), raw.get("profile")
    return FinishedAttempt(
        attempt=string(raw["attempt"], f"{name}.attempt", pattern=ID_RE),
        job=string(raw["job"], f"{name}.job", pattern=ID_RE),
        code=None if code is None else integer(code, f"{name}.code", -255, 255),
        signal=None if sig is None else integer(sig, f"{name}.signal", 0, 128),
        checkpointed=boolean(raw.get("checkpointed", False), f"{name}.checkpointed"),
        profile=None if profile is None else number_map(profile, f"{name}.profile"),
        progress=parse_progress(raw.get("progress"), f"{name}.progress"),
        # a job's output may hold NUL bytes: they are replaced, never a reason to refuse the beat
        log_tail=string(_no_nul(raw.get("log_tail", "")), f"{name}.log_tail", max_len=1 << 16),
    )


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
        return asdict(self)


def parse_heartbeat_reply(value: object) -> HeartbeatReply:
    raw = table(value, "", tuple(HeartbeatReply.__dataclass_fields__), ("epoch", "interval_s"))
    check_protocol(raw)
    ids = re.compile(ID_RE.pattern)
    return HeartbeatReply(
        epoch=integer(raw["epoch"], "epoch", 0),
        interval_s=number(raw["interval_s"], "interval_s", positive=True),
        ack=tuple(string(a, "ack", pattern=ids) for a in array(raw.get("ack", []), "ack", 1 << 16)),
        stop=tuple(string(a, "stop", pattern=ids) for a in array(raw.get("stop", []), "stop", 1 << 16)),
        calibrate=boolean(raw.get("calibrate", False), "calibrate"),
        extra={
            string(k, "extra", max_len=64): string(v, f"extra.{k}")
            for k, v in table(raw.get("extra", {}), "extra", tuple(raw.get("extra", {}) or {})).items()
        },
    )
