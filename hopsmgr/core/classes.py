"""The program over server classes, refined into location-specific placements (large clusters).

Servers of one GPU type, host model and number of usable GPUs form a class. The class program has one
option per (job, class, GPU count), valued at the median server of the class's GPU type and host
model: far fewer variables than one
per (job, server, count). Each class has two rows: its GPUs, and its "large part" slots (a part of more
than half a server needs a server of its own). A running job's current configuration is an option of
its own (no restart penalty); spanning configurations stay inside a class.

Only the class program's LP relaxation is solved. Its support (which classes each job would use) then
restricts a location-specific program (`planner.build_exact_program`) to those GPU types, or, when that
would be too large, to those classes; that program is solved like the exact one (LP, rounding,
fix-and-resolve, reduced-cost MIP). GPUs still idle are offered greedily to window jobs left out, in
priority order. Values are the jobs' real per-server values throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from hopsmgr.core import configs as config_gen
from hopsmgr.core import ilp, typecaps
from hopsmgr.core.assignment import Option
from hopsmgr.core.model import Config, JobId, JobView, Server, ServerId
from hopsmgr.core.plan import CandidateView, SolverStats
from hopsmgr.core.program import (
    RoundState,
    ValueTerms,
    build_exact_program,
    explain_candidates,
    job_value,
    tenant_resources,
    tenant_type_resources,
    value_at,
    value_terms,
)


@dataclass(frozen=True, slots=True)
class ServerClass:
    key: tuple[str, str, int]
    servers: tuple[Server, ...]  # fastest first
    free: int  # usable GPUs per server

    @property
    def gpus(self) -> int:
        return self.free * len(self.servers)


class _ClassOption(NamedTuple):  # (a tuple: ~60,000 of them in a 4,096-GPU round)
    job: int
    cls: int | None  # None: the pinned current configuration
    gpus: int
    servers_needed: int
    pinned: Config | None


def build_classes(servers: Mapping[ServerId, Server], free: Mapping[ServerId, int]) -> list[ServerClass]:
    groups: dict[tuple[str, str, int], list[Server]] = {}
    for sid, n in free.items():
        if n > 0:
            s = servers[sid]
            groups.setdefault((s.gpu_type, s.host_model, n), []).append(s)
    return [
        ServerClass(key, tuple(sorted(members, key=_speed_key)), key[2])
        for key, members in sorted(groups.items())
    ]


def _speed_key(server: Server) -> tuple[float, float, int, str]:
    c = server.calibration
    return (-c.compute_factor, -c.data_factor, server.order, server.id)


def solve_by_classes(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    free: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    clock: Callable[[], float],
) -> tuple[dict[JobId, Config], SolverStats, dict[JobId, tuple[CandidateView, ...]]]:
    t0 = clock()
    classes = build_classes(state.servers, free)
    type_servers = config_gen.group_by_type((state.servers[s] for s in free), free)
    whole = sum(
        len(servers) * len(view.spec.requirements.counts)
        for view in jobs
        if view.id in window
        for servers in type_servers.values()
    )
    skip = whole <= SMALL_PROGRAM
    if skip:
        # The refinement will offer every server anyway: the class LP's answer would restrict nothing
        # (it was one CBC start and a class program's estimates for nothing, in most class-model
        # rounds of the 512-GPU simulation). The bound reported is then the refinement's LP bound.
        options: list[Option] = []
        meta: list[_ClassOption] = []
        capacity: list[float] = []
    else:
        options, meta = _class_program(state, jobs, window, classes, running)
        capacity = [x for cls in classes for x in (float(cls.gpus), float(len(cls.servers)))]
        tenant_rows = tenant_resources(state, jobs, capacity)
        type_rows = tenant_type_resources(state, jobs, capacity)
        if tenant_rows or type_rows:  # tenant caps, and limits per GPU type, bind the class answer too
            options = _with_tenant_rows(state, jobs, classes, options, meta, tenant_rows, type_rows)
    t_build = clock()
    relaxed = (
        ilp.Solution({}, 0.0, None, False, "skipped", None, 0, 0, 0.0, 0.0)
        if skip
        else ilp.solve(
            options,
            capacity,
            ilp.SolveOptions(
                gap=state.settings.gap,
                time_limit_s=state.settings.time_limit_s,
                mip=False,
                timer=clock,
                deadline=state.deadline,
                cbc_path=state.settings.cbc_path or None,
            ),
        )
    )
    t_class = clock()
    if skip:
        allowed: dict[JobId, dict[str, list[Server]]] = {
            view.id: type_servers for view in jobs if view.id in window
        }
        counts: dict[JobId, set[int]] | None = None
    else:
        allowed, counts = _refinement_scope(
            state, jobs, window, classes, meta, relaxed.support, free, type_servers
        )
    late = state.deadline is not None and t_class >= state.deadline
    # Past the deadline already: no refinement (its configurations alone take seconds at scale); running
    # jobs keep what they hold and the fill places window jobs greedily.
    restricted = set() if late else {jid for jid in window if jid in allowed}
    ex_options, ex_configs, ex_capacity = build_exact_program(
        state, jobs, restricted, free, running, allowed, counts
    )
    t_cfg = clock()
    warm = {o.item: k for k, o in enumerate(ex_options) if ex_configs[k] == running.get(jobs[o.item].id)}
    solution = ilp.solve(
        ex_options,
        ex_capacity,
        ilp.SolveOptions(
            # Half the gap: the refinement's LP bound sits above the exact optimum by the class model's
            # own loss, so stopping at the full gap from it left plans 1% below the exact bound.
            gap=state.settings.gap / 2,
            time_limit_s=state.settings.time_limit_s,
            warm_start=warm,
            priority_order=tuple(range(len(jobs))),
            timer=clock,
            # The class answer is a heuristic already: proving the refinement optimal (rather than
            # within the gap) bought nothing measurable and cost half the simulator's solver time.
            exact_below=0,
            # The neighbourhood MIP, stopped at a tenth of the time limit, is the last solver step: it
            # reached 0.99-0.999 of the refinement's LP bound at 512-1,024 GPUs, where a MIP over
            # every option took 0.4-2 s more for a few tenths of a point (docs/benchmarks.md).
            neighbourhood_s=0.1 * state.settings.time_limit_s,
            full_mip=False,
            deadline=state.deadline,
            cbc_path=state.settings.cbc_path or None,
            local_rows=sum(1 for n in free.values() if n > 0),  # servers; tenant rows follow
        ),
    )
    assignment = {jobs[i].id: ex_configs[o] for i, o in solution.choice.items()}
    t_solve = clock()
    _fill(state, jobs, free, assignment, window, running, clock)
    t_map = clock()
    objective = sum(
        _value_of(state, view, assignment[view.id], running) for view in jobs if view.id in assignment
    )
    stats = SolverStats(
        method=f"classes+{solution.method}",
        model="classes",
        variables=relaxed.variables + solution.variables,
        constraints=relaxed.constraints + solution.constraints,
        config_s=(t_build - t0) + (t_cfg - t_class),
        build_s=relaxed.build_s + solution.build_s,
        solve_s=relaxed.solve_s + solution.solve_s,
        map_s=t_map - t_solve,
        objective=objective,
        bound=solution.bound if skip else relaxed.bound,
        gap=None,
        proven=False,
        fallback=_fallback(relaxed, solution, late),
    )
    return assignment, stats, explain_candidates(jobs, ex_options, ex_configs, state)


def _fallback(relaxed: ilp.Solution, refined: ilp.Solution, late: bool) -> str | None:
    """What stood in for a solver answer: the class LP's failure (window jobs then only get the greedy
    fill), no time left for the refinement, the refinement's own fallback."""
    reasons = []
    if relaxed.fallback is not None:
        reasons.append(f"class LP: {relaxed.fallback}; window jobs placed by the greedy fill")
    elif late:
        reasons.append("deadline reached before the refinement; window jobs placed by the greedy fill")
    if refined.fallback is not None:
        reasons.append(f"refinement: {refined.fallback}")
    return "; ".join(reasons) or None


