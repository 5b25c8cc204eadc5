"""The per-call state of a round and the location-specific program built from it.

Shared by the exact model (hopsmgr.core.planner) and the class model (hopsmgr.core.classes): the
values of options ((prio + bias)^lambda * G with the restart penalty), tenant cap rows, the program
over location-specific configurations and its solution (`solve_exact`), and the top candidates per
job for `Plan.explain`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hopsmgr.core import configs as config_gen
from hopsmgr.core import ilp
from hopsmgr.core.assignment import Option
from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobSpec, JobView, Server, ServerId
from hopsmgr.core.plan import CandidateView, SolverStats
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.core.typecaps import TypeKey, applies, gpus_by_type, type_room


@dataclass(slots=True)
class RoundState:
    """Shared, per-call working state of the planner (never escapes a call)."""

    snapshot: ClusterSnapshot
    estimator: Estimator
    settings: SchedulerSettings
    servers: dict[ServerId, Server]
    by_type: dict[GpuType, list[Server]]
    weights: dict[JobId, float]
    base_rate: dict[JobId, float]
    rho: dict[JobId, float]
    largest: int
    tenant_held: dict[str, int] = field(default_factory=dict)
    # [ours] the caps and active guarantees per GPU type (hopsmgr.core.typecaps.limits) and the GPUs
    # per (tenant, type) held outside the program (fixed jobs)
    type_limits: dict[TypeKey, int] = field(default_factory=dict)
    tenant_type_held: dict[TypeKey, int] = field(default_factory=dict)
    deadline: float | None = None  # on the injected timer: no solver runs past it
    # Added to every option of a running job: what dropping it would cost (`hold_values`).
    hold_value: dict[JobId, float] = field(default_factory=dict)
    # `speed_value = "neutral"`: the one weight of speed above the rate the job's expected run time
    # assumes (None: each job's own weight), and that rate over the gain base (G there) per job
    speed_weight: float | None = None
    expected_gain: dict[JobId, float] = field(default_factory=dict)


# [ours] What writing a checkpoint is assumed to take when nothing better is known: a fixed part (stop
# the loop, open the file) and the parameters at a conservative local-disk rate. The simulator's
# executor charges the same by default (hopsmgr.sim.engine.SimOptions); a live checkpoint takes what it takes.
CHECKPOINT_FIXED_S = 5.0
CHECKPOINT_BYTES_PER_S = 200e6


def checkpoint_s(spec: JobSpec) -> float:
    return CHECKPOINT_FIXED_S + spec.params_bytes / CHECKPOINT_BYTES_PER_S


def preemption_cost_s(spec: JobSpec) -> float:
    """GPU time a checkpoint-and-stop throws away: the checkpoint now and the restart later."""
    return checkpoint_s(spec) + spec.restart_s


def horizon_s(settings: SchedulerSettings, restart_s: float) -> float:
    """[ours] How long a placement decided now is sure to last: a round, and at least the minimum
    attempt length plus two restarts (the quantum that protects a young attempt)."""
    return max(settings.round_seconds, settings.min_attempt_s + 2 * restart_s)


def protected(view: JobView, min_attempt_s: float) -> bool:
    """[ours] A running job whose attempt is younger than the minimum attempt length plus two restarts
    keeps its GPUs: no first plan preempts or moves it (docs/scheduling.md section 8)."""
    return view.current is not None and view.attempt_s < min_attempt_s + 2 * view.spec.restart_s


def restart_factor(settings: SchedulerSettings, restart_s: float, lost_s: float | None = None) -> float:
    """[ours] The share of throughput left after a (re)start: a launch loses `lost_s` (default: its
    `restart_s`) out of the time it is sure to keep its GPUs (`horizon_s`)."""
    lost = restart_s if lost_s is None else lost_s
    if lost <= 0 or not settings.restart_penalty:
        return 1.0
    return max(0.0, 1.0 - lost / horizon_s(settings, restart_s))


def job_value(state: RoundState, view: JobView, rate: float, moved: bool) -> float:
    """(prio + bias)^lambda * G, times the restart factor for any configuration the job does not
    hold now (a queued job's launch pays its start-up; a running job's move pays its checkpoint and
    its restart when `preemption_cost` is on), plus the job's hold value if it runs."""
    return value_at(value_terms(state, view, moved), rate)


