"""Shared by the engine tests (test_engine.py, test_engine_fragments.py): the "paper" world on a small 16-GPU
cluster of four servers, scaled-down Poisson workloads, and the instrumentation: a recording wrapper around
the policy that sees every plan, and a `Simulation` subclass that checks the placements after every
reconciled plan and keeps each job's state history.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hopsmgr.control.diagram import EMITS
from hopsmgr.control.events import Event
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ClusterSnapshot, Config, RequirementSet, Server
from hopsmgr.core.planner import Plan, PlanKind
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import Policy, Timer
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.outcome import SimResult
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob, poisson_workload

WORLD = paper_world(seed=1)
SERVERS = (
    Server("rtx-a1", "rtx3090", 4, host_model="A", order=1),
    Server("rtx-a2", "rtx3090", 4, host_model="A", order=2),
    Server("txp-1", "titanxp", 4, order=3),
    Server("gtx-1", "gtx1080ti", 4, order=4),
)
CAPACITY = {s.id: s.gpus for s in SERVERS}
PROFILE_S = 60.0


def small_workload(
    world: World = WORLD, jobs: int = 8, rate: float = 30.0, seed: int = 2, scale: float = 0.1
) -> list[WorkloadJob]:
    """A Poisson workload with its work scaled down (every requirement fits the 16-GPU cluster)."""
    out = [
        dataclasses.replace(j, total_samples=j.total_samples * scale)
        for j in poisson_workload(world, jobs, rate, seed=seed)
    ]
    assert all(j.requirements.minimum <= 8 for j in out)
    return out


def one_job(
    job_id: str = "solo",
    model: str = "GPT-2 medium",
    gpus: int = 1,
    seconds: float = 1000.0,
    arrival: float = 0.0,
) -> WorkloadJob:
    """A rigid job with about `seconds` of work on one nominal reference GPU."""
    spec = WORLD.model(model)
    return WorkloadJob(
        job_id=job_id,
        arrival_s=arrival,
        model=spec.name,
        requirements=RequirementSet.rigid(gpus),
        total_samples=seconds * WORLD.reference_rate(spec.name, gpus),
        batch_size=spec.batch_size,
    )


# ------------------------------------------------------------------------------ instrumentation


class RecordingPolicy:
    """A real policy, wrapped: every plan call (kind, time, assignments) is recorded and checked."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.round_seconds = inner.round_seconds
        self.fragment_plans = inner.fragment_plans
        self.calls: list[tuple[PlanKind, float, dict[str, Config]]] = []
        self.problems: list[str] = []

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        plan = self.inner.plan(snapshot, estimator, kind, timer)
        self.calls.append((kind, snapshot.now, dict(plan.assignments)))
        used: Counter[str] = Counter()
        known = {v.id for v in snapshot.jobs}
        for job_id, config in plan.assignments.items():
            if job_id not in known:
                self.problems.append(f"t={snapshot.now}: plan assigns unknown job {job_id!r}")
            for sid, g in config.parts:
                used[sid] += g
        for sid, n in used.items():
            if n > snapshot.capacity.get(sid, 0):
                self.problems.append(f"t={snapshot.now} {kind}: plan gives {sid} {n} GPUs")
        return plan


