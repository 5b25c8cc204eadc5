"""The scheduler state machine's records: live jobs, open attempts, nodes (mutable, owned by the machine).

Only `hopsmgr.control.machine` changes them; drivers read them for views and write what `Persist`
commands carry. `ControlState` also answers the questions every decision asks: which GPUs are held,
which are usable, which device indices are free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from hopsmgr.core.estimator import Estimator, TimeProfile
from hopsmgr.core.fairshare import TenantUsage
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobId, JobSpec, Server, ServerId, TenantQuota


class NodeHealth:
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    LOST = "LOST"
    UNKNOWN = "UNKNOWN"  # configured, no heartbeat yet since the machine started


@dataclass(frozen=True, slots=True)
class EndedJob:
    """A job that ran to completion, as the machine knew it when it ended: its spec, when it was
    submitted and its profiles ((GPU type, profile)). The forecasts draw new
    jobs from recent submissions, ended ones included (hopsmgr.forecast.future)."""

    spec: JobSpec
    submitted: float
    profiles: tuple[tuple[str, TimeProfile], ...]

    @classmethod
    def of(cls, job: Job, estimator: Estimator) -> EndedJob | None:
        """The job with its profiles as `estimator` holds them (None: it has none)."""
        found = ((t, estimator.profile_of(job.id, t)) for t in sorted(estimator.profiled_types(job.id)))
        profiles = tuple((t, p[0]) for t, p in found if p is not None)
        return cls(job.spec, job.submitted, profiles) if profiles else None


@dataclass(slots=True)
class Job:
    spec: JobSpec
    state: JobState
    submitted: float
    state_since: float
    done_samples: float = 0.0
    attained_gpu_s: float = 0.0
    running_s: float = 0.0
    restarts: int = 0
    preemptions: int = 0
    migrations: int = 0
    node_losses: int = 0
    failures: int = 0
    reason: str | None = None
    has_checkpoint: bool = False
    ended: float | None = None
    first_start: float | None = None
    attempt: str | None = None  # the open run attempt
    moving_to: str | None = None  # a move: the attempt that launches once this job's checkpoint is written
    profiling: set[str] = field(default_factory=set)  # open profiling attempts

    @property
    def id(self) -> JobId:
        return self.spec.id

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    def counters(self) -> dict[str, float]:
        return {
            "done_samples": self.done_samples,
            "attained_gpu_s": self.attained_gpu_s,
            "running_s": self.running_s,
            "restarts": self.restarts,
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "node_losses": self.node_losses,
            "failures": self.failures,
        }


# The attempt fields that decide its claim on GPUs (ControlState.held keeps per-node counts of them,
# ControlState.profiling_gpus the profiling attempts' GPUs).
_CLAIM_FIELDS = frozenset({"placement", "launched", "stopping", "profiling"})


@dataclass(slots=True)
class Attempt:
    id: str
    job_id: JobId
    placement: Config
    profiling: bool
    created: float
    devices: dict[ServerId, tuple[int, ...]]
    resume: bool = False
    gpu_type: str = ""  # profiling runs: the GPU type profiled
    waits_for: set[str] = field(default_factory=set)  # attempts that must end before this one launches
    launched: bool = False  # its launch command was sent
    started: float | None = None  # the node confirmed it runs
    stopping: bool = False
    stop_reason: str = ""
    stop_sent: bool = False  # this machine sent the stop (False for a stop restored from the store)
    unseen_beats: int = 0  # heartbeats of its primary node that did not list it
    last_observed: float = -math.inf  # its last throughput observation (at most every observe_every_s)
    progressed_at: float = -math.inf  # its last progress report: the job's done_samples are as of then
    charged_until: float = -math.inf  # its tenant was charged for its GPUs up to here (fair share)
    _owner: ControlState | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def primary(self) -> ServerId:
        return self.placement.parts[0][0]

    def __setattr__(self, name: str, value: object) -> None:
        # an open attempt's claim change is counted by the state that holds it (ControlState.held)
        owner = getattr(self, "_owner", None) if name in _CLAIM_FIELDS else None
        if owner is not None:
            owner._count_claim(self, -1)
        object.__setattr__(self, name, value)
        if owner is not None:
            owner._count_claim(self, +1)

    def __getstate__(self) -> list[object]:
        """Copies and pickles leave the holding state behind (a copy is not open in that state)."""
        return [None if name == "_owner" else getattr(self, name) for name in _ATTEMPT_FIELDS]

    def __setstate__(self, state: list[object]) -> None:
        for name, value in zip(_ATTEMPT_FIELDS, state, strict=True):
            object.__setattr__(self, name, value)


_ATTEMPT_FIELDS = tuple(f.name for f in fields(Attempt))  # its pickled state, in this order


@dataclass(slots=True)
class Node:
    server: Server  # as the planner sees it (calibration applied)
    usable_gpus: int
    health: str = NodeHealth.UNKNOWN
    drained: bool = False
    last_beat: float | None = None
    exec_error_at: float = -math.inf


@dataclass(slots=True)
class ControlState:
    nodes: dict[ServerId, Node]
    tenants: dict[str, TenantQuota]
    jobs: dict[JobId, Job] = field(default_factory=dict)  # live jobs only
    attempts: dict[str, Attempt] = field(default_factory=dict)  # open attempts only
    devices_used: dict[ServerId, set[int]] = field(default_factory=dict)
    on_node: dict[ServerId, set[str]] = field(default_factory=dict)  # open attempt ids per node
    waiting_on: dict[str, set[str]] = field(default_factory=dict)  # attempt -> attempts waiting for its end
    total_gpus: int = 0
    gpu_types: frozenset[str] = frozenset()
    type_share: dict[str, float] = field(default_factory=dict)
    type_gpus: dict[str, int] = field(default_factory=dict)  # configured GPUs per type
    counts: dict[JobState, int] = field(default_factory=dict)  # live jobs per state
    usage: dict[str, TenantUsage] = field(default_factory=dict)  # fair share: decayed use per tenant
    # live jobs not yet known to have a profile on every GPU type (in the order of `jobs`): the ones
    # a plan request looks at for profiling (the machine drops those it finds profiled everywhere)
    unprofiled: dict[JobId, None] = field(default_factory=dict, repr=False, compare=False)
    # GPUs per node that launched open attempts hold now, and that open attempts will hold once their
    # stops end (ControlState.held), kept as attempts open, change and end
    claimed_now: dict[ServerId, int] = field(default_factory=dict, repr=False, compare=False)
    claimed_after: dict[ServerId, int] = field(default_factory=dict, repr=False, compare=False)
    # GPUs of the open profiling attempts (launched or not), kept as attempts open, change and end
    profiling_gpus: int = field(default=0, repr=False, compare=False)

    def add_job(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.unprofiled[job.id] = None
        self.counts[job.state] = self.counts.get(job.state, 0) + 1

    def pop_job(self, job_id: JobId) -> Job | None:
        job = self.jobs.pop(job_id, None)
        self.unprofiled.pop(job_id, None)
        if job is not None:
            self.counts[job.state] -= 1
            if not self.counts[job.state]:
                del self.counts[job.state]
        return job

    def moved(self, old: JobState, new: JobState) -> None:
        """Keep `counts` true when a live job changes state."""
        self.counts[old] = self.counts.get(old, 0) - 1
        if not self.counts[old]:
            del self.counts[old]
        self.counts[new] = self.counts.get(new, 0) + 1

    def __post_init__(self) -> None:
        self.total_gpus = sum(n.server.gpus for n in self.nodes.values())
        self.gpu_types = frozenset(n.server.gpu_type for n in self.nodes.values())
        for n in self.nodes.values():
            t = n.server.gpu_type
            self.type_share[t] = self.type_share.get(t, 0.0) + n.server.gpus / max(1, self.total_gpus)
            self.type_gpus[t] = self.type_gpus.get(t, 0) + n.server.gpus

    def add_attempt(self, attempt: Attempt) -> None:
        self.attempts[attempt.id] = attempt
        object.__setattr__(attempt, "_owner", self)
        self._count_claim(attempt, +1)
        for sid in attempt.placement.servers:
            self.on_node.setdefault(sid, set()).add(attempt.id)

    def wait(self, attempt: Attempt, on: set[str]) -> None:
        """`attempt` launches only once every attempt in `on` has ended."""
        attempt.waits_for = set(on)
        for other in on:
            self.waiting_on.setdefault(other, set()).add(attempt.id)

    def assign_devices(self, attempt: Attempt) -> None:
        """Give a launching attempt the lowest free GPU indices of each of its servers (at launch, once
        the attempts it waited for have ended and given theirs back)."""
        attempt.devices = self.free_devices(attempt.placement)
        for sid, devices in attempt.devices.items():
            self.devices_used.setdefault(sid, set()).update(devices)

    def remove_attempt(self, attempt_id: str) -> Attempt | None:
        attempt = self.attempts.pop(attempt_id, None)
        if attempt is not None:
            self._count_claim(attempt, -1)
            object.__setattr__(attempt, "_owner", None)
            for sid, devices in attempt.devices.items():
                self.devices_used.get(sid, set()).difference_update(devices)
            for sid in attempt.placement.servers:
                self.on_node.get(sid, set()).discard(attempt_id)
            for other in attempt.waits_for:
                self.waiting_on.get(other, set()).discard(attempt_id)
        return attempt

    def free_devices(self, config: Config) -> dict[ServerId, tuple[int, ...]]:
        """The lowest free GPU indices on each server of `config`."""
        out: dict[ServerId, tuple[int, ...]] = {}
        for sid, g in config.parts:
            used = self.devices_used.get(sid, set())
            out[sid] = tuple(d for d in range(self.nodes[sid].server.gpus) if d not in used)[:g]
        return out

    def held(self) -> dict[ServerId, int]:
        """GPUs claimed per node by open attempts: launched ones (running, profiling, stopping) and
        those waiting to launch. A waiting attempt takes over GPUs its stops free, so a node's claim
        is the larger of what launched attempts hold now and what will be held once stops end.
        From counts kept as attempts change (`held_recount` counts afresh; tests compare the two)."""
        now, after = self.claimed_now, self.claimed_after
        held = {sid: max(g, after.get(sid, 0)) for sid, g in now.items() if g}
        for sid, g in after.items():
            if g and sid not in held:
                held[sid] = g
        return held

    def held_recount(self) -> dict[ServerId, int]:
        now: dict[ServerId, int] = {}
        after: dict[ServerId, int] = {}
        for a in self.attempts.values():
            for sid, g in a.placement.parts:
                if a.launched:
                    now[sid] = now.get(sid, 0) + g
                if not (a.launched and a.stopping):
                    after[sid] = after.get(sid, 0) + g
        return {sid: max(now.get(sid, 0), after.get(sid, 0)) for sid in now.keys() | after.keys()}

    def _count_claim(self, attempt: Attempt, sign: int) -> None:
        launched, after_too = attempt.launched, not (attempt.launched and attempt.stopping)
        for sid, g in attempt.placement.parts:
            if launched:
                self.claimed_now[sid] = self.claimed_now.get(sid, 0) + sign * g
            if after_too:
                self.claimed_after[sid] = self.claimed_after.get(sid, 0) + sign * g
            if attempt.profiling:
                self.profiling_gpus += sign * g

    def profiling_gpus_recount(self) -> int:
        """`profiling_gpus` counted afresh (tests compare the two)."""
        return sum(a.placement.gpus for a in self.attempts.values() if a.profiling)

    def occupied(self) -> dict[ServerId, int]:
        """GPUs in use per node right now: launched attempts only."""
        used: dict[ServerId, int] = {}
        for a in self.attempts.values():
            if a.launched:
                for sid, g in a.placement.parts:
                    used[sid] = used.get(sid, 0) + g
        return used

    def waits_for(self, job: Job) -> list[JobId]:
        """The jobs of `job.spec.after` still live: it is neither profiled nor planned until they end."""
        return [dep for dep in job.spec.after if dep in self.jobs]

    def attempts_on(self, node_id: ServerId) -> list[Attempt]:
        return [self.attempts[a] for a in sorted(self.on_node.get(node_id, ()))]