# base rate, restart factor, weight, hold value, the weight of speed above the expected rate (None: the
# weight) and G at the expected rate
ValueTerms = tuple[float, float, float, float, float | None, float]


def value_terms(state: RoundState, view: JobView, moved: bool) -> ValueTerms:
    """What `job_value` needs besides the rate, computed once per job (and kept for all its options)."""
    factor = 1.0
    if view.current is None:
        factor = restart_factor(state.settings, view.spec.restart_s)
    elif moved:
        lost = preemption_cost_s(view.spec) if state.settings.preemption_cost else None
        factor = restart_factor(state.settings, view.spec.restart_s, lost)
    jid = view.id
    weight = state.weights.get(jid, 1.0)
    expected = state.expected_gain.get(jid, 1.0)
    return state.base_rate[jid], factor, weight, state.hold_value.get(jid, 0.0), state.speed_weight, expected


def value_at(terms: ValueTerms, rate: float) -> float:
    base, factor, weight, hold, speed_weight, expected = terms
    if speed_weight is None:
        return weight * (rate / base * factor) + hold
    return weighted_gain(weight, speed_weight, rate / base, expected) * factor + hold


def weighted_gain(weight: float, speed_weight: float | None, gain: float, expected: float = 1.0) -> float:
    """w x G; with one weight for speed above the expected rate (`speed_value = "neutral"`, G = E
    there): w x min(G, E) + w_speed x max(0, G - E)."""
    if speed_weight is None or gain <= expected:
        return weight * gain
    return weight * expected + speed_weight * (gain - expected)


def hold_values(state: RoundState, running: Mapping[JobId, JobView]) -> dict[JobId, float]:
    """[ours] Preemption that pays: what taking a running job's GPUs away costs, in the program's own
    units (priority-weighted normalised throughput over the horizon). A job dropped now writes a
    checkpoint and pays a restart later: `preemption_cost_s` of its current throughput, out of the
    horizon. Added to each of the job's options, it is lost only by choosing none of them, so the
    program preempts a job only when what its GPUs buy elsewhere exceeds its value *and* this cost."""
    if not (state.settings.preemption_cost and state.settings.restart_penalty):
        return {}
    out: dict[JobId, float] = {}
    for jid, view in running.items():
        current = view.current
        base = state.base_rate.get(jid)
        if current is None or not base:
            continue
        rate = state.estimator.config_rate(view.spec, current, state.servers)
        if rate is None or rate <= 0:
            continue
        share = min(1.0, preemption_cost_s(view.spec) / horizon_s(state.settings, view.spec.restart_s))
        weight = state.weights.get(jid, 1.0)
        if state.speed_weight is None:
            out[jid] = weight * rate / base * share
        else:
            expected = state.expected_gain.get(jid, 1.0)
            out[jid] = weighted_gain(weight, state.speed_weight, rate / base, expected) * share
    return out