class CheckedSimulation(Simulation):
    """After every event the machine handled: no server holds more GPUs than it has and no GPU index is
    given twice, every placed job is launching or running at one of its requirement counts on known
    servers, and each job is live in the machine or ended, never both."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.violations: list[str] = []
        handle = self.machine.handle

        def checked(event: Event, now: float) -> list[Any]:
            out = handle(event, now)
            allowed = EMITS[type(event)]
            self.violations += [
                f"{type(event).__name__} -> {type(c).__name__}" for c in out if not isinstance(c, allowed)
            ]
            return out

        self.machine.handle = checked  # type: ignore[method-assign]

    def feed(self, event: Event) -> None:
        super().feed(event)
        state = self.machine.state
        used: Counter[str] = Counter(state.occupied())
        if state.held() != state.held_recount():
            self.violations.append(
                f"t={self.now}: claims kept {state.held()}, counted {state.held_recount()}"
            )
        if state.profiling_gpus != state.profiling_gpus_recount():
            self.violations.append(
                f"t={self.now}: profiling GPUs kept {state.profiling_gpus}, "
                f"counted {state.profiling_gpus_recount()}"
            )
        for sid, n in state.held().items():
            if n > self.by_id[sid].gpus:
                self.violations.append(f"t={self.now}: {sid} claimed {n} GPUs")
        devices: Counter[tuple[str, int]] = Counter()
        for attempt in state.attempts.values():
            for sid in attempt.placement.servers:
                if sid not in self.by_id:
                    self.violations.append(f"t={self.now}: {attempt.id} on unknown server {sid!r}")
            if attempt.launched and sum(len(d) for d in attempt.devices.values()) != attempt.placement.gpus:
                self.violations.append(f"t={self.now}: {attempt.id} devices {attempt.devices}")
            for sid, ds in attempt.devices.items():
                devices.update((sid, d) for d in ds)
            job = state.jobs.get(attempt.job_id)
            if job is not None and job.attempt == attempt.id and not attempt.stopping:
                if job.state not in (JobState.RUNNING, JobState.LAUNCHING):
                    self.violations.append(f"t={self.now}: {job.id} placed in state {job.state}")
                if attempt.placement.gpus not in job.spec.requirements.counts:
                    self.violations.append(f"t={self.now}: {job.id} on {attempt.placement.gpus} GPUs")
        for sid, n in used.items():
            if n > CAPACITY.get(sid, self.by_id[sid].gpus):
                self.violations.append(f"t={self.now}: {sid} holds {n} GPUs")
        self.violations += [f"t={self.now}: GPU {k} given twice" for k, n in devices.items() if n > 1]
        for job_id in state.jobs:
            if self.jobs[job_id].final is not None:
                self.violations.append(f"t={self.now}: {job_id} ended and live")

    def _round(self) -> None:
        """The round's record against a recount: the largest free block from the claims counted
        afresh over every attempt, the smallest count over the queued jobs not profiling."""
        super()._round()
        record, state = self.rounds[-1], self.machine.state
        held = state.held_recount()
        free = [n.usable_gpus - held.get(sid, 0) for sid, n in state.nodes.items()]
        queued = [j for j in state.jobs.values() if j.state == JobState.QUEUED]
        counts = [j.spec.requirements.minimum for j in queued if not (j.profiling or state.waits_for(j))]
        expected = (max([0, *free]), min(counts, default=None), sum(f for f in free if f > 0), len(queued))
        got = (
            record.largest_free_block,
            record.smallest_waiting,
            record.idle_gpus_after_plan,
            record.jobs_waiting,
        )
        if got != expected:
            self.violations.append(f"t={self.now}: round record {got}, recounted {expected}")

    @property
    def live(self) -> dict[str, Any]:
        return self.machine.state.jobs

    def histories(self) -> dict[str, list[JobState]]:
        return {job_id: truth.history for job_id, truth in self.jobs.items()}


def simulate(
    policy: Policy | str,
    workload: Sequence[WorkloadJob],
    servers: Sequence[Server] = SERVERS,
    world: World = WORLD,
    estimator: Estimator | None = None,
    **options: Any,
) -> tuple[CheckedSimulation, RecordingPolicy, SimResult]:
    inner = make_policy(policy, SchedulerSettings()) if isinstance(policy, str) else policy
    wrapped = RecordingPolicy(inner)
    options.setdefault("profile_s", PROFILE_S)
    options.setdefault("seed", 1)
    sim = CheckedSimulation(
        world, servers, workload, wrapped, SimOptions(**options), time.perf_counter, estimator
    )
    return sim, wrapped, sim.run()
