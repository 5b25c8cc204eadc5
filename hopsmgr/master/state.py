"""The master's own records beside the scheduler state machine's: what agents report about their
nodes, what a job needs to be launched, and the store's row forms.

Scheduling state (live jobs, open attempts, node health) belongs to the state machine
(hopsmgr.control); `NodeRecord` keeps what only the master uses (work directory, calibration as
measured, device mode, agent version) and reads health, drains and heartbeat times from the machine's
node. `job_row` / `attempt_row` turn the machine's records into store rows; `load_jobs` /
`load_attempts` turn rows back into them after a restart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any

from hopsmgr.control.records import Attempt, Job
from hopsmgr.control.records import Node as ControlNode
from hopsmgr.control.records import NodeHealth as NodeHealth
from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Calibration, Config, JobSpec, ModelError, RequirementSet, Server
from hopsmgr.master.store import Row

STORE_COUNTERS = (
    "done_samples",
    "attained_gpu_s",
    "running_s",
    "restarts",
    "preemptions",
    "node_losses",
    "failures",
)


@dataclass(frozen=True, slots=True)
class JobPayload:
    """What the master needs to launch a job besides its spec (stored in the job's row)."""

    seq: int
    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    launcher: str
    run_as: str = ""  # the Unix account the job runs as on the nodes ("": the wrapper's own)
    mem_mb: int | None = None  # cgroup limits of each attempt
    cpus: float | None = None
    checkpoint_signal: str | None = None  # a job without the runtime: its checkpoint signal, if any
    grace_s: float | None = None  # and how long it may take to save before SIGTERM


@dataclass(slots=True)
class NodeRecord:
    server: Server  # as configured (gpu type, GPU count)
    control: ControlNode  # the state machine's node: health, drain, heartbeat time
    calibration: Calibration | None = None  # measured (or emulated) by the agent
    device_mode: str = ""
    reported_gpus: int | None = None
    workdir: str = ""
    agent_version: str = ""
    seen: bool = False  # a heartbeat arrived since this master started
    calibrate_requested: bool = False  # the operator asked for a calibration run (told at the next beat)
    planning_calibration: Calibration | None = None  # `calibration` relative to its GPU type (relative())
    server_cache: Server | None = None  # effective_server(), rebuilt when the calibration object changes
    exec_error: str = (
        ""  # the last command that could not reach or act on it (SSH unreachable, auth, host key)
    )
    drain_reason: str = ""  # why an operator drained it (`hopsmgr drain NODE --reason ...`)

    @property
    def id(self) -> str:
        return self.server.id

    @property
    def health(self) -> str:
        return self.control.health

    @property
    def drained(self) -> bool:
        return self.control.drained

    @property
    def last_beat(self) -> float | None:
        return self.control.last_beat

    @property
    def exec_error_at(self) -> float:
        return self.control.exec_error_at

    @property
    def usable_gpus(self) -> int:
        gpus = self.server.gpus
        return gpus if self.reported_gpus is None else min(gpus, self.reported_gpus)

    def effective_server(self) -> Server:
        """The server as the planner sees it: measured calibration relative to its type (see `relative`)."""
        cal = self.planning_calibration or self.calibration
        if cal is None:
            return self.server
        cached = self.server_cache
        if cached is None or cached.calibration is not cal:
            s = self.server
            cached = self.server_cache = Server(s.id, s.gpu_type, s.gpus, cal, s.host_model, s.order)
        return cached

    def to_row(self) -> Row:
        cal = self.calibration
        return {
            "id": self.id,
            "gpu_type": self.server.gpu_type,
            "gpus": self.server.gpus,
            "drained": int(self.drained),
            "calibration": None if cal is None else calibration_json(cal),
            "calibration_source": "" if cal is None else cal.source,
            "device_mode": self.device_mode,
            "workdir": self.workdir,
            "agent_version": self.agent_version,
            "last_beat": self.last_beat,
        }


def drain_reason_key(node_id: str) -> str:
    """Where a node's drain reason is stored (the meta table: the nodes table has no column for it)."""
    return f"drain_reason:{node_id}"


def spec_json(s: JobSpec) -> dict[str, Any]:
    return {
        "gpus": list(s.requirements.counts),
        "total_samples": s.total_samples,
        "batch_size": s.batch_size,
        "params_bytes": s.params_bytes,
        "restart_s": s.restart_s,
        "model": s.model,
        "runtime": s.runtime,
        "preemptible": s.preemptible,
        "time_limit_s": s.time_limit_s,
        "after": list(s.after),
        "one_server": s.one_server,
    }


def store_counters(counters: Any) -> dict[str, Any]:
    return {k: counters[k] for k in STORE_COUNTERS}


def job_row(job: Job, payload: JobPayload) -> Row:
    return {
        "id": job.id,
        "seq": payload.seq,
        "tenant": job.spec.tenant,
        "user": job.spec.user,
        "name": payload.name,
        "state": job.state.value,
        "submitted": job.submitted,
        "state_since": job.state_since,
        "spec": {
            **spec_json(job.spec),
            "checkpoint_signal": payload.checkpoint_signal,
            "grace_s": payload.grace_s,
        },
        "command": list(payload.command),
        "env": payload.env,
        "workdir": payload.workdir,
        "launcher": payload.launcher,
        "run_as": payload.run_as,
        "mem_mb": payload.mem_mb,
        "cpus": payload.cpus,
        **store_counters(job.counters()),
        "reason": job.reason,
        "has_checkpoint": int(job.has_checkpoint),
        "ended": job.ended,
    }


def load_job(row: Row) -> tuple[Job, JobPayload]:
    s = row["spec"]
    spec = JobSpec(
        id=row["id"],
        requirements=RequirementSet.of(s["gpus"]),
        total_samples=s["total_samples"],
        batch_size=s["batch_size"],
        tenant=row["tenant"],
        user=row["user"],
        name=row["name"],
        model=s.get("model", ""),
        params_bytes=s["params_bytes"],
        submit_time=row["submitted"],
        restart_s=s["restart_s"],
        runtime=s.get("runtime", True),
        preemptible=s.get("preemptible", True),
        time_limit_s=s.get("time_limit_s"),
        after=tuple(s.get("after", ())),
        one_server=bool(s.get("one_server", False)),
    )
    job = Job(
        spec=spec,
        state=JobState(row["state"]),
        submitted=row["submitted"],
        state_since=row["state_since"],
        **{k: row[k] for k in STORE_COUNTERS},
        reason=row["reason"],
        has_checkpoint=bool(row["has_checkpoint"]),
        ended=row["ended"],
    )
    payload = JobPayload(
        seq=row["seq"],
        name=row["name"],
        command=tuple(row["command"]),
        env=dict(row["env"]),
        workdir=row["workdir"],
        launcher=row["launcher"],
        run_as=row.get("run_as") or "",
        mem_mb=row.get("mem_mb"),
        cpus=row.get("cpus"),
        checkpoint_signal=s.get("checkpoint_signal"),
        grace_s=s.get("grace_s"),
    )
    return job, payload


def attempt_seq(attempt_id: str) -> int:
    return int(attempt_id.rsplit("-", 1)[-1])


def load_attempt(row: Row, now: float) -> Attempt:
    """An open attempt from its row. A started one's progress is taken as reported `now`: the job's
    done_samples were stored with it (about every second), and a forecast made before its node's
    first heartbeat must not add the attempt's whole run time to them again."""
    return Attempt(
        id=row["id"],
        job_id=row["job_id"],
        placement=Config.of({k: int(v) for k, v in row["placement"].items()}),
        profiling=bool(row["profiling"]),
        created=row["created"],
        devices={k: tuple(v) for k, v in (row["devices"] or {}).items()},
        resume=bool(row["resume"]),
        launched=True,  # it may run: the first heartbeats of its node tell
        started=row["started"],
        stopping=bool(row["stopping"]),
        stop_reason="preempted" if row["stopping"] else "",
        progressed_at=now if row["started"] is not None else -math.inf,
    )


_FACTORS = ("compute_factor", "memory_factor", "data_factor")


def relative(nodes: list[NodeRecord]) -> None:
    """Set each node's planning calibration: measured or emulated factors divided by the median of its
    GPU type's nodes with calibrations of the same kind, so a typical server of a type reads 1.0.

    Kernels never reach datasheet peaks, so raw measured factors sit well below the 1.0 of servers
    without measurements; the estimator only needs how servers of one type differ (profiles carry
    each type's own speed), which the division keeps exactly.
    """
    groups: dict[tuple[str, str], list[NodeRecord]] = {}
    previous = {}
    for node in nodes:
        cal = node.calibration
        previous[node.id] = node.planning_calibration
        node.planning_calibration = None
        if cal is not None and cal.source not in ("default", "hint"):
            kind = "measured" if cal.source.startswith("measured") else cal.source
            groups.setdefault((node.server.gpu_type, kind), []).append(node)
    for members in groups.values():
        medians = {f: statistics.median(getattr(n.calibration, f) for n in members) for f in _FACTORS}
        for node in members:
            assert node.calibration is not None
            node.planning_calibration = _relative_to(node.calibration, medians, previous[node.id])


def _relative_to(cal: Calibration, medians: dict[str, float], previous: Calibration | None) -> Calibration:
    """`cal` with its factors divided by `medians`: `previous` itself when it already is that (the
    planning views of a type's nodes are re-derived whenever one node's calibration changes; keeping
    the unchanged ones' objects keeps the servers NodeRecord.effective_server made)."""
    values = {f: getattr(cal, f) / medians[f] for f in _FACTORS}
    if (
        previous is not None
        and all(getattr(previous, f) == v for f, v in values.items())
        and (previous.link_gbps, previous.net_gbps, previous.source)
        == (cal.link_gbps, cal.net_gbps, cal.source)
    ):
        return previous
    return replace(cal, **values)


def calibration_json(cal: Calibration) -> dict[str, float]:
    return {
        "compute_factor": cal.compute_factor,
        "memory_factor": cal.memory_factor,
        "data_factor": cal.data_factor,
        "link_gbps": cal.link_gbps,
        "net_gbps": cal.net_gbps,
    }


MIN_STEP_S = 1e-6  # a profiled step's compute below this is no measurement (its rate would overflow)


def time_profile(raw: dict[str, float]) -> TimeProfile:
    """A profiling run's profile.json (hopsmgr.runtime) as the estimator's TimeProfile.

    The runtime times a step's phases one after another in the training thread, so they add up to the
    step: loading that a data loader overlaps with compute shows as a shorter data wait, never as an
    overlap. Such a profile is pattern 2 (phases in sequence); read as pattern 1, a step's data wait
    would hide under its backward pass, and a script that loads in the training thread (the emulated
    example does) would be estimated a third faster than it runs. The time a step spends outside every
    phase (bookkeeping, logging; all of it in a script that times no phase) counts as compute: it is
    not loading, and without it the estimate would leave it out."""

    def seconds(name: str, default: float = 0.0) -> float:
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < math.inf:
            raise ModelError(f"profile: {name} must be a finite number of seconds >= 0, got {value!r}")
        return float(value)

    td_hit = seconds("td_hit_s", seconds("td_s"))
    td_miss = seconds("td_miss_s", td_hit)
    p_cache = raw.get("p_cache", 1.0)
    if isinstance(p_cache, bool) or not isinstance(p_cache, int | float) or math.isnan(p_cache):
        raise ModelError(f"profile: p_cache must be a number, got {p_cache!r}")
    p_cache = min(max(float(p_cache), 0.0), 1.0)
    tw = seconds("tw_s")
    tf, tb, tu = seconds("tf_s"), seconds("tb_s"), seconds("tu_s")
    phased = tf + tb + tu + seconds("tc_s") + tw + p_cache * td_hit + (1.0 - p_cache) * td_miss
    outside = seconds("iteration_s") - phased
    if tf + tb + tu + max(0.0, outside) < MIN_STEP_S:
        raise ModelError(f"profile: a step of under {MIN_STEP_S:g} s of compute is no measurement")
    return TimeProfile(
        tf_s=tf + max(0.0, outside),
        tb_s=tb,
        tu_s=tu,
        td_hit_s=td_hit,
        td_miss_s=td_miss,
        p_cache=p_cache,
        tw_hit_s=tw,
        tw_miss_s=tw,
        pattern=2,
    )