def build_exact_program(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    free: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    allowed: Mapping[JobId, Mapping[GpuType, Sequence[Server]]] | None = None,
    counts: Mapping[JobId, Collection[int]] | None = None,
) -> tuple[list[Option], list[Config], list[float]]:
    """The location-specific program: one option per (job, configuration), per-server GPU capacity.

    Window jobs get every generated configuration (over `allowed[job]` servers when given, of
    `counts[job]` GPUs when given); running jobs outside the window their current one and, when it is
    on one server and no `allowed` restricts the program, the same GPU count on any other server (a
    move). A running job always has its current configuration.
    """
    server_ids = sorted(sid for sid in free if free[sid] > 0)
    resource = {sid: r for r, sid in enumerate(server_ids)}
    capacity: list[float] = [float(free[sid]) for sid in server_ids]
    tenant_resource = tenant_resources(state, jobs, capacity)
    type_resource = tenant_type_resources(state, jobs, capacity)
    options: list[Option] = []
    option_configs: list[Config] = []
    free_here = {sid: free[sid] for sid in server_ids}
    largest_type = max((sum(s.gpus for s in group) for group in state.by_type.values()), default=0)
    for i, view in enumerate(jobs):
        current = running.get(view.id)
        candidates = [] if current is None else _keep_candidate(state, view, current, free_here)
        if view.id in window:
            span = config_gen.may_span(
                view.spec, state.rho.get(view.id, 1.0), state.settings.sigma, state.largest
            )
            by_type = state.by_type if allowed is None else allowed.get(view.id, {})
            # Across GPU types: low-sensitivity jobs, and any job no one type can hold.
            # (never for a job without the runtime: it cannot split its batch by the shares)
            mixed = (
                state.settings.mixed_types
                and view.spec.runtime
                and not view.spec.one_server
                and (
                    state.rho.get(view.id, 1.0) <= state.settings.sigma
                    or view.spec.requirements.minimum > largest_type
                )
            )
            generated = config_gen.generate(
                view.spec,
                by_type,
                free_here,
                state.servers,
                state.estimator,
                span,
                None if counts is None else counts.get(view.id, ()),
                mixed=mixed and allowed is None,
            )
            candidates += [c for c in generated if c.config != current]
        elif current is not None and not current.distributed and allowed is None:
            # [ours] behind the window, a running job may also move whole to another server (same
            # GPU count): the move that frees whole servers for a wide job, or a faster GPU for it
            moves = config_gen.generate(
                view.spec, state.by_type, free_here, state.servers, state.estimator, False, (current.gpus,)
            )
            candidates += [c for c in moves if c.config != current]
        behind = view.id not in window
        t = tenant_resource.get(view.spec.tenant)
        if not candidates:
            continue
        keep_terms = value_terms(state, view, False)
        move_terms = keep_terms if current is None else value_terms(state, view, True)
        for cand in candidates:
            uses = [(resource[sid], float(g)) for sid, g in cand.config.parts]
            if t is not None:
                uses.append((t, float(cand.config.gpus)))
            if type_resource:
                cand_types = gpus_by_type(cand.config, state.servers)
                for (key, gpu_type), row in type_resource.items():
                    if gpu_type in cand_types and applies(key, view.spec.tenant):
                        uses.append((row, float(cand_types[gpu_type])))
            moved = current is not None and cand.config != current
            value = value_at(move_terms if moved else keep_terms, cand.rate)
            if behind and cand.config != current:
                value *= 1.0 - 1e-6  # a move that gains nothing (no restart penalty) loses to keeping
            options.append(Option(i, value, tuple(uses)))
            option_configs.append(cand.config)
    return options, option_configs, capacity


def tenant_resources(state: RoundState, jobs: Sequence[JobView], capacity: list[float]) -> dict[str, int]:
    """Add one capacity row per capped tenant (appended to `capacity`); returns tenant -> row."""
    rows: dict[str, int] = {}
    tenants = {v.spec.tenant for v in jobs}
    for name in sorted(tenants):
        quota = state.snapshot.tenants.get(name)
        if quota is not None and quota.cap_gpus is not None:
            rows[name] = len(capacity)
            capacity.append(float(max(0, quota.cap_gpus - state.tenant_held.get(name, 0))))
    return rows


