"""Gavel baseline: heterogeneity-aware max-min fairness, run in rounds (Narayanan et al., OSDI 2020).

Our implementation of the published mechanism (BASELINES.md), not of Gavel's code:

- Heterogeneity at GPU-type level only. Each job is rigid at sf_i = the median of its requirement set
  (the Hops comparison's choice). T[i][j] = the job's samples/s at sf_i GPUs of type j, from the
  estimator, on one server of the type that holds sf_i, else on the fewest servers of the type.
- Every round (kind "first") solves `max_min_fairness_perf` as an LP (PuLP/CBC): variables X[i][j] >= 0
  (share of wall time on type j), sum_j X[i][j] <= 1, sum_i sf_i X[i][j] <= N_j, maximise t with
  t <= (sf_i / w_i) * sum_j T[i][j] X[i][j] / T_i_equal. T_i_equal is the job's throughput under an equal
  proportional split of the cluster: sum_j T[i][j] N_j / sum_j N_j over the types where T is known
  (time on each type in proportion to its GPUs). w_i is the tenant weight. A max-min optimum is not
  unique; a second LP keeps t at its optimum and maximises the sum of the same normalised terms, so spare
  capacity goes where it helps most (still an optimal solution of Gavel's program). Gavel re-solves on
  arrivals and completions; re-solving every round gives the same allocations here.
- Priority of (job, type) = X[i][j] / (the job's share of type j's time since the last reset), as
  Gavel's simulator counts it: the job's time on the type (once, whatever its width) over the sum of
  every job's time there, each job starting with half a round on every type (so a new job's share is
  small, not zero; a job that arrives after a reset adds its half round to the total only at the next
  one); pairs with X = 0 rank last (priority 0) so idle GPUs still get used. Received time is credited
  from the snapshots: the time between two plan calls goes to the type each running job holds in the
  later snapshot (what it held over that interval). Counters reset every `reset_s`; Gavel's simulator
  resets at the first allocation update (an arrival or a completion) after that, which on busy traces
  is the next round. A deficit per (job, type) (X times wall time, minus time received) runs across
  resets and breaks ties. Deficits never reset. (An earlier version divided by the wall time since the
  reset instead of by the type's total: against Gavel's simulator it favoured wide jobs.)
- Queue order "latency_ratio" (the Hops comparison's variant): jobs by latency ratio, each trying its
  types by X (then T).
- Round: pairs in order, each job at most once, while its type has sf_i GPUs left. Placement is greedy:
  selected jobs that can stay on their previous GPUs stay (no restart); the others, larger first, get
  GPUs server by server on as few servers as possible. A job that does not pack (fragmented servers)
  waits this round.
- No fragment plans: a "fragment" call returns the current placements. Gavel computes the next round
  halfway through the current one; we compute it at the round boundary (same inputs, no timing offset).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pulp
from pulp.apis.coin_api import pulp_cbc_path

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobView, Server, ServerId
from hopsmgr.core.planner import Plan, PlanKind, SolverStats
from hopsmgr.core.priority import order_queue, priority_values
from hopsmgr.core.queueorder import priority_context
from hopsmgr.policies.placement import (
    QUEUE_ORDERS,
    QueueOrder,
    idle_after,
    keep_plan,
    kept_placements,
    pack,
    representative_rate,
    servers_by_type,
    take,
    type_gpus,
    unplaceable_reasons,
    usable_capacity,
)

Timer = Callable[[], float]
REPORTED_INFINITY = 1e9  # Plan.priorities stay finite: an infinite priority is reported as this + X
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Allocation:
    """The LP's answer: time shares X[job][type], the max-min value t, and how it was obtained."""

    x: dict[JobId, dict[GpuType, float]]
    t: float = 0.0
    method: str = "empty"
    proven: bool = True
    variables: int = 0
    constraints: int = 0
    fallback: str | None = None


