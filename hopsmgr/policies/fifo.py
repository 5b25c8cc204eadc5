"""Strict FIFO baseline.

FIFO (as Gavel's `fifo_perf` baseline in Narayanan et al., OSDI 2020, without its LP): jobs in arrival
order; no preemption, so running jobs keep their placement; each waiting job gets its smallest
requirement on the fastest GPU type (per-GPU rate from the estimator) with room for it, on one server if
one can hold it, else on the fewest servers. Head-of-line blocking: the first waiting job that fits
nowhere stops the queue (jobs that can never run, see `unplaceable_reasons`, are skipped, not waited
for). It fills GPUs freed by completions through fragment plans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobSpec, Server, ServerId
from hopsmgr.core.planner import Plan, PlanKind, SolverStats
from hopsmgr.core.priority import priority_values
from hopsmgr.core.queueorder import priority_context
from hopsmgr.policies.placement import (
    arrival_order,
    idle_after,
    kept_placements,
    pack,
    servers_by_type,
    take,
    type_gpus,
    unplaceable_reasons,
    usable_capacity,
)

Timer = Callable[[], float]


# -- the FIFO policy --------------------------------------------------------------------------------


class FifoPolicy:
    """Arrival order, no preemption, smallest requirement on the fastest type with room; strict FIFO."""

    name = "fifo"
    fragment_plans = True

    def __init__(self, round_seconds: float = 300.0) -> None:
        if not round_seconds > 0:
            raise ValueError(f"fifo: round_seconds must be > 0, got {round_seconds!r}")
        self.round_seconds = round_seconds
        self.description = "strict FIFO: arrival order, no preemption, head-of-line blocking"

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        t0 = timer()
        capacity = usable_capacity(snapshot)
        by_type = servers_by_type(snapshot, capacity)
        ordered = arrival_order(snapshot.jobs)
        free = dict(capacity)
        assignments = kept_placements(ordered, free)
        # A running job whose GPUs went away (a drained server) queues again in its arrival position.
        waiting = [v for v in ordered if v.id not in assignments]
        unplaceable = unplaceable_reasons(waiting, type_gpus(by_type, capacity), estimator, _smallest)
        for view in waiting:
            if view.id in unplaceable:
                continue
            config = self._place(view.spec, by_type, free, estimator)
            if config is None:
                break  # head-of-line blocking
            take(config, free)
            assignments[view.id] = config
        ctx = priority_context(snapshot, estimator)
        t1 = timer()
        return Plan(
            kind=kind,
            now=snapshot.now,
            assignments=assignments,
            order=tuple(v.id for v in ordered),
            priorities=priority_values("fifo", ordered, ctx),
            unplaceable=unplaceable,
            stats=SolverStats(method="greedy", model="fifo", solve_s=t1 - t0, total_s=t1 - t0),
            idle_gpus=idle_after(capacity, assignments),
        )

    @staticmethod
    def _place(
        job: JobSpec,
        by_type: Mapping[GpuType, Sequence[Server]],
        free: Mapping[ServerId, int],
        est: Estimator,
    ) -> Config | None:
        rated: list[tuple[float, GpuType]] = []
        for gpu_type in by_type:
            if not est.has_profile(job.id, gpu_type):
                continue
            rate = est.type_rate(job, gpu_type)
            if rate is not None and rate > 0:
                rated.append((rate, gpu_type))
        for _, gpu_type in sorted(rated, key=lambda rt: (-rt[0], rt[1])):
            config = pack(by_type[gpu_type], free, job.requirements.minimum, job.one_server)
            if config is not None:
                return config
        return None


def _smallest(job: JobSpec) -> int:
    return job.requirements.minimum
