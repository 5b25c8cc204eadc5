"""What a simulation run reports (`SimResult`, with per-job `JobOutcome`s, `BackfillRecord`s and the
estimator's error samples), and how it is measured from the ground truth at the run's end: each job's
record against the world's true speeds, and what became of each promise a backfill made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hopsmgr.control import snapshot as views
from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.control.records import Job
from hopsmgr.core import metrics
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.metrics import JobRecord, RoundRecord
from hopsmgr.core.model import JobId, Server
from hopsmgr.core.plan import Backfill
from hopsmgr.core.priority import PriorityContext, expected_run_s
from hopsmgr.sim.simstate import JobTruth
from hopsmgr.sim.truth import World


@dataclass(frozen=True, slots=True)
class EstimatorSample:
    time_s: float
    ape: float
    seen: bool


@dataclass(slots=True)
class SimResult:
    policy: str
    description: str
    jobs: list[JobRecord]
    rounds: list[RoundRecord]
    estimator: list[EstimatorSample]
    timeline: list[tuple[float, float, int]]  # (time, normalised throughput, idle GPUs while jobs wait)
    preemptions: int
    migrations: int
    busy_gpu_s: float
    total_gpus: int
    span_s: float
    per_job: list[JobOutcome] = field(default_factory=list)
    backfills: list[BackfillRecord] = field(default_factory=list)
    reserved_jobs: int = 0  # jobs that got a reservation (hopsmgr.core.reserve)


@dataclass(frozen=True, slots=True)
class BackfillRecord:
    """One attempt started on reserved GPUs: the reservation's start it promised to end by, and when it
    left them. `late`: still there after the promised start, its reserved job not yet started."""

    job_id: str
    reserved_for: str
    until_s: float
    launched_s: float
    left_s: float
    late: bool


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job beyond its JobRecord: its requirement set, the GPU types it ran on, how
    often it was preempted and moved (the rows of `hopsmgr simulate --out`'s jobs.csv)."""

    job_id: str
    gpus: tuple[int, ...]
    gpu_types: tuple[str, ...]
    preemptions: int
    moves: int


def round_record(machine: SchedulerMachine, now: float, solver_s: float, total_gpus: int) -> RoundRecord:
    """The cluster as a round's plans left it: idle GPUs, the largest free block, the jobs waiting."""
    state = machine.state
    free = views.free_gpus_by_server(state, now, machine.settings.exec_error_backoff_s)
    idle = sum(free.values())
    queued = [j for j in state.jobs.values() if j.state == JobState.QUEUED]
    # a job still profiling on some type, or waiting for another to complete, is not planned now
    counts = [j.spec.requirements.minimum for j in queued if not j.profiling and not state.waits_for(j)]
    return RoundRecord(
        start=now,
        idle_gpus_after_plan=idle,
        jobs_waiting=len(queued),
        solver_s=solver_s,
        busy_gpus=total_gpus - idle,
        total_gpus=total_gpus,
        largest_free_block=max(free.values(), default=0),
        smallest_waiting=min(counts, default=None),
    )


def true_context(
    world: World, servers: Sequence[Server], jobs: Sequence[JobTruth], now: float
) -> PriorityContext:
    """The priorities' context with the world's true speeds, for the records' expected run times."""
    total_gpus = sum(s.gpus for s in servers)
    shares: dict[str, float] = {}
    for s in servers:
        shares[s.gpu_type] = shares.get(s.gpu_type, 0.0) + s.gpus / total_gpus
    models = {j.spec.id: j.w.model for j in jobs}
    return PriorityContext(
        now=now,
        type_share=shares,
        rate=lambda spec, gpu_type: world.reference_rate(models[spec.id], 1, gpu_type),
        total_gpus=total_gpus,
    )


def job_records(
    jobs: Sequence[JobTruth],
    ctx: PriorityContext,
    live: Mapping[JobId, Job],
    live_integral: float,
    now: float,
) -> list[JobRecord]:
    """Each job's record; `live_integral` is the integral of live jobs over time up to `now` (a job's
    contenders are its average over the job's life), `live` the machine's jobs not yet ended."""
    records = []
    for job in jobs:
        expected = expected_run_s(job.spec, ctx)  # the one formula, with the world's true speeds
        end_or_now = job.end if job.end is not None else now
        life = end_or_now - job.w.arrival_s
        integral = (
            job.end_integral if job.end_integral is not None else live_integral
        ) - job.arrival_integral
        contenders = integral / life if life > 0 else 1.0
        ideal = expected * max(1.0, contenders * job.spec.requirements.mean / ctx.total_gpus)
        live_job = live.get(job.spec.id)
        running = job.running_s if live_job is None else live_job.running_s
        records.append(
            JobRecord(
                job_id=job.spec.id,
                tenant=job.spec.tenant,
                gpus_min=job.spec.requirements.minimum,
                submit_time=job.w.arrival_s,
                first_start=job.first_start,
                end_time=job.end,
                waited_s=max(0.0, life - running),
                expected_run_s=expected,
                ideal_s=ideal,
                completed=job.final == JobState.COMPLETED,
            )
        )
    return records


def job_outcomes(jobs: Sequence[JobTruth], live: Mapping[JobId, Job]) -> list[JobOutcome]:
    """Each job's outcome: its ended counters, or the machine's live ones for a job not yet ended."""

    def counter(job: JobTruth, ended: int, name: str) -> int:
        if job.final is not None:
            return ended
        live_job = live.get(job.spec.id)
        return int(live_job.counters()[name]) if live_job is not None else 0

    return [
        JobOutcome(
            j.spec.id,
            j.spec.requirements.counts,
            tuple(sorted(j.gpu_types)),
            counter(j, j.preemptions, "preemptions"),
            counter(j, j.moves, "migrations"),
        )
        for j in jobs
    ]


def backfill_records(
    backfills: Iterable[tuple[str, Backfill, float, float]], first_start: Callable[[str], float | None]
) -> list[BackfillRecord]:
    """Each backfilled attempt as (job, promise, launched, left; left is inf while it runs) and whether
    it was late: still on the reserved GPUs past the promised start, its reserved job not yet started."""
    out = []
    for job_id, promise, launched, left in backfills:
        first = first_start(promise.reserved_for)
        waiting = first is None or first > promise.until_s
        late = left > promise.until_s + 1.0 and waiting
        out.append(BackfillRecord(job_id, promise.reserved_for, promise.until_s, launched, left, late))
    return out


def error_over_time(result: SimResult, bins: int = 48) -> list[dict[str, float | None]]:
    """The estimator's MAPE per time bin (hours since the first arrival; at least 1 h per bin, about
    `bins` bins): `seen` over configurations the job had run on, `unseen` over the others."""
    samples = result.estimator
    if not samples:
        return []
    start = result.timeline[0][0] if result.timeline else min(x.time_s for x in samples)
    span_h = max(x.time_s for x in samples) / 3600.0 - start / 3600.0
    width = max(1.0, math.ceil(span_h / bins))
    grouped: dict[int, tuple[list[float], list[float]]] = {}
    for x in samples:
        k = int((x.time_s - start) / 3600.0 // width)
        seen, unseen = grouped.setdefault(k, ([], []))
        (seen if x.seen else unseen).append(x.ape)
    return [
        {"hour": k * width, "seen": metrics.mean(seen), "unseen": metrics.mean(unseen)}
        for k, (seen, unseen) in sorted(grouped.items())
    ]
