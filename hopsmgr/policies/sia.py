"""Sia baseline: heterogeneity-aware goodput ILP over (GPU type, GPU count) configurations, then packing
(Jayaram Subramanya et al., SOSP 2023).

Our implementation of the published mechanism (BASELINES.md), not of Sia's code:

- Configurations of a job: (type j, n GPUs) for every n of its requirement set that type j can hold
  (the Hops comparison's "one configuration per requirement of the set"), on types the job has a
  throughput estimate for; it needs ceil(n / GPUs of the type's largest server) nodes. There is no
  statistical-efficiency model here, so goodput is the estimator's throughput: on one server of the
  type when one holds n, else on the fewest servers of the type.
- G[i][c] = throughput(i, c) / the smallest throughput among the job's configurations (so G >= 1).
- Restart factor r = max(age - restarts * S, 0) / (age + S) multiplies G for every configuration of a
  running job other than its current (type, count); age = time since submission (running + waiting),
  S = the job's restart cost. A queued job has no configuration to keep, so r is not applied to it:
  with p < 0 a new job (age ~ 0, r ~ 0) would otherwise cost G^p >> lambda_n and never start.
- Objective, p < 0 (published p = -0.5): minimise sum x_ic G_ic^p + lambda_n * (jobs left unallocated),
  solved as maximising sum x_ic (lambda_n - G_ic^p); with p > 0: maximise sum x_ic G_ic^p. X binary,
  at most one configuration per job, GPUs used per type <= the type's GPUs (no per-server constraint).
  Solved with the shared program solver (hopsmgr.core.ilp: LP bound, rounding, CBC MIP, time limit).
- Queue order "latency_ratio" (the Hops comparison's variant, our reading): only the jobs of the
  service window over the latency-ratio-ordered queue are candidates, plus every running job.
- Placement, per type: jobs keeping their (type, count) stay where they are; the others, largest first,
  go on the fewest servers (best fit). A configuration that does not pack is not placed this round (the
  count is reported in the plan's stats).
- Rounds of 60 s; no fragment plans ("fragment" calls return the current placements).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hopsmgr.core import ilp
from hopsmgr.core.assignment import Option
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobView, Server, ServerId
from hopsmgr.core.planner import Plan, PlanKind, SolverStats
from hopsmgr.core.priority import order_queue, priority_values
from hopsmgr.core.queueorder import priority_context
from hopsmgr.core.window import service_window
from hopsmgr.policies.placement import (
    QUEUE_ORDERS,
    QueueOrder,
    arrival_order,
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
_MIN_GAIN = 1e-9  # options whose restart-discounted gain is below this are left out (G^p would blow up)


@dataclass(frozen=True, slots=True)
class SiaConfig:
    """One configuration of a job: `gpus` GPUs of `gpu_type` over `nodes` servers, its rate and gain."""

    gpu_type: GpuType
    gpus: int
    nodes: int
    rate: float
    gain: float


def restart_factor(age_s: float, restarts: int, restart_s: float) -> float:
    """Sia's r = max(age - restarts * S, 0) / (age + S); 1.0 when both age and S are 0."""
    denominator = age_s + restart_s
    if denominator <= 0:
        return 1.0
    return max(age_s - restarts * restart_s, 0.0) / denominator


def current_shape(view: JobView, servers: Mapping[ServerId, Server]) -> tuple[GpuType, int] | None:
    """(type, count) of a running job's placement; None if not running or spread over several types."""
    if view.current is None:
        return None
    types = {servers[sid].gpu_type if sid in servers else "" for sid in view.current.servers}
    if len(types) != 1 or "" in types:
        return None
    return types.pop(), view.current.gpus


def option_value(gain: float, p: float, lambda_n: float) -> float:
    """The program's value of allocating a configuration: lambda_n - G^p for p < 0, G^p otherwise."""
    return lambda_n - gain**p if p < 0 else gain**p


