"""Answering a PlanRequest: the profiling runs the budget allows, then the policy's plan (pure).

`compute_plan` is what a driver runs for the machine's PlanRequest; `fallback_plan` is the answer when
the planner cannot give one in time: in the simulator inline, in the
master off the event loop. It reads the estimator and the policy (which may keep state between calls,
as Gavel's does) and nothing else; time arrives as the snapshot's `now`, `timer` only measures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace

from hopsmgr.control.commands import PlanRequest
from hopsmgr.control.events import PlanReady
from hopsmgr.core import quota, typecaps
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, JobId, JobSpec, JobView
from hopsmgr.core.plan import SolverStats
from hopsmgr.core.planner import Plan, ProfilingRun, profiling_runs
from hopsmgr.core.program import protected
from hopsmgr.policies.base import Policy

Timer = Callable[[], float]


def within_budget(runs: list[ProfilingRun], budget: int, at_least_one: bool = False) -> list[ProfilingRun]:
    """The runs of whole jobs, in order, while they fit `budget` GPUs (one GPU a run); with
    `at_least_one`, the first job's runs even when they do not fit."""
    per_job = Counter(r.job_id for r in runs)
    kept: list[ProfilingRun] = []
    started: set[str] = set()
    for r in runs:
        if r.job_id not in started:
            if len(kept) + per_job[r.job_id] > budget and not (at_least_one and not kept):
                break
            started.add(r.job_id)
        kept.append(r)
    return kept


# [ours] A new job that found no idle GPU for this many rounds may take GPUs from running work for its
# profiling runs (their jobs are checkpointed). Sooner, it is profiled only on GPUs that are idle or that
# the round's plan frees anyway: a checkpoint and restart for a minute of profiling does not pay, and the
# victim would take its GPUs straight back (a preemption cycle).
STARVED_ROUNDS = 5


def choose_profiling(
    request: PlanRequest, estimator: Estimator, avoid: frozenset[str] = frozenset()
) -> list[ProfilingRun]:
    """Profiling runs on idle GPUs within the budget; in a first plan, a job starved of idle GPUs for
    STARVED_ROUNDS rounds gets its runs even on GPUs of running work (never of a protected attempt).
    Servers in `avoid` (reserved for a waiting job, hopsmgr.core.reserve) get no runs but a starved
    job's."""
    snapshot = request.snapshot
    held: dict[str, int] = {}  # GPUs of running jobs: profiling takes idle GPUs only
    for view in snapshot.jobs:
        for sid, g in view.current.parts if view.current else ():
            held[sid] = held.get(sid, 0) + g
    for sid in avoid:
        held[sid] = snapshot.capacity.get(sid, 0)
    runs = within_budget(
        profiling_runs(list(request.to_profile), snapshot, estimator, held), request.profiling_budget
    )
    owed = _under_guarantee(snapshot)
    candidates = _starving(request, runs)
    starved = [
        j for j in candidates if snapshot.now - j.submit_time >= _starved_s(request) or j.tenant in owed
    ]
    # [ours] A job owed GPUs under a guarantee per GPU type (the plan's own reckoning,
    # hopsmgr.core.typecaps) is profiled after one starved round too, so the plan places it there on
    # measured rates; it takes GPUs of running work only on that type.
    owed_type = _owed_by_type(snapshot, candidates) if candidates else {}
    type_owed = [j for j in candidates if j not in starved and j.id in owed_type]
    if starved or type_owed:
        # A tenant under its guarantee reclaims borrowed GPUs at once, as the plan does: borrowers'
        # young attempts are not spared for its profiling runs.
        lent = (
            quota.borrowers(snapshot.jobs, quota.entitled(snapshot.jobs, snapshot.tenants, {}))
            if owed
            else ()
        )
        taken: dict[str, int] = {}
        for r in runs:
            taken[r.server_id] = taken.get(r.server_id, 0) + 1
        for view in snapshot.jobs:
            if view.current is not None and protected(view, request.min_attempt_s) and view.id not in lent:
                for sid, g in view.current.parts:
                    taken[sid] = taken.get(sid, 0) + g
        # at least one job a round, whatever the budget: new work always gets profiled in the end
        extra = profiling_runs(starved, snapshot, estimator, taken)
        for r in extra:
            taken[r.server_id] = taken.get(r.server_id, 0) + 1
        extra += _owed_type_runs(type_owed, owed_type, snapshot, estimator, taken, held, runs + extra)
        runs += within_budget(extra, request.profiling_budget - len(runs), at_least_one=True)
    return runs


