"""One Hops round as a pure function: profiling queue, first plan, fragment plans -> a `Plan`.

`plan_round` (kind "first") re-plans the whole usable cluster: queue order by priority, the service
window, configurations with estimated throughput, and the prior-weighted program; running jobs take
part and keep their configuration unless moving pays for the restart penalty. `plan_fragments` (kind
"fragment") plans only the idle GPUs later in a round, for queued jobs of the window extended by the
sensitivity adjustment. `profiling_runs` (the profiling queue's runs for new jobs) and
`unplaceable_reason` live in hopsmgr.core.admission and are re-exported here.

Small instances are solved exactly over location-specific configurations; large ones over server
classes (hopsmgr.core.classes) with a mapping step. The caller injects `timer`; nothing here reads a
clock or does I/O beyond handing the program to CBC.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from hopsmgr.core import classes as class_model
from hopsmgr.core import configs as config_gen
from hopsmgr.core import quota, reserve, typecaps
from hopsmgr.core.admission import gpus_per_type, profiling_runs, unplaceable_reason
from hopsmgr.core.estimates import Estimator
from hopsmgr.core.keepchanges import keep_changes_that_free_nothing
from hopsmgr.core.model import (
    ClusterSnapshot,
    Config,
    GpuType,
    JobId,
    JobSpec,
    JobView,
    Server,
    ServerId,
)
from hopsmgr.core.plan import (
    CandidateView,
    JobExplain,
    Plan,
    PlanKind,
    ProfilingRun,
    Reservation,
    SolverStats,
)
from hopsmgr.core.priority import PriorityContext, expected_run_s, ilp_weights, with_hysteresis
from hopsmgr.core.program import (
    RoundState,
    build_exact_program,
    explain_candidates,
    fits_capacity,
    hold_values,
    job_value,
    protected,
    restart_factor,
    solve_exact,
    tenant_resources,
)
from hopsmgr.core.queueorder import context_of, priority_context, queue_order
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.core.transfer import with_transfer
from hopsmgr.core.window import idle_backfill, sensitivity_adjustment, service_window

Timer = Callable[[], float]
HYSTERESIS_NOTE = (
    "weight raised to tie with waiting jobs whose priority is within lr_hysteresis ({}) of its own:"
    " the tie goes to the running job"
)
TIED_WAITING_NOTE = (
    "its priority is less than lr_hysteresis ({}) above that of {} running job(s) that keep their GPUs:"
    " a tie goes to the running job"
)

# Re-exported: these lived here before hopsmgr.core.plan, hopsmgr.core.program and hopsmgr.core.queueorder.
__all__ = [
    "CandidateView",
    "JobExplain",
    "Plan",
    "PlanKind",
    "ProfilingRun",
    "RoundState",
    "SolverStats",
    "Timer",
    "build_exact_program",
    "context_of",
    "explain_candidates",
    "job_value",
    "plan_fragments",
    "plan_round",
    "priority_context",
    "profiling_runs",
    "queue_order",
    "restart_factor",
    "tenant_resources",
    "unplaceable_reason",
]


def plan_round(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    timer: Timer | None = None,
    reservations: Mapping[JobId, Reservation] | None = None,
) -> Plan:
    """The first plan of a round over the whole usable cluster (queued and running jobs).

    `reservations`: those of the previous plan (hopsmgr.core.reserve), kept where they still pay."""
    return _plan(snapshot, estimator, settings, timer, "first", reservations or {})


def plan_fragments(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    timer: Timer | None = None,
    reservations: Mapping[JobId, Reservation] | None = None,
) -> Plan:
    """A later plan within the round: only idle GPUs, only queued jobs; running jobs stay as they are."""
    return _plan(snapshot, estimator, settings, timer, "fragment", reservations or {})


def _plan(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    timer: Timer | None,
    kind: PlanKind,
    previous: Mapping[JobId, Reservation],
) -> Plan:
    clock = timer or (lambda: 0.0)
    t0 = clock()
    if settings.transfer_estimates:  # [ours] a prior on GPU types the job was never profiled on
        estimator = with_transfer(estimator)
    servers = snapshot.server_map()
    capacity = {
        sid: min(n, servers[sid].gpus) for sid, n in snapshot.capacity.items() if sid in servers and n > 0
    }
    running = {
        v.id: v.current for v in snapshot.jobs if v.current is not None and fits_capacity(v.current, capacity)
    }
    held: dict[ServerId, int] = {}
    for config in running.values():
        for sid, g in config.parts:
            held[sid] = held.get(sid, 0) + g

    values, owed, ordered = queue_order(snapshot, estimator, settings)
    type_limits, owed_type = typecaps.plan_limits(snapshot, estimator)  # owed per GPU type: queue head
    ordered = typecaps.head_first(ordered, [v.id for v in ordered if v.id in owed or v.id in owed_type])
    weights = ilp_weights(values, settings.lambda_, settings.lambda_knee, settings.lambda_below)
    tied: dict[JobId, str] = {}  # running jobs whose weight the hysteresis raised: their explanation
    if kind == "first" and settings.priority == "latency_ratio" and settings.lr_hysteresis > 0:
        # [ours] owed jobs (a guarantee's) stay out of it: they head the queue and take their GPUs back.
        # Running: holding GPUs the plan counts (not a job whose GPUs left the capacity).
        rivals = [
            v.id for v in snapshot.jobs if v.id not in running and v.id not in owed and v.id not in owed_type
        ]
        running_ids = [jid for jid in running if jid not in owed]
        plain = weights
        weights = with_hysteresis(values, plain, running_ids, rivals, settings.lr_hysteresis)
        for jid in running_ids:
            if weights.get(jid, 0.0) > plain.get(jid, 0.0):
                tied[jid] = HYSTERESIS_NOTE.format(settings.lr_hysteresis)
    for jid in owed:
        weights[jid] *= quota.GUARANTEE_BOOST
    usable_servers = [servers[sid] for sid in capacity]
    unplaceable: dict[JobId, str] = {}
    type_gpus = gpus_per_type(usable_servers)
    for view in ordered:
        mixed = settings.mixed_types and view.spec.runtime
        reason = unplaceable_reason(view.spec, usable_servers, estimator, type_gpus, mixed)
        if reason is not None:
            unplaceable[view.id] = reason
    placeable = [v for v in ordered if v.id not in unplaceable]

    by_type = config_gen.group_by_type(usable_servers, capacity)
    largest = max((s.gpus for s in usable_servers), default=0)
    state = RoundState(snapshot, estimator, settings, servers, by_type, weights, {}, {}, largest)
    state.type_limits = type_limits
    # The time limit is a deadline for the whole plan, from its start; a share of it is kept for the
    # work after the solver (mapping, fill, explanations).
    state.deadline = t0 + settings.time_limit_s - min(0.1 * settings.time_limit_s, 0.5)
    ctx = priority_context(snapshot, estimator)
    for view in placeable:
        state.base_rate[view.id] = _base_rate(
            view.spec, by_type, servers, estimator, ctx, settings.effective_gain_base
        )
        state.rho[view.id] = config_gen.sensitivity(view.spec, by_type, estimator)
    if settings.speed_value == "neutral" and placeable:
        state.speed_weight = statistics.median(weights.get(v.id, 1.0) for v in placeable)
        if settings.effective_gain_base != "expected":  # else G is 1 at the expected rate already
            for view in placeable:
                expected = _base_rate(view.spec, by_type, servers, estimator, ctx, "expected")
                state.expected_gain[view.id] = max(1.0, expected / state.base_rate[view.id])
    if kind == "first":
        state.hold_value = hold_values(state, {v.id: v for v in placeable if v.id in running})

    total = sum(capacity.values())
    window_views = service_window(placeable, total, settings.window)
    held_res = reserve.hold(
        snapshot,
        estimator,
        settings,
        ctx,
        placeable,
        capacity,
        running,
        previous,
        kind == "first",
        type_limits,
    )
    reserved_out = held_res.out_of_program
    tenant_of = {v.id: v.spec.tenant for v in snapshot.jobs}
    if kind == "first":
        # [ours] A job (re)started less than min_attempt_s plus twice its restart cost ago keeps its
        # GPUs: without this quantum, jobs started by fragment plans are preempted at the next round
        # start and thrash, paying a restart each time.
        by_id = {v.id: v for v in snapshot.jobs}
        fixed = {
            jid: config for jid, config in running.items() if protected(by_id[jid], settings.min_attempt_s)
        }
        # A tenant cap beats the quantum: a tenant over its cap has none of its jobs protected.
        protected_gpus: dict[str, int] = {}
        for jid, config in fixed.items():
            tenant = by_id[jid].spec.tenant
            protected_gpus[tenant] = protected_gpus.get(tenant, 0) + config.gpus
        over = {
            t
            for t, n in protected_gpus.items()
            if (q := snapshot.tenants.get(t)) is not None and q.cap_gpus is not None and n > q.cap_gpus
        }
        fixed = {jid: c for jid, c in fixed.items() if by_id[jid].spec.tenant not in over}
        over_type = typecaps.jobs_over_type_caps(fixed, tenant_of, type_limits, servers)
        fixed = {jid: c for jid, c in fixed.items() if jid not in over_type}
        if quota.reclaim_wanted(snapshot.jobs, owed):  # an owner waits: borrowed GPUs lose the quantum
            lent = quota.borrowers(snapshot.jobs, owed)
            fixed = {jid: c for jid, c in fixed.items() if jid not in lent}
        fixed = _within_capacity(fixed, capacity, values)
        # Draining for a reservation: kept as they are, as far as the tenant's caps (and the limits per
        # GPU type) allow beside its protected jobs, narrowest first (under one cap, the fewest jobs
        # stopped), then by priority; those left out must leave the draining servers, and the program
        # places them under the caps' rows.
        room = dict(capacity)
        for config in fixed.values():
            for sid, g in config.parts:
                room[sid] -= g
        cap_left = reserve.tenant_room(snapshot, fixed)
        type_left = typecaps.type_room(
            type_limits, typecaps.held_by_type(((tenant_of[j], c) for j, c in fixed.items()), servers)
        )
        for jid, c in sorted(held_res.keep.items(), key=lambda kc: (kc[1].gpus, -values.get(kc[0], 0.0))):
            tenant, uses = tenant_of[jid], typecaps.gpus_by_type(c, servers)
            if jid in fixed or not fits_capacity(c, room):
                continue  # (a shrunken capacity is met by _within_capacity's order, not overridden)
            if cap_left.get(tenant, c.gpus) < c.gpus or not typecaps.fits(tenant, uses, type_left):
                continue
            fixed[jid] = c
            for sid, g in c.parts:
                room[sid] -= g
            if tenant in cap_left:
                cap_left[tenant] -= c.gpus
            typecaps.take(tenant, uses, type_left)
        held_res.keep = {jid: c for jid, c in held_res.keep.items() if fixed.get(jid) == c}
        fixed.update(held_res.start)
        free = dict(capacity)
        for config in fixed.values():
            for sid, g in config.parts:
                free[sid] -= g
        jobs = [v for v in window_views if v.id not in fixed and v.id not in reserved_out]
        in_window = {v.id for v in jobs}
        # Running jobs behind the window stay candidates for keeping what they hold (and, in the exact
        # model, for moving whole to another server: hopsmgr.core.program.build_exact_program).
        jobs += [v for v in placeable if v.id in running and v.id not in in_window and v.id not in fixed]
    else:
        free = {sid: capacity[sid] - held.get(sid, 0) for sid in capacity}
        idle = sum(max(0, n) for n in free.values())
        queued_order = [v for v in placeable if v.id not in running]
        # The window of a fragment plan is the head of the *waiting* jobs: running jobs keep what they
        # hold here, so they take no room in it (with the projected priority they often rank first).
        window_queued = service_window(queued_order, total, settings.window)
        if settings.sensitivity_adjustment:
            window_queued = sensitivity_adjustment(window_queued, queued_order, state.rho, idle)
        if settings.idle_backfill and not held_res.reservations:  # (reservations backfill by their own rule)
            window_queued = idle_backfill(window_queued, queued_order, idle)
        jobs = [v for v in window_queued if v.id not in reserved_out]
        fixed = dict(running)
        fixed.update(held_res.start)
        for config in held_res.start.values():
            for sid, g in config.parts:
                free[sid] -= g
    for sid in held_res.closed:  # draining servers: open to backfill only
        free[sid] = 0

    for jid, config in fixed.items():
        tenant = tenant_of[jid]
        state.tenant_held[tenant] = state.tenant_held.get(tenant, 0) + config.gpus
    if state.type_limits:
        state.tenant_type_held = typecaps.held_by_type(((tenant_of[j], c) for j, c in fixed.items()), servers)
    t_cfg = clock()
    window_set = {v.id for v in jobs} if kind == "fragment" else {v.id for v in window_views}
    assignment, stats, explain = _solve(
        state, jobs, window_set, free, running if kind == "first" else {}, clock
    )
    if kind == "first":
        keep_changes_that_free_nothing(state, jobs, free, running, assignment)
    assignment.update(fixed)
    assignment.update(
        reserve.backfill(
            held_res,
            snapshot,
            estimator,
            settings,
            ordered,
            assignment,
            {v.id for v in placeable},
            type_limits,
        )
    )
    used: dict[ServerId, int] = {}
    for config in assignment.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    idle_after = sum(capacity[sid] - used.get(sid, 0) for sid in capacity)
    window_ids = tuple(v.id for v in window_views)
    window_id_set = set(window_ids)
    candidate_ids = {v.id for v in jobs}
    position = {v.id: k for k, v in enumerate(ordered)}
    waits = {
        r.job_id: f"waits for its reservation of {r.config}, expected free at t={r.start_s:.0f} s"
        for r in held_res.reservations
        if r.job_id in held_res.waiting
    }
    waits.update(
        (jid, "keeps its GPUs: they are reserved for a waiting job and drain") for jid in held_res.keep
    )
    if tied:  # [ours] a waiting job left out, less than lr_hysteresis ahead of running jobs that stay
        stay = sorted(values[jid] for jid in tied if jid in running and assignment.get(jid) == running[jid])
        for v in placeable:
            if v.id in assignment or v.id in running:
                continue
            mine = values.get(v.id, 0.0)  # ties with the x where mine - delta <= x < mine
            n = bisect.bisect_left(stay, mine) - bisect.bisect_left(stay, mine - settings.lr_hysteresis)
            if n:
                tied[v.id] = TIED_WAITING_NOTE.format(settings.lr_hysteresis, n)
    explain_out = {
        v.id: JobExplain(
            position=position[v.id],
            priority=values.get(v.id, 0.0),
            weight=weights.get(v.id, 0.0),
            in_window=v.id in window_id_set,
            sensitivity=state.rho.get(v.id, 1.0),
            may_span=config_gen.may_span(v.spec, state.rho.get(v.id, 1.0), settings.sigma, largest),
            candidates=explain.get(v.id, ()),
            chosen=str(assignment[v.id]) if v.id in assignment else None,
            note=waits.get(v.id)
            or _note(v.id, fixed, candidate_ids, window_id_set, kind)
            or tied.get(v.id, ""),
        )
        for v in placeable
    }
    total_s = clock() - t0
    stats = _with(stats, config_s=max(0.0, t_cfg - t0) + stats.config_s, total_s=total_s)
    return Plan(
        kind=kind,
        now=snapshot.now,
        assignments=assignment,
        window=window_ids,
        order=tuple(v.id for v in ordered),
        priorities=values,
        unplaceable=unplaceable,
        explain=explain_out,
        stats=stats,
        idle_gpus=idle_after,
        reservations=tuple(held_res.reservations),
        backfills=held_res.backfills,
    )


def _note(
    jid: JobId, fixed: Mapping[JobId, Config], candidates: set[JobId], window: set[JobId], kind: PlanKind
) -> str:
    if jid in fixed:
        if kind == "fragment":
            return "runs; a fragment plan only places queued jobs on idle GPUs"
        return "keeps its GPUs: its attempt is younger than the minimum attempt length"
    if jid in candidates:
        return ""
    if jid not in window:
        return "behind the service window"
    return "not planned this time"


def _within_capacity(
    fixed: dict[JobId, Config], capacity: Mapping[ServerId, int], priority: Mapping[JobId, float]
) -> dict[JobId, Config]:
    """Protected placements that fit the capacity (it can shrink: profiling runs, drains); where they
    do not, the lowest-priority ones lose their protection."""
    kept = dict(fixed)
    used: dict[ServerId, int] = {}
    for config in kept.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    for jid in sorted(kept, key=lambda j: (priority.get(j, 0.0), j)):
        config = kept[jid]
        if all(used[sid] <= capacity.get(sid, 0) for sid, _ in config.parts):
            continue
        if any(used[sid] > capacity.get(sid, 0) for sid, _ in config.parts):
            del kept[jid]
            for sid, g in config.parts:
                used[sid] -= g
    return kept


def _solve(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    free: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    clock: Timer,
) -> tuple[dict[JobId, Config], SolverStats, dict[JobId, tuple[CandidateView, ...]]]:
    settings = state.settings
    jobs = [v for v in jobs if v.id in state.base_rate]
    n_servers = sum(1 for sid in free if free[sid] > 0)
    estimate = sum(len(v.spec.requirements.counts) for v in jobs) * max(1, n_servers)
    exact = settings.solver == "exact" or (
        settings.solver == "auto" and estimate <= settings.exact_max_variables
    )
    if exact or not jobs:
        return solve_exact(state, jobs, window, free, running, clock)
    return class_model.solve_by_classes(state, jobs, window, free, running, clock)


def _base_rate(
    job: JobSpec,
    by_type: Mapping[GpuType, Sequence[Server]],
    servers: Mapping[ServerId, Server],
    est: Estimator,
    ctx: PriorityContext,
    gain_base: str = "smallest",
) -> float:
    """What the program divides a configuration's throughput by (G = rate / base).

    "smallest": the job's smallest-configuration throughput (Sia's normaliser, the paper's): R1 GPUs
    on the slowest type. "expected" [ours]: the throughput its expected run time assumes (R_avg GPUs,
    the cluster's type mix: `expected_run_s`), so that G is the job's speed relative to the speed its
    remaining time is reckoned at; with the srtf_lr priority, w x G is then about the share of the
    job's remaining work done per hour, the quantity whose sum a plan should maximise to finish jobs
    soonest on average (Smith's rule). Falls back to "smallest" while the job's age is unknown."""
    if gain_base == "expected":
        age = expected_run_s(job, ctx)
        if math.isfinite(age) and age > 0 and job.total_samples > 0:
            return job.total_samples / age
    rates = []
    for gpu_type in by_type:
        rate = est.type_rate(job, gpu_type)
        if rate is not None and rate > 0:
            rates.append(rate)
    if not rates:
        return 1.0
    return min(rates) * job.requirements.minimum


def _with(stats: SolverStats, **changes: object) -> SolverStats:

    return replace(stats, **changes)  # type: ignore[arg-type]