def _refinement_scope(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    classes: Sequence[ServerClass],
    meta: Sequence[_ClassOption],
    support: Mapping[int, tuple[int, ...]],
    free: Mapping[ServerId, int],
    type_servers: Mapping[str, list[Server]],
) -> tuple[dict[JobId, dict[str, list[Server]]], dict[JobId, set[int]] | None]:
    """Servers each job may use in the location-specific program that refines the class answer, and
    the GPU counts it may take there (None: all of its counts).

    Every server of the GPU types the job's LP support uses when that program stays small (the class
    program cannot tell servers of a class apart, nor fragments of a type): within 1% of the exact
    optimum at 512 GPUs. Above `REFINE_BUDGET` estimated options, only the servers of the support's
    classes with the support's GPU counts (at 4,096 GPUs the program over all counts there had 62,000
    options, too many for the deadline). Numbers: docs/benchmarks.md.
    """
    by_type: dict[JobId, dict[str, list[Server]]] = {}
    by_class: dict[JobId, dict[str, list[Server]]] = {}
    counts: dict[JobId, set[int]] = {}
    seen: set[tuple[int, int]] = set()
    for item, chosen in support.items():
        job = jobs[item]
        for o in chosen:
            c = meta[o].cls
            if c is None:
                continue
            gpu_type = classes[c].key[0]
            by_type.setdefault(job.id, {})[gpu_type] = type_servers[gpu_type]
            counts.setdefault(job.id, set()).add(meta[o].gpus)
            if (item, c) not in seen:  # classes partition the servers: a class adds servers once
                seen.add((item, c))
                by_class.setdefault(job.id, {}).setdefault(gpu_type, []).extend(classes[c].servers)
    estimate = sum(
        len(servers) * len(jobs[i].spec.requirements.counts)
        for i in support
        for servers in by_type.get(jobs[i].id, {}).values()
    )
    if estimate <= REFINE_BUDGET:
        return by_type, None
    for scope in by_class.values():
        for gpu_type, members in scope.items():
            scope[gpu_type] = sorted(members, key=lambda s: (s.order, s.id))
    return by_class, counts