@dataclass(slots=True)
class _Ledger:
    """Time accounting across plan calls, as Gavel's simulator keeps it: per job and type, the wall time
    it ran there since the last reset plus half a round (every job starts with it); per type, the sum
    of all jobs' times there since the reset plus the half rounds given at the reset; deficits (time
    due at X minus time received, never reset)."""

    last_now: float | None = None
    reset_at: float = 0.0
    received: dict[JobId, dict[GpuType, float]] = field(default_factory=dict)
    type_total: dict[GpuType, float] = field(default_factory=dict)
    deficit: dict[JobId, dict[GpuType, float]] = field(default_factory=dict)
    x: dict[JobId, dict[GpuType, float]] = field(default_factory=dict)


def equal_share_rate(rates: Mapping[GpuType, float], gpus: Mapping[GpuType, int]) -> float:
    """T_i_equal: throughput with time on each known type in proportion to its GPUs (0.0 if none known)."""
    known = [(r, gpus.get(t, 0)) for t, r in rates.items() if gpus.get(t, 0) > 0]
    total = sum(n for _, n in known)
    return sum(r * n for r, n in known) / total if total > 0 else 0.0


def max_min_allocation(
    sizes: Mapping[JobId, int],
    weights: Mapping[JobId, float],
    rates: Mapping[JobId, Mapping[GpuType, float]],
    gpus: Mapping[GpuType, int],
    time_limit_s: float = 10.0,
) -> Allocation:
    """Solve max_min_fairness_perf (see the module docstring) over jobs with at least one known rate."""
    coef: dict[JobId, dict[GpuType, float]] = {}
    for jid, per_type in rates.items():
        equal = equal_share_rate(per_type, gpus)
        if equal > 0:
            scale = sizes[jid] / max(weights.get(jid, 1.0), _EPS) / equal
            coef[jid] = {t: scale * r for t, r in per_type.items() if gpus.get(t, 0) > 0 and r > 0}
    coef = {jid: c for jid, c in coef.items() if c}
    if not coef:
        return Allocation({})
    problem = pulp.LpProblem("gavel_max_min", pulp.LpMaximize)
    t_var = problem.add_variable("t", None, None)
    xs: dict[tuple[JobId, GpuType], pulp.LpVariable] = {}
    for k, (jid, per_type) in enumerate(sorted(coef.items())):
        for t in sorted(per_type):
            xs[jid, t] = problem.add_variable(f"x_{k}_{len(xs)}", 0, 1)
    terms = {jid: pulp.lpSum(c * xs[jid, t] for t, c in per_type.items()) for jid, per_type in coef.items()}
    problem += t_var
    for k, jid in enumerate(sorted(coef)):
        problem += pulp.lpSum(xs[jid, t] for t in coef[jid]) <= 1, f"time_{k}"
        problem += t_var <= terms[jid], f"fair_{k}"
    n_cons = 2 * len(coef)
    for k, gpu_type in enumerate(sorted(gpus)):
        users = [(jid, gpu_type) for jid in coef if (jid, gpu_type) in xs]
        if users:
            problem += pulp.lpSum(sizes[j] * xs[j, t] for j, t in users) <= gpus[gpu_type], f"gpus_{k}"
            n_cons += 1
    n_vars = len(xs) + 1
    first = _solve(problem, time_limit_s)
    if first is None:
        return _equal_split(coef, sizes, gpus, n_vars, n_cons)
    t_star = float(t_var.value() or 0.0)
    stage_one = _values(xs)
    # Second stage: keep the max-min value, use the remaining capacity where it helps most.
    for k, jid in enumerate(sorted(coef)):
        problem += terms[jid] >= t_star * (1 - 1e-6) - _EPS, f"floor_{k}"
    problem.setObjective(pulp.lpSum(terms.values()))
    second = _solve(problem, time_limit_s)
    values, method = (_values(xs), "lp-2stage") if second is not None else (stage_one, "lp")
    x: dict[JobId, dict[GpuType, float]] = {}
    for (jid, gpu_type), value in values.items():
        x.setdefault(jid, {})[gpu_type] = value
    proven = first == "optimal" and second in ("optimal", None)
    note = (
        None
        if proven
        else "LP stopped at its time limit: its best feasible solution is used, not proven optimal"
    )
    return Allocation(x, t_star, method, proven, n_vars, n_cons, note)


