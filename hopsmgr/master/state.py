"""The master's in-memory records of live jobs, attempts and nodes, and their SQLite row forms.

`MasterState` mirrors the store for everything the scheduler needs every round; it is changed only by
the master (hopsmgr.master.controller) and every job state change goes through `set_job_state`, which
applies the lifecycle table and appends the job's history event in the same transaction.
`build_snapshot` turns the records into the planner's `ClusterSnapshot` (pure: `now` is passed in).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.lifecycle import LIVE, JobState, transition
from hopsmgr.core.model import (
    Calibration,
    ClusterSnapshot,
    Config,
    JobSpec,
    JobView,
    RequirementSet,
    Server,
    TenantQuota,
)
from hopsmgr.master.store import Row, Store
from hopsmgr.protocol import Progress

EXEC_ERROR_BACKOFF_S = 60.0  # no new placements on a node for this long after a command could not reach it


class NodeHealth:
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    LOST = "LOST"
    UNKNOWN = "UNKNOWN"  # configured, no heartbeat yet since the master started


@dataclass(slots=True)
class JobRecord:
    spec: JobSpec
    seq: int
    name: str
    command: list[str]
    env: dict[str, str]
    workdir: str
    launcher: str
    state: JobState
    submitted: float
    state_since: float
    done_samples: float = 0.0
    attained_gpu_s: float = 0.0
    running_s: float = 0.0
    restarts: int = 0
    preemptions: int = 0
    node_losses: int = 0
    failures: int = 0
    reason: str | None = None
    has_checkpoint: bool = False
    ended: float | None = None
    attempt: str | None = None  # the open run attempt, if any
    profiling: set[str] = field(default_factory=set)  # open profiling attempts
    dirty: bool = False  # progress counters changed since the last flush to the store

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    @property
    def total_iterations(self) -> float:
        return self.spec.total_samples / (self.spec.batch_size * self.spec.requirements.minimum)

    def spec_json(self) -> dict[str, Any]:
        s = self.spec
        return {
            "gpus": list(s.requirements.counts),
            "total_samples": s.total_samples,
            "batch_size": s.batch_size,
            "params_bytes": s.params_bytes,
            "restart_s": s.restart_s,
            "model": s.model,
        }

    def to_row(self) -> Row:
        return {
            "id": self.id,
            "seq": self.seq,
            "tenant": self.spec.tenant,
            "user": self.spec.user,
            "name": self.name,
            "state": self.state.value,
            "submitted": self.submitted,
            "state_since": self.state_since,
            "spec": self.spec_json(),
            "command": self.command,
            "env": self.env,
            "workdir": self.workdir,
            "launcher": self.launcher,
            **self.counters(),
            "reason": self.reason,
            "has_checkpoint": int(self.has_checkpoint),
            "ended": self.ended,
        }

    def counters(self) -> Row:
        return {
            "done_samples": self.done_samples,
            "attained_gpu_s": self.attained_gpu_s,
            "running_s": self.running_s,
            "restarts": self.restarts,
            "preemptions": self.preemptions,
            "node_losses": self.node_losses,
            "failures": self.failures,
        }

    @classmethod
    def from_row(cls, row: Row) -> JobRecord:
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
        )
        return cls(
            spec=spec,
            seq=row["seq"],
            name=row["name"],
            command=list(row["command"]),
            env=dict(row["env"]),
            workdir=row["workdir"],
            launcher=row["launcher"],
            state=JobState(row["state"]),
            submitted=row["submitted"],
            state_since=row["state_since"],
            done_samples=row["done_samples"],
            attained_gpu_s=row["attained_gpu_s"],
            running_s=row["running_s"],
            restarts=row["restarts"],
            preemptions=row["preemptions"],
            node_losses=row["node_losses"],
            failures=row["failures"],
            reason=row["reason"],
            has_checkpoint=bool(row["has_checkpoint"]),
            ended=row["ended"],
        )


@dataclass(slots=True)
class AttemptRecord:
    id: str
    seq: int
    job_id: str
    placement: Config
    profiling: bool
    epoch: int
    created: float
    devices: dict[str, list[int]]
    resume: bool = False
    started: float | None = None
    stopping: bool = False  # the master asked it to checkpoint-and-stop (or stop)
    launched: bool = False  # the launch command succeeded (a node should report it)
    unseen_beats: int = 0  # heartbeats of its primary node that did not list it
    progress: Progress | None = None
    base_samples: float = 0.0
    last_observed: float = 0.0

    @property
    def primary(self) -> str:
        return self.placement.parts[0][0]

    def to_row(self) -> Row:
        return {
            "id": self.id,
            "seq": self.seq,
            "job_id": self.job_id,
            "placement": self.placement.as_dict(),
            "profiling": int(self.profiling),
            "epoch": self.epoch,
            "created": self.created,
            "started": self.started,
            "stopping": int(self.stopping),
            "resume": int(self.resume),
            "devices": self.devices,
        }

    @classmethod
    def from_row(cls, row: Row) -> AttemptRecord:
        return cls(
            id=row["id"],
            seq=row["seq"],
            job_id=row["job_id"],
            placement=Config.of({k: int(v) for k, v in row["placement"].items()}),
            profiling=bool(row["profiling"]),
            epoch=row["epoch"],
            created=row["created"],
            devices={k: list(v) for k, v in (row["devices"] or {}).items()},
            resume=bool(row["resume"]),
            started=row["started"],
            stopping=bool(row["stopping"]),
            launched=row["started"] is not None,
        )


@dataclass(slots=True)
class NodeRecord:
    server: Server  # as configured (gpu type, GPU count)
    drained: bool = False
    health: str = NodeHealth.UNKNOWN
    last_beat: float | None = None
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
    exec_error_at: float = -1e18

    @property
    def id(self) -> str:
        return self.server.id

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


_FACTORS = ("compute_factor", "memory_factor", "data_factor")


def relative(nodes: list[NodeRecord]) -> None:
    """Set each node's planning calibration: measured or emulated factors divided by the median of its
    GPU type's nodes with calibrations of the same kind, so a typical server of a type reads 1.0.

    Kernels never reach datasheet peaks, so raw measured factors sit well below the 1.0 of servers
    without measurements; the estimator only needs how servers of one type differ (profiles carry
    each type's own speed), which the division keeps exactly.
    """
    groups: dict[tuple[str, str], list[NodeRecord]] = {}
    for node in nodes:
        cal = node.calibration
        node.planning_calibration = None
        if cal is not None and cal.source not in ("default", "hint"):
            kind = "measured" if cal.source.startswith("measured") else cal.source
            groups.setdefault((node.server.gpu_type, kind), []).append(node)
    for members in groups.values():
        medians = {f: statistics.median(getattr(n.calibration, f) for n in members) for f in _FACTORS}
        for node in members:
            assert node.calibration is not None
            node.planning_calibration = replace(
                node.calibration, **{f: getattr(node.calibration, f) / medians[f] for f in _FACTORS}
            )


def calibration_json(cal: Calibration) -> dict[str, float]:
    return {
        "compute_factor": cal.compute_factor,
        "memory_factor": cal.memory_factor,
        "data_factor": cal.data_factor,
        "link_gbps": cal.link_gbps,
        "net_gbps": cal.net_gbps,
    }


def time_profile(raw: dict[str, float]) -> TimeProfile:
    """A profiling run's profile.json (hopsmgr.runtime) as the estimator's TimeProfile."""
    td_hit = raw.get("td_hit_s", raw.get("td_s", 0.0))
    tw = raw.get("tw_s", 0.0)
    return TimeProfile(
        tf_s=raw.get("tf_s", 0.0),
        tb_s=raw.get("tb_s", 0.0),
        tu_s=raw.get("tu_s", 0.0),
        td_hit_s=td_hit,
        td_miss_s=raw.get("td_miss_s", td_hit),
        p_cache=min(max(raw.get("p_cache", 1.0), 0.0), 1.0),
        tw_hit_s=tw,
        tw_miss_s=tw,
    )


class MasterState:
    """Live jobs, open attempts and nodes, plus the store that makes every change durable."""

    def __init__(self, store: Store, servers: tuple[Server, ...], tenants: tuple[TenantQuota, ...]) -> None:
        self.store = store
        self.tenants = {t.name: t for t in tenants}
        self.nodes: dict[str, NodeRecord] = {s.id: NodeRecord(s) for s in servers}
        self.jobs: dict[str, JobRecord] = {}  # live jobs only
        self.attempts: dict[str, AttemptRecord] = {}  # open attempts only: add/remove through the methods
        self.on_node: dict[str, set[str]] = {s.id: set() for s in servers}  # open attempt ids per node
        self.devices_used: dict[str, set[int]] = {s.id: set() for s in servers}
        self.total_gpus = sum(s.gpus for s in servers)

    def add_attempt(self, attempt: AttemptRecord) -> None:
        self.attempts[attempt.id] = attempt
        for sid in attempt.placement.servers:
            self.on_node.setdefault(sid, set()).add(attempt.id)
        for sid, devices in attempt.devices.items():
            self.devices_used.setdefault(sid, set()).update(devices)

    def remove_attempt(self, attempt_id: str) -> AttemptRecord | None:
        attempt = self.attempts.pop(attempt_id, None)
        if attempt is not None:
            for sid in attempt.placement.servers:
                self.on_node.get(sid, set()).discard(attempt_id)
            for sid, devices in attempt.devices.items():
                self.devices_used.get(sid, set()).difference_update(devices)
        return attempt

    def attempts_on(self, node_id: str) -> list[AttemptRecord]:
        return [self.attempts[a] for a in sorted(self.on_node.get(node_id, ()))]

    def load(self) -> None:
        """Rebuild live jobs, open attempts and node settings from the store (after a restart)."""
        for row in self.store.nodes():
            node = self.nodes.get(row["id"])
            if node is None:
                continue
            node.drained = bool(row["drained"])
            node.workdir = row["workdir"]
            node.device_mode = row["device_mode"]
            if row["calibration"]:
                node.calibration = Calibration(
                    **row["calibration"], source=row["calibration_source"] or "measured"
                )
        live = [s.value for s in LIVE]
        for row in self.store.jobs(states=live, newest_first=False):
            self.jobs[row["id"]] = JobRecord.from_row(row)
        for row in self.store.open_attempts():
            attempt = AttemptRecord.from_row(row)
            job = self.jobs.get(attempt.job_id)
            if job is None:  # a terminal job with an attempt left open: close it now
                self.store.update_attempt(attempt.id, ended=row["created"], end_reason="orphaned")
                continue
            self.add_attempt(attempt)
            attempt.base_samples = job.done_samples
            if attempt.profiling:
                job.profiling.add(attempt.id)
            else:
                job.attempt = attempt.id

    def set_job_state(self, job: JobRecord, new: JobState, now: float, kind: str, message: str = "") -> None:
        """The one way a job changes state: the lifecycle table, the store row and a history event."""
        job.state = transition(job.state, new)
        job.state_since = now
        values: dict[str, Any] = {"state": new.value, "state_since": now, **job.counters()}
        if new in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
            job.ended = now
            values["ended"] = now
        if new == JobState.FAILED or kind in ("waiting",):
            job.reason = message
            values["reason"] = message
        values["has_checkpoint"] = int(job.has_checkpoint)
        with self.store.transaction():
            self.store.update_job(job.id, **values)
            self.store.add_event(job.id, now, kind, new.value, message)
        if new not in LIVE:
            self.jobs.pop(job.id, None)

    def event(self, job: JobRecord, now: float, kind: str, message: str) -> None:
        self.store.add_event(job.id, now, kind, job.state.value, message)

    def flush_progress(self) -> None:
        """Write the progress counters of running jobs (done samples, GPU time) in one transaction."""
        dirty = [j for j in self.jobs.values() if j.dirty]
        if not dirty:
            return
        with self.store.transaction():
            for job in dirty:
                self.store.update_job(job.id, **job.counters())
                job.dirty = False

    def held(self) -> dict[str, int]:
        """GPUs held per node by open attempts (running, launching, profiling or stopping)."""
        used: dict[str, int] = {}
        for a in self.attempts.values():
            for sid, g in a.placement.parts:
                used[sid] = used.get(sid, 0) + g
        return used


def build_snapshot(state: MasterState, now: float) -> tuple[ClusterSnapshot, list[JobSpec], dict[str, int]]:
    """The planner's view: usable capacity, the jobs it may place, and the jobs to profile.

    Healthy, undrained nodes give all their GPUs; suspect, lost or drained ones give only what their
    running jobs already hold (no new placements). GPUs of profiling and stopping attempts are taken out
    of the capacity; jobs being profiled or checkpointed are not planned this time. Returns the snapshot,
    the jobs that still need profiling, and the GPUs busy with work the planner does not own.
    """
    held = state.held()
    fixed: dict[str, int] = {}  # GPUs the planner cannot use: profiling and stopping attempts
    for a in state.attempts.values():
        job = state.jobs.get(a.job_id)
        if (
            a.profiling
            or a.stopping
            or job is None
            or job.state not in (JobState.RUNNING, JobState.LAUNCHING)
        ):
            for sid, g in a.placement.parts:
                fixed[sid] = fixed.get(sid, 0) + g
    capacity: dict[str, int] = {}
    for node in state.nodes.values():
        recent_error = now - node.exec_error_at < EXEC_ERROR_BACKOFF_S
        if node.health == NodeHealth.HEALTHY and not node.drained and not recent_error:
            usable = node.usable_gpus
        else:
            usable = held.get(node.id, 0)
        capacity[node.id] = max(0, usable - fixed.get(node.id, 0))
    views: list[JobView] = []
    to_profile: list[JobSpec] = []
    for job in state.jobs.values():
        if job.state == JobState.PENDING:
            to_profile.append(job.spec)
            continue
        if job.profiling or job.state not in (JobState.QUEUED, JobState.RUNNING, JobState.LAUNCHING):
            continue
        current: Config | None = None
        attempt_s = 0.0
        if job.attempt is not None:
            attempt = state.attempts[job.attempt]
            if attempt.stopping:
                continue
            current = attempt.placement
            attempt_s = max(0.0, now - (attempt.started or attempt.created))
        views.append(
            JobView(
                spec=job.spec,
                done_samples=job.done_samples,
                waited_s=max(0.0, now - job.submitted - job.running_s),
                attained_gpu_s=job.attained_gpu_s,
                running_s=job.running_s,
                current=current,
                attempt_s=attempt_s,
                restarts=job.restarts,
            )
        )
        if job.state == JobState.QUEUED:
            to_profile.append(job.spec)  # opportunistic: profile any GPU type it still lacks
    servers = tuple(n.effective_server() for n in state.nodes.values())
    snapshot = ClusterSnapshot(servers, capacity, tuple(views), now, dict(state.tenants))
    return snapshot, to_profile, fixed
