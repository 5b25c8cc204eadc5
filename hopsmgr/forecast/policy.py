"""The plan forecasts run with: the Hops planner while it is cheap, then Hops' queue and service
window, placed greedily (fast enough for hundreds of simulated rounds).

With `exact_s` and a clock, plans are the Hops planner's own (hopsmgr.policies.base.HopsPolicy, the
master's settings) until they have taken `exact_s` of wall time in all, each solve limited to what is
left, and one begun only while what is left is at least what the last one took: the near future,
where short waits are decided, as the master would plan it. A plan where the planner could not answer
in time (its stats name a fallback) is replaced by the greedy plan, which the future keeps to from
then on (and so do the forecast's later futures: hopsmgr.forecast.run). A forecast plans
every simulated round, so it cannot afford the program all the way (about a second for 1,000 jobs on
512 GPUs). Past that, this policy takes the queue as the Hops planner takes it
(hopsmgr.core.planner.queue_order: the same priority values, fair-share factors, and the jobs owed
GPUs under their tenant's guarantee first) and the same service window (hopsmgr.core.window: the head
of the queue whose smallest requests fill the cluster; a job behind it waits, even beside idle GPUs,
so that wide jobs are not starved by narrow ones filling every gap), and places each window job at its
smallest GPU count on the fastest profiled GPU type with room (best fit, fewest servers:
hopsmgr.policies.placement.pack), within its tenant's cap.

Fragment plans keep what runs and fill idle GPUs from the window of waiting jobs. First plans keep
the running jobs the planner protects (hopsmgr.core.program.protected), then go through the window
with `keep_bonus` added to a running job's priority, so that a waiting job whose priority is that much
higher takes a running job's GPUs (a preemption), as Hops' rounds preempt for the jobs that waited
longest; running jobs behind the window keep what they hold where it is still free. What it leaves
out of Hops' plan: the program's weighing of restart costs and moves (among them the exact model's
moves of running jobs behind the window that free whole servers for a wide job: forecasts for wide
jobs on small clusters are pessimistic there), and larger counts of a requirement set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import (
    ClusterSnapshot,
    Config,
    GpuType,
    JobSpec,
    JobView,
    Server,
    ServerId,
    spans_types,
)
from hopsmgr.core.plan import SolverStats
from hopsmgr.core.planner import Plan, PlanKind
from hopsmgr.core.program import protected
from hopsmgr.core.queueorder import queue_order
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.core.window import service_window
from hopsmgr.policies.base import HopsPolicy
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
EXACT_MIN_S = 0.02  # no plan by the Hops planner with less of the allowance left than this


class ForecastPolicy:
    name = "forecast"
    description = "Hops queue and window, greedy placement at the smallest count"
    fragment_plans = True

    def __init__(
        self,
        settings: SchedulerSettings,
        keep_bonus: float = 0.0,
        fixed_rates: bool = False,
        exact_s: float = 0.0,
        clock: Timer | None = None,
    ) -> None:
        self.settings = settings
        # plans by the Hops planner itself while they have cost less than `exact_s` of `clock` in all
        self.exact = HopsPolicy(settings) if exact_s > 0 and clock is not None else None
        self.exact_left = exact_s
        self.exact_last = 0.0  # how long the last of them took
        self.clock = clock
        self.exact_made = 0
        self.exact_fell_back = False
        self.round_seconds = settings.round_seconds
        self.keep_bonus = keep_bonus
        # fixed_rates (a future: its estimator learns nothing and its servers stay): each job's seconds
        # per sample, and whether it is profiled on a type of the cluster, are found once for all plans
        self.per_sample: dict[str, float] | None = {} if fixed_rates else None
        self._profiled: dict[str, frozenset[str]] | None = {} if fixed_rates else None

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        if (
            self.exact is not None
            and self.clock is not None
            and self.exact_left >= max(EXACT_MIN_S, self.exact_last)  # the next is likely to fit
        ):
            self.exact.settings = replace(
                self.settings, time_limit_s=min(self.settings.time_limit_s, self.exact_left)
            )
            t0 = self.clock()
            plan = self.exact.plan(snapshot, estimator, kind, self.clock)
            self.exact_last = self.clock() - t0
            self.exact_left -= self.exact_last
            self.exact_made += 1
            if plan.stats.fallback is None:
                return plan
            # the planner could not answer within what was left (a large cluster, a loaded machine): its
            # fallback can place far less than the greedy plan below, which this future uses from now on
            self.exact_left = 0.0
            self.exact_fell_back = True
        t0 = timer()
        capacity = usable_capacity(snapshot)
        by_type = servers_by_type(snapshot, capacity)
        free = dict(capacity)
        total = sum(capacity.values())
        values, owed, ordered = queue_order(snapshot, estimator, self.settings, self.per_sample)
        placeable = [v for v in ordered if self._is_profiled(v.spec, by_type, estimator)]
        assignments: dict[str, Config] = {}
        keep_only: set[str] = set()  # running jobs behind the window: what they hold, or nothing
        if kind == "first":
            window = service_window(placeable, total, self.settings.window)
            kept = kept_placements([v for v in placeable if protected(v, self.settings.min_attempt_s)], free)
            assignments.update(kept)
            in_window = {v.id for v in window}
            # running jobs behind the window may keep what they hold (and only that), ranked with the rest
            keep_only = {v.id for v in placeable if v.current is not None and v.id not in in_window}
            order = sorted(
                (v for v in placeable if v.id not in kept and (v.id in in_window or v.id in keep_only)),
                key=lambda v: (v.id not in owed, -(values[v.id] + (self.keep_bonus if v.current else 0.0))),
            )
        else:
            assignments.update(kept_placements([v for v in snapshot.jobs if v.current is not None], free))
            waiting = [v for v in placeable if v.current is None]
            order = service_window(waiting, total, self.settings.window)
        used: dict[str, int] = {}
        by_id = {v.id: v for v in snapshot.jobs}
        for jid, held in assignments.items():
            tenant = by_id[jid].spec.tenant
            used[tenant] = used.get(tenant, 0) + held.gpus
        room = sum(free.values())
        for view in order:
            need = view.spec.requirements.minimum
            if room < need:
                continue
            quota = snapshot.tenants.get(view.spec.tenant)
            cap = quota.cap_gpus if quota is not None else None
            if cap is not None and used.get(view.spec.tenant, 0) + need > cap:
                continue
            config: Config | None = None
            if view.current is not None and fits(view.current, free):
                config = view.current
            elif view.id not in keep_only:
                config = _place(view.spec, by_type, free, estimator, self.settings.mixed_types)
            if config is None:
                continue
            take(config, free)
            room -= config.gpus
            used[view.spec.tenant] = used.get(view.spec.tenant, 0) + config.gpus
            assignments[view.id] = config
        grown = [v for v in order if v.current is None and v.id in assignments]
        _grow(grown, assignments, snapshot, free, used, estimator)
        t1 = timer()
        return Plan(
            kind=kind,
            now=snapshot.now,
            assignments=assignments,
            priorities=values,
            stats=SolverStats(method="greedy", model="forecast", solve_s=t1 - t0, total_s=t1 - t0),
            idle_gpus=idle_after(capacity, assignments),
        )

    def _is_profiled(self, job: JobSpec, by_type: Mapping[GpuType, Sequence[Server]], est: Estimator) -> bool:
        memo = self._profiled
        if memo is None:
            return _profiled(job, by_type, est)
        types = memo.get(job.id)
        if types is None:
            types = frozenset(est.profiled_types(job.id))
            if types:  # only once profiled: a job without a profile yet may get one
                memo[job.id] = types
        return any(t in by_type for t in types)


def _profiled(job: JobSpec, by_type: Mapping[GpuType, Sequence[Server]], est: Estimator) -> bool:
    return any(est.has_profile(job.id, gpu_type) for gpu_type in by_type)


def _place(
    job: JobSpec,
    by_type: Mapping[GpuType, Sequence[Server]],
    free: Mapping[ServerId, int],
    est: Estimator,
    mixed: bool = False,
) -> Config | None:
    """At the smallest count on the fastest profiled type that has room; with `mixed` (the planner's
    `mixed_types`), a runtime job no one type can hold is packed across the profiled types, as the
    planner would place it (jobs that fit one type are forecast within one: a simplification)."""
    rated: list[tuple[float, GpuType]] = []
    for gpu_type in by_type:
        if est.has_profile(job.id, gpu_type):
            rate = est.type_rate(job, gpu_type)
            if rate is not None and rate > 0:
                rated.append((rate, gpu_type))
    for _, gpu_type in sorted(rated, key=lambda rt: (-rt[0], rt[1])):
        config = pack(by_type[gpu_type], free, job.requirements.minimum, job.one_server)
        if config is not None:
            return config
    largest = max((sum(s.gpus for s in group) for group in by_type.values()), default=0)
    if mixed and job.runtime and not job.one_server and rated and job.requirements.minimum > largest:
        pool = [s for _, t in sorted(rated, key=lambda rt: (-rt[0], rt[1])) for s in by_type[t]]
        return pack(pool, free, job.requirements.minimum)
    return None


def _grow(
    views: Sequence[JobView],
    assignments: dict[str, Config],
    snapshot: ClusterSnapshot,
    free: dict[ServerId, int],
    used: dict[str, int],
    est: Estimator,
) -> None:
    """GPUs still idle go to the jobs this plan starts, in queue order: each takes the largest count of
    its requirement set that fits on its GPU type and runs it faster (as Hops' program gives an
    elastic job more GPUs where nothing else wants them), within its tenant's cap."""
    servers = snapshot.server_map()
    for view in views:
        config = assignments[view.id]
        if spans_types(config, servers):
            continue  # placed across types: not grown
        gpu_type = servers[config.parts[0][0]].gpu_type
        pool = sorted(
            (s for s in snapshot.servers if s.gpu_type == gpu_type and s.id in free),
            key=lambda s: (s.order, s.id),
        )
        quota = snapshot.tenants.get(view.spec.tenant)
        cap = quota.cap_gpus if quota is not None else None
        best, best_rate = config, _rate(view.spec, config, servers, est)
        for count in (c for c in view.spec.requirements.counts if c > config.gpus):
            if cap is not None and used.get(view.spec.tenant, 0) - config.gpus + count > cap:
                break
            room = dict(free)
            for sid, g in config.parts:
                room[sid] += g
            bigger = pack(pool, room, count, view.spec.one_server)
            if bigger is None:
                break
            rate = _rate(view.spec, bigger, servers, est)
            if rate > best_rate:
                best, best_rate = bigger, rate
        if best is not config:
            for sid, g in config.parts:
                free[sid] += g
            take(best, free)
            used[view.spec.tenant] = used.get(view.spec.tenant, 0) - config.gpus + best.gpus
            assignments[view.id] = best


def _rate(job: JobSpec, config: Config, servers: Mapping[ServerId, Server], est: Estimator) -> float:
    """The job's estimated samples/s on `config` (0 where nothing is known)."""
    total = 0.0
    for sid, g in config.parts:
        per_gpu = est.per_gpu_rate(job, servers[sid], g, len(config.parts))
        if per_gpu is None:
            return 0.0
        total += per_gpu * g
    return total
