"""The simulator's hidden bookkeeping, shared by its drivers (hopsmgr.sim.engine and the forecasts'
futures, hopsmgr.forecast.future): the run options, the ground truth's key of a job instance, what the
truth knows of a run attempt (`SimRun`) and of a job (`JobTruth`), and the simulator's own timer events,
which never reach the scheduler's state machine.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hopsmgr.control.events import AttemptEnded, Event
from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobSpec, Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import Policy
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob


@dataclass(frozen=True, slots=True)
class SimOptions:
    profile_s: float = 60.0
    charge_solver: bool = False
    restart_costs: bool = True  # launches pay the model's restart cost; checkpoints take time to write
    profiling: bool = True
    observe_every_s: float = 300.0
    checkpoint_bytes_per_s: float = 200e6  # checkpoint write speed (GPUs stay held meanwhile)
    checkpoint_fixed_s: float = 5.0
    # a launch's true start-up, when not the job's restart_s (the planner sees restart_s either way)
    launch_s: float | None = None
    round_phase_s: float = 0.0  # the first round this long after the first arrival (live: the master's clock)
    profile_iterations: int = 0  # > 0: a profiling run lasts profile_s + this many iterations
    max_sim_s: float = 60 * 86_400.0  # a run stops this long after the last arrival (a starving policy)
    seed: int = 0
    # > 0: fragment plans at most this often (the forecasts' futures: fewer plans; the master plans at once)
    fragment_gap_s: float = 0.0
    # > 0: rounds and fragment plans also at least this fraction of the simulated time since the run
    # started apart (the forecasts' futures: a start a day ahead needs no finer clock than its own
    # uncertainty, so a future of days makes ~100 rounds, not ~1,000)
    round_growth: float = 0.0

    def checkpoint_write_s(self, params_bytes: float) -> float:
        """How long a checkpoint of a model this large takes to write (its GPUs stay held meanwhile)."""
        if not self.restart_costs:
            return 0.0
        return self.checkpoint_fixed_s + params_bytes / self.checkpoint_bytes_per_s


def job_key(job_id: str) -> int:
    """The hidden per-job-instance key of the ground truth (never 0: 0 means "the model's plain rate")."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big") or 1


@dataclass(slots=True)
class SimRun:
    """What the ground truth knows of a run attempt: its true rate and when it makes progress."""

    attempt_id: str
    job_id: str
    config: Config
    rate: float
    launched: float
    ready_at: float
    base: float  # samples done when it launched
    token: int  # a scheduled end carries it; a stop changes it (the end is then void)
    stopped: bool = False
    shares: tuple[float, ...] = ()  # each rank's share of the global batch, as the launch gave them

    def done_at(self, t: float) -> float:
        return self.base + self.rate * max(0.0, t - self.ready_at)


@dataclass(slots=True)
class JobTruth:
    """What the ground truth knows of one job: its progress, its life's times and what it ran on."""

    w: WorkloadJob
    spec: JobSpec
    done: float = 0.0
    first_start: float | None = None
    end: float | None = None
    final: JobState | None = None
    running_s: float = 0.0
    arrival_integral: float = 0.0
    end_integral: float | None = None
    last_observed: float = -math.inf
    ran_on: set[str] = field(default_factory=set)
    history: list[JobState] = field(default_factory=list)
    gpu_types: set[str] = field(default_factory=set)
    preemptions: int = 0
    moves: int = 0


def job_truths(world: World, workload: Sequence[WorkloadJob], restart_costs: bool) -> list[JobTruth]:
    """The workload's jobs in arrival order, each with the spec its user submits (the model's restart
    cost, when launches pay it)."""
    jobs = []
    for w in sorted(workload, key=lambda w: (w.arrival_s, w.job_id)):
        model = world.model(w.model)
        spec = JobSpec(
            id=w.job_id,
            requirements=w.requirements,
            total_samples=w.total_samples,
            batch_size=w.batch_size,
            tenant=w.tenant,
            model=w.model,
            params_bytes=model.params_bytes,
            submit_time=w.arrival_s,
            restart_s=model.restart_s if restart_costs else 0.0,
        )
        jobs.append(JobTruth(w, spec))
    return jobs


def scheduler_machine(
    servers: Sequence[Server],
    policy: Policy,
    profiling: bool,
    estimator: Estimator | None,
    tenants: Mapping[str, TenantQuota] | None,
    workload: Sequence[WorkloadJob],
) -> SchedulerMachine:
    """The master's state machine as a simulation drives it: the policy's scheduler settings and rounds,
    and the tenants declared, plus those of the workload's jobs the declaration does not name."""
    base = getattr(policy, "settings", None)
    scheduler = base if isinstance(base, SchedulerSettings) else SchedulerSettings()
    settings = ControlSettings(
        scheduler=replace(scheduler, round_seconds=policy.round_seconds),
        fragment_plans=policy.fragment_plans,
        profiling=profiling,
        observe_every_s=0.0,  # the simulator reports every observe_every_s itself
    )
    # A trace's tenants (Philly's virtual clusters) need not be declared in the cluster file: those
    # it does not name get the defaults (no guarantee, no cap, weight 1), as they would be declared.
    quotas = dict(tenants or {})
    if quotas:
        for w in workload:
            quotas.setdefault(w.tenant, TenantQuota(w.tenant))
    return SchedulerMachine(tuple(servers), tuple(quotas.values()), settings, estimator, started=0.0)


def unseen_server(servers: Sequence[Server], excluded: set[str], rng: random.Random) -> Server | None:
    """A server drawn uniformly from those not in `excluded` (None if there is none)."""
    if len(excluded) >= len(servers):
        return None
    if len(excluded) * 2 < len(servers):  # rejection sampling: on average < 2 draws
        while True:
            server = servers[rng.randrange(len(servers))]
            if server.id not in excluded:
                return server
    unseen = [s for s in servers if s.id not in excluded]
    return rng.choice(unseen) if unseen else None


@dataclass(frozen=True, slots=True)
class RunEnd(Event):
    """The simulator's own timer: a run attempt's true end (void when its token is stale)."""

    attempt_id: str = ""
    token: int = 0
    ended: AttemptEnded | None = None


@dataclass(frozen=True, slots=True)
class FragmentWake(Event):
    """The simulator's own timer: a fragment plan held back by `fragment_gap_s` may run now."""


@dataclass(frozen=True, slots=True)
class ObserveTick(Event):
    """The simulator's own timer: running attempts report their throughput (every observe_every_s)."""


@dataclass(frozen=True, slots=True)
class ProfileEnd(Event):
    """The simulator's own timer: a profiling run's end (void when its token is stale)."""

    attempt_id: str = ""
    token: int = 0