def _values(xs: Mapping[tuple[JobId, GpuType], pulp.LpVariable]) -> dict[tuple[JobId, GpuType], float]:
    return {key: max(0.0, float(var.value() or 0.0)) for key, var in xs.items()}


def _solve(problem: pulp.LpProblem, time_limit_s: float) -> str | None:
    """ "optimal", "feasible" (stopped at the time limit with a feasible incumbent), or None (no usable
    solution). PuLP reports a CBC run stopped on time as `status` Optimal: only `sol_status` tells."""
    solver = pulp.COIN_CMD(path=pulp_cbc_path, msg=False, timeLimit=max(1, math.ceil(time_limit_s)))
    try:
        problem.solve(solver)
    except pulp.PulpSolverError:
        return None
    if problem.status != pulp.LpStatusOptimal:
        return None
    if problem.sol_status == pulp.LpSolutionOptimal:
        return "optimal"
    return "feasible" if problem.sol_status == pulp.LpSolutionIntegerFeasible else None


def _equal_split(
    coef: Mapping[JobId, Mapping[GpuType, float]],
    sizes: Mapping[JobId, int],
    gpus: Mapping[GpuType, int],
    n_vars: int,
    n_cons: int,
) -> Allocation:
    """A feasible fallback: each type shared in proportion to size among the jobs that can use it."""
    demand: dict[GpuType, int] = {}
    for jid, per_type in coef.items():
        for t in per_type:
            demand[t] = demand.get(t, 0) + sizes[jid]
    x = {
        jid: {t: min(1.0, gpus[t] / demand[t]) / len(per_type) for t in per_type}
        for jid, per_type in coef.items()
    }
    return Allocation(
        x, 0.0, "equal-split", False, n_vars, n_cons, "LP not solved; equal split of every type"
    )


def held_type(config: Config | None, servers: Mapping[ServerId, Server]) -> GpuType | None:
    """The GPU type a placement runs on (the one holding most of its GPUs), None if not running."""
    if config is None:
        return None
    per_type: dict[GpuType, int] = {}
    for sid, g in config.parts:
        if sid in servers:
            per_type[servers[sid].gpu_type] = per_type.get(servers[sid].gpu_type, 0) + g
    return max(sorted(per_type), key=lambda t: per_type[t]) if per_type else None