class SiaPolicy:
    """Sia's (type, count) ILP with the G^p fairness knob and restart factor (see the module docstring)."""

    fragment_plans = False

    def __init__(
        self,
        round_seconds: float = 60.0,
        p: float = -0.5,
        lambda_n: float = 1.1,
        queue_order: QueueOrder = "published",
        time_limit_s: float = 5.0,
        name: str | None = None,
    ) -> None:
        if queue_order not in QUEUE_ORDERS:
            raise ValueError(
                f"sia: queue_order must be one of {', '.join(QUEUE_ORDERS)}, got {queue_order!r}"
            )
        if not round_seconds > 0:
            raise ValueError(f"sia: round_seconds must be > 0, got {round_seconds!r}")
        if not (math.isfinite(p) and p != 0):
            raise ValueError(f"sia: p must be a finite non-zero number, got {p!r}")
        if not (math.isfinite(lambda_n) and lambda_n > 0):
            raise ValueError(f"sia: lambda_n must be > 0, got {lambda_n!r}")
        if not time_limit_s > 0:
            raise ValueError(f"sia: time_limit_s must be > 0, got {time_limit_s!r}")
        self.round_seconds = round_seconds
        self.p = p
        self.lambda_n = lambda_n
        self.queue_order = queue_order
        self.time_limit_s = time_limit_s
        self.name = name or ("sia" if queue_order == "published" else "sia-lr")
        order = "all jobs" if queue_order == "published" else "latency-ratio service window"
        self.description = f"Sia goodput ILP over (type, count), p={p}, lambda_n={lambda_n}, {order}"

    def configurations(
        self,
        view: JobView,
        by_type: Mapping[GpuType, Sequence[Server]],
        capacity: Mapping[ServerId, int],
        servers: Mapping[ServerId, Server],
        estimator: Estimator,
    ) -> list[SiaConfig]:
        """The job's configurations with G (restart factor applied to a running job's other ones)."""
        raw: list[tuple[GpuType, int, int, float]] = []
        for gpu_type, members in sorted(by_type.items()):
            largest = max(capacity[s.id] for s in members)
            total = sum(capacity[s.id] for s in members)
            for n in view.spec.requirements:
                if n > total:
                    continue
                rate = representative_rate(estimator, view.spec, members, capacity, servers, n)
                if rate is not None:
                    raw.append((gpu_type, n, math.ceil(n / largest), rate))
        if not raw:
            return []
        base = min(rate for *_, rate in raw)
        shape = current_shape(view, servers)
        factor = 1.0
        if shape is not None:
            age = max(view.running_s + view.waited_s, 0.0)
            factor = restart_factor(age, view.restarts, view.spec.restart_s)
        out = []
        for gpu_type, n, nodes, rate in raw:
            gain = rate / base
            if shape is not None and (gpu_type, n) != shape:
                gain *= factor
            out.append(SiaConfig(gpu_type, n, nodes, rate, gain))
        return out

    def plan(self, snapshot: ClusterSnapshot, estimator: Estimator, kind: PlanKind, timer: Timer) -> Plan:
        t0 = timer()
        servers = snapshot.server_map()
        capacity = usable_capacity(snapshot)
        by_type = servers_by_type(snapshot, capacity)
        gpus = type_gpus(by_type, capacity)
        if kind != "first":
            return keep_plan(snapshot, capacity, kind, "sia", timer() - t0)

        unplaceable = unplaceable_reasons(
            snapshot.jobs, gpus, estimator, lambda job: job.requirements.minimum
        )
        placeable = [v for v in snapshot.jobs if v.id not in unplaceable]
        ctx = priority_context(snapshot, estimator)
        if self.queue_order == "latency_ratio":
            values = priority_values("latency_ratio", placeable, ctx)
            ordered = order_queue(placeable, values)
            window = {v.id for v in service_window(ordered, sum(capacity.values()))}
            candidates = [v for v in ordered if v.id in window or v.running]
        else:
            # Sia has no queue order; arrival order only breaks ties in the solver's greedy fallback.
            values = priority_values("fifo", placeable, ctx)
            ordered = arrival_order(placeable)
            candidates = ordered

        type_row = {t: r for r, t in enumerate(sorted(gpus))}
        options: list[Option] = []
        option_cfg: list[SiaConfig] = []
        warm: dict[int, int] = {}
        for item, view in enumerate(candidates):
            shape = current_shape(view, servers)
            for cfg in self.configurations(view, by_type, capacity, servers, estimator):
                if cfg.gain < _MIN_GAIN:
                    continue
                value = option_value(cfg.gain, self.p, self.lambda_n)
                if (cfg.gpu_type, cfg.gpus) == shape:
                    warm[item] = len(options)
                options.append(Option(item, value, ((type_row[cfg.gpu_type], float(cfg.gpus)),)))
                option_cfg.append(cfg)
        t_build = timer()
        solution = ilp.solve(
            options,
            [float(gpus[t]) for t in sorted(gpus)],
            ilp.SolveOptions(
                gap=0.0,
                time_limit_s=self.time_limit_s,
                warm_start=warm,
                priority_order=tuple(range(len(candidates))),
                timer=timer,
            ),
        )
        t_solve = timer()
        chosen = {candidates[item].id: option_cfg[o] for item, o in solution.choice.items()}
        assignments, dropped = _place(candidates, chosen, by_type, servers, capacity)
        t1 = timer()
        stats = SolverStats(
            method=solution.method,
            model="sia-type-count",
            variables=solution.variables,
            constraints=solution.constraints,
            build_s=t_build - t0 + solution.build_s,
            solve_s=solution.solve_s,
            map_s=t1 - t_solve,
            total_s=t1 - t0,
            objective=solution.objective,
            bound=solution.bound,
            gap=solution.gap,
            proven=solution.proven,
            fallback=_note(solution.fallback, dropped),
        )
        return Plan(
            kind=kind,
            now=snapshot.now,
            assignments=assignments,
            window=tuple(v.id for v in candidates) if self.queue_order == "latency_ratio" else (),
            order=tuple(v.id for v in ordered),
            priorities=values,
            unplaceable=unplaceable,
            stats=stats,
            idle_gpus=idle_after(capacity, assignments),
        )


def _place(
    candidates: Sequence[JobView],
    chosen: Mapping[JobId, SiaConfig],
    by_type: Mapping[GpuType, Sequence[Server]],
    servers: Mapping[ServerId, Server],
    capacity: Mapping[ServerId, int],
) -> tuple[dict[JobId, Config], int]:
    """Pack the chosen (type, count) configurations onto servers; returns placements and the dropped count."""
    free = dict(capacity)
    rank = {v.id: k for k, v in enumerate(candidates)}
    picked = [v for v in candidates if v.id in chosen]

    def keeps(view: JobView) -> bool:
        cfg = chosen[view.id]
        return current_shape(view, servers) == (cfg.gpu_type, cfg.gpus)

    assignments = kept_placements(picked, free, keeps)
    dropped = 0
    movers = sorted(
        (v for v in picked if v.id not in assignments), key=lambda v: (-chosen[v.id].gpus, rank[v.id])
    )
    for view in movers:
        cfg = chosen[view.id]
        config = pack(by_type[cfg.gpu_type], free, cfg.gpus, view.spec.one_server)
        if config is None:
            dropped += 1
            continue
        take(config, free)
        assignments[view.id] = config
    return assignments, dropped


def _note(fallback: str | None, dropped: int) -> str | None:
    notes = [fallback] if fallback else []
    if dropped:
        notes.append(f"{dropped} chosen configuration(s) did not pack onto servers this round")
    return "; ".join(notes) or None