def tenant_type_resources(
    state: RoundState, jobs: Sequence[JobView], capacity: list[float]
) -> dict[TypeKey, int]:
    """[ours] Add one capacity row per type limit (`state.type_limits`: caps and active guarantees per
    GPU type) that counts some of `jobs` (appended to `capacity`: the limit less what the fixed jobs it
    counts hold of the type); returns the limit's key -> row."""
    rows: dict[TypeKey, int] = {}
    tenants = {v.spec.tenant for v in jobs}
    room = type_room(state.type_limits, state.tenant_type_held)
    for key, gpu_type in sorted(state.type_limits):
        if any(applies(key, t) for t in tenants):
            rows[(key, gpu_type)] = len(capacity)
            capacity.append(float(max(0, room[(key, gpu_type)])))
    return rows


def explain_candidates(
    jobs: Sequence[JobView],
    options: Sequence[Option],
    option_configs: Sequence[Config],
    state: RoundState,
) -> dict[JobId, tuple[CandidateView, ...]]:
    by_item: dict[int, list[int]] = {}
    for k, o in enumerate(options):
        by_item.setdefault(o.item, []).append(k)
    out: dict[JobId, tuple[CandidateView, ...]] = {}
    for item, ks in by_item.items():
        view = jobs[item]
        weight = max(state.weights.get(view.id, 1.0), 1e-12)
        top = heapq.nlargest(5, ks, key=lambda k: options[k].value)
        out[view.id] = tuple(
            CandidateView(
                str(option_configs[k]),
                _shown_rate(state, view, options[k], option_configs[k], weight),
                options[k].value,
            )
            for k in top
        )
    return out


def _shown_rate(state: RoundState, view: JobView, option: Option, config: Config, weight: float) -> float:
    """The rate an explanation shows: the value over the weight in the base's units (restart factor
    and hold value included, as always), or with `speed_value = "neutral"`, whose value is not
    proportional to the rate, the estimator's rate of the configuration."""
    if state.speed_weight is None:
        return option.value / weight * state.base_rate[view.id]
    return state.estimator.config_rate(view.spec, config, state.servers) or 0.0


def _keep_candidate(
    state: RoundState, view: JobView, current: Config, free: Mapping[ServerId, int]
) -> list[config_gen.Candidate]:
    if not fits_capacity(current, free):
        return []
    rate = state.estimator.config_rate(view.spec, current, state.servers)
    return [] if rate is None or rate <= 0 else [config_gen.Candidate(current, rate)]


def fits_capacity(config: Config, capacity: Mapping[ServerId, int]) -> bool:
    return all(capacity.get(sid, 0) >= g for sid, g in config.parts)


def solve_exact(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    free: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    clock: Callable[[], float],
) -> tuple[dict[JobId, Config], SolverStats, dict[JobId, tuple[CandidateView, ...]]]:
    """Build the location-specific program of `jobs` over the `free` GPUs and solve it with CBC
    (hopsmgr.core.ilp): each job's chosen configuration, the solver's figures and each job's
    candidates as the program weighed them."""
    t0 = clock()
    options, option_configs, capacity = build_exact_program(state, jobs, window, free, running)
    t_cfg = clock()
    warm = {o.item: k for k, o in enumerate(options) if option_configs[k] == running.get(jobs[o.item].id)}
    solution = ilp.solve(
        options,
        capacity,
        ilp.SolveOptions(
            gap=state.settings.gap,
            time_limit_s=state.settings.time_limit_s,
            warm_start=warm,
            priority_order=tuple(range(len(jobs))),
            timer=clock,
            deadline=state.deadline,
            cbc_path=state.settings.cbc_path or None,
            local_rows=sum(1 for n in free.values() if n > 0),  # servers; tenant rows follow
        ),
    )
    assignment = {jobs[i].id: option_configs[o] for i, o in solution.choice.items()}
    explain = explain_candidates(jobs, options, option_configs, state)
    stats = SolverStats(
        method=solution.method,
        model="exact",
        variables=solution.variables,
        constraints=solution.constraints,
        config_s=t_cfg - t0,
        build_s=solution.build_s,
        solve_s=solution.solve_s,
        objective=solution.objective,
        bound=solution.bound,
        gap=solution.gap,
        proven=solution.proven,
        fallback=solution.fallback,
    )
    return assignment, stats, explain