class GavelPolicy:
    """Gavel's heterogeneity-aware max-min fairness with priority rounds (see the module docstring)."""

    fragment_plans = False

    def __init__(
        self,
        round_seconds: float = 360.0,
        queue_order: QueueOrder = "published",
        reset_s: float = 1920.0,
        lp_time_limit_s: float = 10.0,
        name: str | None = None,
    ) -> None:
        if queue_order not in QUEUE_ORDERS:
            raise ValueError(
                f"gavel: queue_order must be one of {', '.join(QUEUE_ORDERS)}, got {queue_order!r}"
            )
        for label, value in (("round_seconds", round_seconds), ("reset_s", reset_s), ("lp", lp_time_limit_s)):
            if not value > 0:
                raise ValueError(f"gavel: {label} must be > 0, got {value!r}")
        self.round_seconds = round_seconds
        self.queue_order = queue_order
        self.reset_s = reset_s
        self.lp_time_limit_s = lp_time_limit_s
        self.name = name or ("gavel" if queue_order == "published" else "gavel-lr")
        order = "priority X/received" if queue_order == "published" else "latency-ratio queue order"
        self.description = f"Gavel max-min fairness (heterogeneity-aware), rigid median size, {order}"
        self._ledger = _Ledger()

    # -- accounting -------------------------------------------------------------------------------

    def _account(self, snapshot: ClusterSnapshot, servers: Mapping[ServerId, Server]) -> None:
        ledger = self._ledger
        now = snapshot.now
        half = self.round_seconds / 2.0
        types = sorted({s.gpu_type for s in snapshot.servers})
        present = {v.id for v in snapshot.jobs}
        for table in (ledger.received, ledger.deficit, ledger.x):
            for jid in [j for j in table if j not in present]:
                del table[jid]  # a job that left keeps its GPU-seconds in the type totals until the reset
        if ledger.last_now is not None and now > ledger.last_now:
            dt = now - ledger.last_now
            for view in snapshot.jobs:
                span = min(dt, max(0.0, now - view.spec.submit_time))
                if span <= 0:
                    continue
                held = held_type(view.current, servers)
                deficit = ledger.deficit.setdefault(view.id, {})
                if held is not None:  # a job's wall time, once whatever its width (Gavel's simulator)
                    received = ledger.received.setdefault(view.id, {t: half for t in types})
                    received[held] = received.get(held, half) + span
                    ledger.type_total[held] = ledger.type_total.get(held, 0.0) + span
                    deficit[held] = deficit.get(held, 0.0) - span
                for gpu_type, share in ledger.x.get(view.id, {}).items():
                    deficit[gpu_type] = deficit.get(gpu_type, 0.0) + share * span
        first = ledger.last_now is None
        ledger.last_now = now if first else max(ledger.last_now or now, now)
        if first or now - ledger.reset_at >= self.reset_s:
            ledger.received = {v.id: {t: half for t in types} for v in snapshot.jobs}
            ledger.type_total = {t: half * len(snapshot.jobs) for t in types}
            ledger.reset_at = now
        for view in snapshot.jobs:  # a job new since the reset starts with half a round on every type
            ledger.received.setdefault(view.id, {t: half for t in types})

    def priority(self, job_id: JobId, gpu_type: GpuType) -> float:
        """X[i][j] / the job's share of all jobs' time on type j since the last reset (Gavel's
        simulator's accounting, half a round each to start); inf if the type has none; 0 if X is 0.
        X is rounded to 5 decimals first: LP noise (1e-6) is no priority."""
        share = round(self._ledger.x.get(job_id, {}).get(gpu_type, 0.0), 5)
        if share <= _EPS:
            return 0.0
        total = self._ledger.type_total.get(gpu_type, 0.0)
        received = self._ledger.received.get(job_id, {}).get(gpu_type, 0.0)
        fraction = received / total if total > 0 else 0.0
        return math.inf if fraction <= 0 else share / fraction

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        t0 = timer()
        servers = snapshot.server_map()
        self._account(snapshot, servers)
        capacity = usable_capacity(snapshot)
        by_type = servers_by_type(snapshot, capacity)
        gpus = type_gpus(by_type, capacity)
        if kind != "first":
            return keep_plan(snapshot, capacity, kind, "gavel", timer() - t0)

        unplaceable = unplaceable_reasons(snapshot.jobs, gpus, estimator, lambda job: job.requirements.median)
        jobs = [v for v in snapshot.jobs if v.id not in unplaceable]
        size = {v.id: v.spec.requirements.median for v in jobs}
        rates: dict[JobId, dict[GpuType, float]] = {}
        for view in jobs:
            per_type = {}
            for gpu_type, members in by_type.items():
                rate = representative_rate(estimator, view.spec, members, capacity, servers, size[view.id])
                if rate is not None:
                    per_type[gpu_type] = rate
            rates[view.id] = per_type
        ctx = priority_context(snapshot, estimator)
        weights = {v.id: ctx.weight_of(v.spec.tenant) for v in jobs}
        t_build = timer()
        alloc = max_min_allocation(size, weights, rates, gpus, self.lp_time_limit_s)
        t_solve = timer()
        self._ledger.x = {jid: dict(shares) for jid, shares in alloc.x.items()}

        pairs = self._pairs(jobs, rates, alloc, snapshot, estimator)
        remaining = dict(gpus)
        selected: dict[JobId, GpuType] = {}
        for jid, gpu_type in pairs:
            if jid not in selected and size[jid] <= remaining.get(gpu_type, 0):
                selected[jid] = gpu_type
                remaining[gpu_type] -= size[jid]
        assignments, dropped = self._place(jobs, selected, size, by_type, servers, capacity)
        t1 = timer()

        order = list(dict.fromkeys([*(jid for jid, _ in pairs), *(v.id for v in jobs)]))
        priorities = {jid: self._reported(jid, rates[jid]) for jid in order}
        stats = SolverStats(
            method=alloc.method,
            model="gavel-max-min-perf",
            variables=alloc.variables,
            constraints=alloc.constraints,
            build_s=t_build - t0,
            solve_s=t_solve - t_build,
            map_s=t1 - t_solve,
            total_s=t1 - t0,
            objective=alloc.t,
            proven=alloc.proven,
            fallback=_note(alloc.fallback, dropped),
        )
        return Plan(
            kind=kind,
            now=snapshot.now,
            assignments=assignments,
            order=tuple(order),
            priorities=priorities,
            unplaceable=unplaceable,
            stats=stats,
            idle_gpus=idle_after(capacity, assignments),
        )

    def _pairs(
        self,
        jobs: Sequence[JobView],
        rates: Mapping[JobId, Mapping[GpuType, float]],
        alloc: Allocation,
        snapshot: ClusterSnapshot,
        estimator: Estimator,
    ) -> list[tuple[JobId, GpuType]]:
        """(job, type) pairs with a known rate, in the order the round takes them."""
        views = {v.id: v for v in jobs}

        def share(jid: JobId, gpu_type: GpuType) -> float:
            return alloc.x.get(jid, {}).get(gpu_type, 0.0)

        if self.queue_order == "latency_ratio":
            values = priority_values("latency_ratio", jobs, priority_context(snapshot, estimator))
            return [
                (v.id, t)
                for v in order_queue(jobs, values)
                for t in sorted(rates[v.id], key=lambda t: (-share(v.id, t), -rates[v.id][t], t))
            ]

        def key(pair: tuple[JobId, GpuType]) -> tuple[float, float, float, float, float, str, str]:
            jid, gpu_type = pair
            prio = self.priority(jid, gpu_type)
            deficit = self._ledger.deficit.get(jid, {}).get(gpu_type, 0.0)
            infinite = math.isinf(prio)
            return (
                0.0 if infinite else 1.0,
                0.0 if infinite else -prio,
                -round(deficit, 3),  # seconds; rounding keeps LP noise out of the tie-breaks
                -round(share(jid, gpu_type), 4),
                views[jid].spec.submit_time,
                jid,
                gpu_type,
            )

        return sorted(((jid, t) for jid in rates for t in rates[jid]), key=key)

    @staticmethod
    def _place(
        jobs: Sequence[JobView],
        selected: Mapping[JobId, GpuType],
        size: Mapping[JobId, int],
        by_type: Mapping[GpuType, Sequence[Server]],
        servers: Mapping[ServerId, Server],
        capacity: Mapping[ServerId, int],
    ) -> tuple[dict[JobId, Config], int]:
        """Greedy placement: stayers keep their GPUs, then the rest larger first on the fewest servers."""
        rank = {jid: k for k, jid in enumerate(selected)}
        chosen = sorted((v for v in jobs if v.id in selected), key=lambda v: (-size[v.id], rank[v.id]))
        free = dict(capacity)

        def stays(view: JobView) -> bool:
            current = view.current
            return (
                current is not None
                and current.gpus == size[view.id]
                and all(
                    sid in servers and servers[sid].gpu_type == selected[view.id] for sid in current.servers
                )
            )

        assignments = kept_placements(chosen, free, stays)
        dropped = 0
        for view in chosen:
            if view.id in assignments:
                continue
            config = pack(by_type[selected[view.id]], free, size[view.id], view.spec.one_server)
            if config is None:
                dropped += 1
                continue
            take(config, free)
            assignments[view.id] = config
        return assignments, dropped

    def _reported(self, job_id: JobId, rates: Mapping[GpuType, float]) -> float:
        best = 0.0
        for gpu_type in rates:
            prio = self.priority(job_id, gpu_type)
            share = self._ledger.x.get(job_id, {}).get(gpu_type, 0.0)
            best = max(best, REPORTED_INFINITY + share if math.isinf(prio) else prio)
        return best


def _note(fallback: str | None, dropped: int) -> str | None:
    notes = [fallback] if fallback else []
    if dropped:
        notes.append(f"{dropped} selected job(s) did not pack onto servers this round")
    return "; ".join(notes) or None