def _under_guarantee(snapshot: ClusterSnapshot) -> frozenset[str]:
    """Tenants holding fewer GPUs than their guarantee."""
    held: dict[str, int] = {}
    for view in snapshot.jobs:
        if view.current is not None:
            held[view.spec.tenant] = held.get(view.spec.tenant, 0) + view.current.gpus
    return frozenset(t for t, q in snapshot.tenants.items() if q.guaranteed_gpus > held.get(t, 0))


def _owed_by_type(snapshot: ClusterSnapshot, candidates: list[JobSpec]) -> dict[JobId, typecaps.TypeKey]:
    """The jobs owed GPUs under a guarantee per type, the starving `candidates` (not yet in the
    snapshot: they have no profile) counted among the waiting jobs."""
    known = {v.id for v in snapshot.jobs}
    new = tuple(JobView(spec) for spec in candidates if spec.id not in known)
    return typecaps.owed_by_type(replace(snapshot, jobs=snapshot.jobs + new))


def _owed_type_runs(
    jobs: list[JobSpec],
    owed_type: Mapping[JobId, typecaps.TypeKey],
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    taken: Mapping[str, int],
    held: Mapping[str, int],
    chosen: list[ProfilingRun],
) -> list[ProfilingRun]:
    """Runs for jobs owed GPUs under a guarantee per type: on servers of the type each is owed, GPUs of
    running work that is not protected (`taken`: protected attempts and the runs of this round); on
    the other types, idle GPUs only (`held`: every running job's GPUs). `chosen`: this round's runs."""
    servers = snapshot.server_map()
    ran: dict[str, int] = {}  # this round's runs, those given here included
    mine: dict[str, int] = {}  # the runs given here
    out: list[ProfilingRun] = []
    for r in chosen:
        ran[r.server_id] = ran.get(r.server_id, 0) + 1
    by_type: dict[str, list[JobSpec]] = {}
    for job in jobs:
        by_type.setdefault(owed_type[job.id][1], []).append(job)
    for gpu_type, owed_jobs in sorted(by_type.items()):
        busy = {
            sid: taken.get(sid, 0) + mine.get(sid, 0)
            if server.gpu_type == gpu_type
            else held.get(sid, 0) + ran.get(sid, 0)
            for sid, server in servers.items()
        }
        for r in profiling_runs(owed_jobs, snapshot, estimator, busy):
            out.append(r)
            ran[r.server_id] = ran.get(r.server_id, 0) + 1
            mine[r.server_id] = mine.get(r.server_id, 0) + 1
    return out


def _starving(request: PlanRequest, runs: list[ProfilingRun]) -> list[JobSpec]:
    if request.kind != "first" or not request.starving:
        return []
    have = {r.job_id for r in runs}
    return [j for j in request.to_profile if j.id in request.starving and j.id not in have]


def _starved_s(request: PlanRequest) -> float:
    return STARVED_ROUNDS * request.round_s


def _on_idle_after(
    specs: list[JobSpec],
    request: PlanRequest,
    estimator: Estimator,
    plan: Plan,
    runs: list[ProfilingRun],
    closed: frozenset[str] = frozenset(),
) -> list[ProfilingRun]:
    """Runs for `specs` on the GPUs the plan leaves idle (those it takes back from running work
    included; none on `closed` servers), within what is left of the budget."""
    if not specs:
        return []
    used: dict[str, int] = {sid: request.snapshot.capacity.get(sid, 0) for sid in closed}
    for r in runs:
        used[r.server_id] = used.get(r.server_id, 0) + 1
    for config in plan.assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    extra = profiling_runs(specs, request.snapshot, estimator, used)
    return within_budget(extra, request.profiling_budget - len(runs))