REFINE_BUDGET = 20_000
SMALL_PROGRAM = 4_000


def _class_program(
    state: RoundState,
    jobs: Sequence[JobView],
    window: set[JobId],
    classes: Sequence[ServerClass],
    running: Mapping[JobId, Config],
) -> tuple[list[Option], list[_ClassOption]]:
    """Options per (job, class, GPU count) valued at the class's median server; rows per class: GPUs and
    large-part slots. Running jobs also get their current configuration as a pinned option."""
    class_of = {s.id: c for c, cls in enumerate(classes) for s in cls.servers}
    # Single-server options are valued at the median server of the class's GPU type and host model
    # (not of the class itself): classes that differ only in their free GPUs then share one estimate
    # per (job, GPU count), a third of the estimates a cold round made at 4,096 GPUs.
    groups: dict[tuple[str, str], list[Server]] = {}
    for cls in classes:
        groups.setdefault(cls.key[:2], []).extend(cls.servers)
    group_rep = {key: sorted(members, key=_speed_key)[len(members) // 2] for key, members in groups.items()}
    options: list[Option] = []
    meta: list[_ClassOption] = []

    def add(opt: _ClassOption, terms: ValueTerms, rate: float | None, uses: list[tuple[int, float]]) -> None:
        if rate is None or rate <= 0:
            return
        options.append(Option(opt.job, value_at(terms, rate), tuple(uses)))
        meta.append(opt)

    estimator, servers = state.estimator, state.servers
    for i, view in enumerate(jobs):
        current = running.get(view.id)
        if current is not None and all(sid in class_of for sid in current.servers):
            pinned: dict[int, float] = {}
            for sid, g in current.parts:
                c = class_of[sid]
                pinned[2 * c] = pinned.get(2 * c, 0.0) + g
                if 2 * g > classes[c].free:
                    pinned[2 * c + 1] = pinned.get(2 * c + 1, 0.0) + 1
            add(
                _ClassOption(i, None, current.gpus, len(current.parts), current),
                value_terms(state, view, False),
                estimator.config_rate(view.spec, current, servers),
                list(pinned.items()),
            )
        if view.id not in window:
            continue
        span = config_gen.may_span(
            view.spec, state.rho.get(view.id, 1.0), state.settings.sigma, state.largest
        )
        terms = value_terms(state, view, view.id in running)  # every class option is a launch or a move
        for c, cls in enumerate(classes):
            if not state.estimator.has_profile(view.id, cls.key[0]):
                continue
            rep = group_rep[cls.key[:2]]
            for gpus in view.spec.requirements:
                if gpus <= cls.free:
                    uses = [(2 * c, float(gpus))] + ([(2 * c + 1, 1.0)] if 2 * gpus > cls.free else [])
                    # config_rate of {rep: gpus}, without building the configuration
                    per_gpu = estimator.per_gpu_rate(view.spec, rep, gpus, 1)
                    rate = None if per_gpu is None else per_gpu * gpus
                    add(_ClassOption(i, c, gpus, 1, None), terms, rate, uses)
                elif span:
                    n = math.ceil(gpus / cls.free)
                    if n > len(cls.servers):
                        continue
                    rest = gpus - cls.free * (n - 1)
                    parts = {s.id: cls.free for s in cls.servers[: n - 1]}
                    parts[cls.servers[n - 1].id] = rest
                    big = (n - 1) + (1 if 2 * rest > cls.free else 0)
                    add(
                        _ClassOption(i, c, gpus, n, None),
                        terms,
                        estimator.config_rate(view.spec, Config.of(parts), servers),
                        [(2 * c, float(gpus)), (2 * c + 1, float(big))],
                    )
    return options, meta


def _with_tenant_rows(
    state: RoundState,
    jobs: Sequence[JobView],
    classes: Sequence[ServerClass],
    options: list[Option],
    meta: Sequence[_ClassOption],
    tenant_rows: Mapping[str, int],
    rows: Mapping[typecaps.TypeKey, int],
) -> list[Option]:
    """The class options with their uses of the tenant caps' rows (`tenant_resources`) and the type
    limits' (`tenant_type_resources`): a class option's GPUs are all of its class's type; a pinned
    one's are its configuration's."""
    out: list[Option] = []
    for option, opt in zip(options, meta, strict=True):
        tenant = jobs[opt.job].spec.tenant
        capped = [(tenant_rows[tenant], float(opt.gpus))] if tenant in tenant_rows else []
        if opt.cls is not None:
            uses_by_type = {classes[opt.cls].key[0]: opt.gpus}
        else:
            assert opt.pinned is not None  # an option is of a class or the pinned current configuration
            uses_by_type = typecaps.gpus_by_type(opt.pinned, state.servers)
        extra = capped + [
            (row, float(uses_by_type[gpu_type]))
            for (key, gpu_type), row in rows.items()
            if gpu_type in uses_by_type and typecaps.applies(key, tenant)
        ]
        out.append(Option(option.item, option.value, option.uses + tuple(extra)) if extra else option)
    return out


def _value_of(state: RoundState, view: JobView, config: Config, running: Mapping[JobId, Config]) -> float:
    rate = state.estimator.config_rate(view.spec, config, state.servers) or 0.0
    return job_value(state, view, rate, moved=_moved(view.id, config, running))


def _fill(
    state: RoundState,
    jobs: Sequence[JobView],
    free: Mapping[ServerId, int],
    assignment: dict[JobId, Config],
    window: set[JobId],
    running: Mapping[JobId, Config],
    clock: Callable[[], float],
) -> None:
    """Offer the GPUs left idle to window jobs without a place, in priority order (until the deadline).

    A job is offered single-server configurations first; spanning ones only when none fits (generating
    and estimating every spanning configuration for hundreds of jobs cost seconds at 4,096 GPUs)."""
    end = None if state.deadline is None else state.deadline + min(0.1 * state.settings.time_limit_s, 0.5)
    left = dict(free)
    by_id = {v.id: v for v in jobs}
    tenant_left: dict[str, float] = {
        name: float(q.cap_gpus - state.tenant_held.get(name, 0))
        for name, q in state.snapshot.tenants.items()
        if q.cap_gpus is not None
    }
    type_left = typecaps.type_room(state.type_limits, state.tenant_type_held)
    for job_id, config in assignment.items():
        for s, g in config.parts:
            left[s] -= g
        tenant = by_id[job_id].spec.tenant if job_id in by_id else ""
        if tenant in tenant_left:
            tenant_left[tenant] -= config.gpus
        if type_left:
            typecaps.take(tenant, typecaps.gpus_by_type(config, state.servers), type_left)
    for view in jobs:
        if view.id in assignment or view.id not in window:
            continue
        room = min(float(sum(left.values())), tenant_left.get(view.spec.tenant, math.inf))
        if room < view.spec.requirements.minimum:
            continue
        if end is not None and clock() >= end:
            break
        here = {s: n for s, n in left.items() if n > 0}
        by_type = config_gen.group_by_type((state.servers[s] for s in here), here)
        candidates = config_gen.generate(view.spec, by_type, here, state.servers, state.estimator, False)
        candidates = [c for c in candidates if c.config.gpus <= room]
        if not candidates and config_gen.may_span(
            view.spec, state.rho.get(view.id, 1.0), state.settings.sigma, state.largest
        ):
            candidates = config_gen.generate(view.spec, by_type, here, state.servers, state.estimator, True)
            candidates = [c for c in candidates if c.config.gpus <= room]
        if not candidates and _too_wide_for_a_type(state, view):
            # The class program places within one type; a job no type can hold may span types here.
            candidates = config_gen.mixed_candidates(
                view.spec, by_type, here, state.servers, state.estimator, None, set()
            )
            candidates = [c for c in candidates if c.config.gpus <= room]
        tenant = view.spec.tenant
        if type_left:
            candidates = [
                c
                for c in candidates
                if typecaps.fits(tenant, typecaps.gpus_by_type(c.config, state.servers), type_left)
            ]
        if not candidates:
            continue
        best = max(
            candidates, key=lambda c: job_value(state, view, c.rate, _moved(view.id, c.config, running))
        )
        for s, g in best.config.parts:
            left[s] -= g
        if tenant in tenant_left:
            tenant_left[tenant] -= best.config.gpus
        if type_left:
            typecaps.take(tenant, typecaps.gpus_by_type(best.config, state.servers), type_left)
        assignment[view.id] = best.config


def _too_wide_for_a_type(state: RoundState, view: JobView) -> bool:
    """With `mixed_types`, a runtime job whose smallest count exceeds every GPU type's GPUs."""
    if not (state.settings.mixed_types and view.spec.runtime) or view.spec.one_server:
        return False
    largest = max((sum(s.gpus for s in group) for group in state.by_type.values()), default=0)
    return view.spec.requirements.minimum > largest


def _moved(job_id: JobId, config: Config, running: Mapping[JobId, Config]) -> bool:
    return job_id in running and running[job_id] != config
