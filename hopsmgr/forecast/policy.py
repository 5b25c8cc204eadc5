"""The plan forecasts run with: Hops' queue order, placed greedily (fast enough for hundreds of rounds).

A forecast plans every simulated round, so it cannot afford the Hops planner's program (about a
second for 1,000 jobs on 512 GPUs). This policy orders jobs by the priority the Hops policy uses
(latency ratio times tenant weight, hopsmgr.core.priority) and places each at its smallest GPU count on
the fastest profiled GPU type with room (best fit, fewest servers: hopsmgr.policies.placement.pack),
within its tenant's cap, skipping jobs that do not fit (backfill). Fragment plans keep what runs; first
plans rank running jobs with `keep_bonus` added to their priority, so a waiting job whose latency ratio
is that much higher takes a running job's GPUs (the running job is checkpointed and queued again), as
Hops' rounds preempt for the jobs that waited longest. What it leaves out of Hops' plan: the
program's weighing of restart costs, moves, and larger counts of a requirement set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobSpec, JobView, Server, ServerId
from hopsmgr.core.plan import SolverStats
from hopsmgr.core.planner import Plan, PlanKind, priority_context
from hopsmgr.core.priority import order_queue, priority_values
from hopsmgr.policies.placement import (
    fits,
    idle_after,
    kept_placements,
    pack,
    servers_by_type,
    take,
    usable_capacity,
)

Timer = Callable[[], float]


class ForecastPolicy:
    name = "forecast"
    description = "Hops order (latency ratio x weight), greedy placement at the smallest count"
    fragment_plans = True

    def __init__(
        self, round_seconds: float, priority: str = "latency_ratio", keep_bonus: float = 0.25
    ) -> None:
        self.round_seconds = round_seconds
        self.priority = priority
        self.keep_bonus = keep_bonus

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        """Fragment plans keep what runs and fill idle GPUs; first plans go through all jobs by priority,
        so a waiting job well ahead of a running one (by `keep_bonus`) may take its GPUs (a preemption)."""
        t0 = timer()
        capacity = usable_capacity(snapshot)
        by_type = servers_by_type(snapshot, capacity)
        free = dict(capacity)
        ctx = priority_context(snapshot, estimator)
        values = priority_values(self.priority, snapshot.jobs, ctx)
        assignments: dict[str, Config] = {}
        used: dict[str, int] = {}
        if kind == "first":
            ranked = {v.id: values[v.id] + self._bonus(v) for v in snapshot.jobs}
            order = order_queue(snapshot.jobs, ranked)
        else:
            running = [v for v in snapshot.jobs if v.current is not None]
            assignments = kept_placements(running, free)
            for view in running:
                if view.id in assignments:
                    used[view.spec.tenant] = used.get(view.spec.tenant, 0) + assignments[view.id].gpus
            order = order_queue([v for v in snapshot.jobs if v.id not in assignments], values)
        room = sum(free.values())
        for view in order:
            need = view.spec.requirements.minimum
            if room < need:
                continue
            quota = snapshot.tenants.get(view.spec.tenant)
            cap = quota.cap_gpus if quota is not None else None
            if cap is not None and used.get(view.spec.tenant, 0) + need > cap:
                continue
            config = view.current if view.current is not None and fits(view.current, free) else None
            config = config or _place(view.spec, by_type, free, estimator)
            if config is None:
                continue
            take(config, free)
            room -= config.gpus
            used[view.spec.tenant] = used.get(view.spec.tenant, 0) + config.gpus
            assignments[view.id] = config
        t1 = timer()
        return Plan(
            kind=kind,
            now=snapshot.now,
            assignments=assignments,
            priorities=values,
            stats=SolverStats(method="greedy", model="forecast", solve_s=t1 - t0, total_s=t1 - t0),
            idle_gpus=idle_after(capacity, assignments),
        )

    def _bonus(self, view: JobView) -> float:
        """What a placed job adds to its rank in a first plan: `keep_bonus`, or everything for one placed
        less than a round ago (a launch is never stopped before it started; no stop right after a start)."""
        if view.current is None:
            return 0.0
        return math.inf if view.attempt_s < self.round_seconds else self.keep_bonus


def _place(
    job: JobSpec, by_type: Mapping[GpuType, Sequence[Server]], free: Mapping[ServerId, int], est: Estimator
) -> Config | None:
    rated: list[tuple[float, GpuType]] = []
    for gpu_type in by_type:
        if est.has_profile(job.id, gpu_type):
            rate = est.type_rate(job, gpu_type)
            if rate is not None and rate > 0:
                rated.append((rate, gpu_type))
    for _, gpu_type in sorted(rated, key=lambda rt: (-rt[0], rt[1])):
        config = pack(by_type[gpu_type], free, job.requirements.minimum)
        if config is not None:
            return config
    return None