def compute_plan(request: PlanRequest, policy: Policy, estimator: Estimator, timer: Timer) -> PlanReady:
    """The PlanReady event that answers `request`."""
    t0 = timer()
    snapshot = request.snapshot
    avoid: frozenset[str] = getattr(policy, "reserved_servers", frozenset())
    # [ours] With a policy that `plans_before_profiling` (Hops), jobs with no profile yet (no view:
    # nothing to plan) are profiled first, on idle GPUs, and a queued job missing a GPU type's profile
    # is planned first and profiled only if the plan leaves it waiting, on the GPUs the plan leaves
    # idle: a run taken before the plan kept such a job out of plans until the run ended (a profile's
    # length, 60 s in the simulator) while GPUs it could use stood idle. Other policies profile first.
    new, queued = tuple(request.to_profile), []
    if getattr(policy, "plans_before_profiling", False):
        planned_ids = {v.id for v in snapshot.jobs}
        new = tuple(j for j in request.to_profile if j.id not in planned_ids)
        queued = [j for j in request.to_profile if j.id in planned_ids]
    runs = choose_profiling(replace(request, to_profile=new), estimator, avoid) if new else []
    profiled = {r.job_id for r in runs}
    capacity = dict(snapshot.capacity)
    for r in runs:
        capacity[r.server_id] = capacity.get(r.server_id, 0) - 1
    views = tuple(v for v in snapshot.jobs if v.id not in profiled or v.current is not None)
    if views:
        plan = policy.plan(replace(snapshot, capacity=capacity, jobs=views), estimator, request.kind, timer)
    else:
        plan = Plan(request.kind, snapshot.now, {})
    # the starving jobs still without runs, then the queued jobs the plan leaves waiting (not on
    # servers reserved for a waiting job)
    runs += _on_idle_after(_starving(request, runs), request, estimator, plan, runs)
    waiting = [j for j in queued if j.id not in plan.assignments]
    runs += _on_idle_after(waiting, request, estimator, plan, runs, avoid)
    return PlanReady(request.stimulus_id, request.request_id, plan, tuple(runs), timer() - t0)


def fallback_plan(request: PlanRequest, estimator: Estimator, why: str) -> PlanReady:
    """Keep what runs; place waiting, profiled jobs first-fit (oldest first) at their smallest count,
    within the tenants' caps and the limits per GPU type."""
    snapshot = request.snapshot
    free = dict(snapshot.capacity)
    assignments: dict[JobId, Config] = {}
    for view in snapshot.jobs:
        if view.current is not None:
            assignments[view.id] = view.current
            for sid, g in view.current.parts:
                free[sid] = free.get(sid, 0) - g
    by_type = {s.id: s.gpu_type for s in snapshot.servers}
    waiting = sorted(
        (v for v in snapshot.jobs if v.current is None), key=lambda v: (v.spec.submit_time, v.id)
    )
    # Tenant caps, and caps and guarantees per GPU type, hold here too: what runs counts against them.
    held: dict[str, int] = {}
    for view in snapshot.jobs:
        if view.current is not None:
            held[view.spec.tenant] = held.get(view.spec.tenant, 0) + view.current.gpus
    servers = snapshot.server_map()
    placed = (
        (v.spec.tenant, v.current)
        for v in snapshot.jobs
        if v.current is not None and all(sid in servers for sid in v.current.servers)
    )
    type_room = typecaps.type_room(
        typecaps.limits(snapshot, estimator), typecaps.held_by_type(placed, servers)
    )
    for view in waiting:
        profiled = estimator.profiled_types(view.id)
        need, tenant = view.spec.requirements.minimum, view.spec.tenant
        cap = snapshot.tenants[tenant].cap_gpus if tenant in snapshot.tenants else None
        if cap is not None and held.get(tenant, 0) + need > cap:
            continue
        for server in snapshot.servers:
            if by_type[server.id] not in profiled or free.get(server.id, 0) < need:
                continue
            if not typecaps.fits(tenant, {by_type[server.id]: need}, type_room):
                continue
            assignments[view.id] = Config.single(server.id, need)
            free[server.id] -= need
            held[tenant] = held.get(tenant, 0) + need
            typecaps.take(tenant, {by_type[server.id]: need}, type_room)
            break
    stats = SolverStats(method="fallback", model="none", proven=False, fallback=why)
    plan = Plan(
        request.kind, snapshot.now, assignments, stats=stats, idle_gpus=sum(max(0, f) for f in free.values())
    )
    return PlanReady(request.stimulus_id, request.request_id, plan, ())
