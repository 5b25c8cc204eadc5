"""Reservations for big gang jobs, and backfill on the servers they drain (pure).

Why: the program values a job by its normalised throughput times its priority weight, so one waiting
32-GPU job is worth about what one 1-GPU job is, and a flood of small jobs that always fit first keeps
it waiting until its latency ratio is tens of times theirs. Once a waiting job of at least
`reserve_min_gpus` GPUs has a latency ratio past `reserve_after_lr`, it gets servers reserved: those
of one profiled GPU type, at one of its counts, that are expected to be free soonest (idle GPUs now, a
running job's GPUs at its estimated end), the choice with the earliest estimated finish. The reserved
servers drain gradually: what runs there keeps running (no plan preempts or moves it), nothing new
starts there but the reserved job and backfill, jobs whose P90 finish (the estimated run time times
`backfill_p90_factor`, plus the restart) falls before the reservation's start. When the reserved GPUs
are free the job starts there. A job still running on them a round after the soonest start estimated
for the reservation (it overran its estimate) may be preempted, unless its attempt is protected.

Reservations are kept between plans by the policy (`previous`): a job keeps its servers unless other
servers would free a round earlier, so a half-drained set is not abandoned for one that never drains.
Beyond the first (highest-priority) reservation, at most `reserve_share` of the cluster's GPUs are
reserved at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hopsmgr.core import typecaps
from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, JobId, JobView, Server, ServerId
from hopsmgr.core.plan import Backfill, Reservation
from hopsmgr.core.priority import PriorityContext, latency_ratio
from hopsmgr.core.program import checkpoint_s, protected
from hopsmgr.core.settings import SchedulerSettings


def eligible(view: JobView, ctx: PriorityContext, settings: SchedulerSettings) -> bool:
    """A waiting big job whose latency ratio passed the threshold."""
    return (
        view.current is None
        and view.spec.requirements.minimum >= settings.reserve_min_gpus
        and latency_ratio(view, ctx) >= settings.reserve_after_lr
    )


# [ours] A reservation whose GPUs are partly out of the capacity is kept this many rounds past its due start.
RESERVATION_GRACE_ROUNDS = 3


def reserved_servers(reservations: Sequence[Reservation]) -> frozenset[ServerId]:
    """The servers of these reservations (profiling runs keep off them: they would stop the drain)."""
    return frozenset(sid for r in reservations for sid in r.config.servers)


def estimated_end_s(
    view: JobView, config: Config, estimator: Estimator, servers: Mapping[ServerId, Server], now: float
) -> float:
    """When a running job is expected to end (never, without a rate estimate)."""
    rate = estimator.config_rate(view.spec, config, servers)
    return now + view.remaining_samples / rate if rate and rate > 0 else float("inf")


def release_s(view: JobView, end_s: float, now: float, settings: SchedulerSettings, first: bool) -> float:
    """When a running job's GPUs can be had for a reservation: at its end, or, with `reserve_preempt`,
    once it is checkpointed if that is sooner: by this plan if it is a first plan and the attempt is
    not protected, else by a first plan once its protection is over (a round later at most)."""
    if not settings.reserve_preempt:
        return end_s
    protection_left = settings.min_attempt_s + 2 * view.spec.restart_s - view.attempt_s
    wait = 0.0 if first and protection_left <= 0 else max(0.0, protection_left) + settings.round_seconds
    return min(end_s, now + wait + checkpoint_s(view.spec))


def free_times(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    capacity: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    first: bool,
) -> dict[ServerId, list[float]]:
    """Per server, when each of its usable GPUs is expected to be free for a reservation, soonest
    first: idle GPUs now, a running job's at its `release_s`."""
    servers = snapshot.server_map()
    times: dict[ServerId, list[float]] = {sid: [] for sid in capacity}
    views = {v.id: v for v in snapshot.jobs}
    for jid, config in running.items():
        view = views.get(jid)
        if view is None:
            continue
        end = estimated_end_s(view, config, estimator, servers, snapshot.now)
        free = release_s(view, end, snapshot.now, settings, first)
        for sid, g in config.parts:
            if sid in times:
                times[sid].extend([free] * g)
    for sid, n in capacity.items():
        held = len(times[sid])
        times[sid] = sorted([snapshot.now] * max(0, n - held) + times[sid])[: max(0, n)]
    return times


def _when(times: Mapping[ServerId, list[float]], config: Config) -> float | None:
    """When `config`'s GPUs are all expected free (None if a server cannot give them)."""
    start = 0.0
    for sid, g in config.parts:
        have = times.get(sid, [])
        if len(have) < g:
            return None
        start = max(start, have[g - 1])
    return start


def _gather(
    candidates: Sequence[Server], times: Mapping[ServerId, list[float]], gpus: int, one_server: bool = False
) -> tuple[Config, float] | None:
    """Servers that free `gpus` GPUs soonest (whole servers first, the last one in part); with
    `one_server`, the one server that frees them soonest."""
    if one_server:
        found = [
            (start, s) for s in candidates if (start := _when(times, Config.single(s.id, gpus))) is not None
        ]
        if not found:
            return None
        start, server = min(found, key=lambda f: (f[0], f[1].order, f[1].id))
        return Config.single(server.id, gpus), start
    order = sorted(candidates, key=lambda s: (times[s.id][-1], -len(times[s.id]), s.order, s.id))
    parts: list[tuple[ServerId, int]] = []
    need = gpus
    for server in order:
        n = len(times[server.id])
        if n == 0:
            continue
        take = min(n, need)
        parts.append((server.id, take))
        need -= take
        if need == 0:
            config = Config.of(dict(parts))
            start = _when(times, config)
            return None if start is None else (config, start)
    return None


def choose(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    ctx: PriorityContext,
    ordered: Sequence[JobView],
    times: Mapping[ServerId, list[float]],
    previous: Mapping[JobId, Reservation],
    room: dict[str, int] | None = None,
    type_room: dict[typecaps.TypeKey, int] | None = None,
) -> list[Reservation]:
    """The reservations of this plan, for eligible jobs in queue order, on disjoint servers. `room`:
    GPUs each capped tenant may still take, `type_room` each (tenant, type) capped by
    `cap_gpus_by_type` (both used up here: a reservation never exceeds a cap)."""
    if not settings.reservations:
        return []
    room = {} if room is None else room
    type_room = {} if type_room is None else type_room
    servers = snapshot.server_map()
    budget = settings.reserve_share * sum(len(t) for t in times.values())
    taken: set[ServerId] = set()
    out: list[Reservation] = []
    # Reservations already made come first, oldest first, then new ones in queue order: a job whose
    # servers were drained (or whose overrunning jobs were preempted) for it is not overtaken by one
    # whose ratio grew meanwhile, such as the preempted job itself (a preemption cycle).
    position = {v.id: k for k, v in enumerate(ordered)}
    original = list(ordered)
    ordered = sorted(
        ordered,
        key=lambda v: (
            (0, previous[v.id].since_s, position[v.id]) if v.id in previous else (1, 0.0, position[v.id])
        ),
    )
    type_gpus: dict[str, int] = {}  # whole servers: a GPU out of the capacity for a while still counts
    for sid in times:
        type_gpus[servers[sid].gpu_type] = type_gpus.get(servers[sid].gpu_type, 0) + servers[sid].gpus
    # Waiting jobs only one GPU type is big enough for: a narrower job's reservation avoids that type
    # where another will do (whole servers are kept for the jobs that need them).
    only: list[tuple[int, str]] = []
    for view in ordered:
        if view.current is None and view.spec.requirements.minimum >= settings.reserve_min_gpus:
            fits = [
                t
                for t in estimator.profiled_types(view.id)
                if type_gpus.get(t, 0) >= view.spec.requirements.minimum
            ]
            if len(fits) == 1:
                only.append((view.spec.requirements.minimum, fits[0]))
    ahead = _ahead_of_narrow(original, previous, settings)
    for view in ordered:
        if not eligible(view, ctx, settings) or (settings.reserve_at_head and view.id not in ahead):
            continue
        types = estimator.profiled_types(view.id)
        best: tuple[bool, float, int, Config, float] | None = None
        tenant = view.spec.tenant
        for gpus in view.spec.requirements.counts:
            if not _allowed(gpus, bool(out), budget, room.get(tenant)):
                continue
            for gpu_type in sorted(types):
                if not typecaps.fits(tenant, {gpu_type: gpus}, type_room):
                    continue
                pool = [
                    servers[sid] for sid in times if sid not in taken and servers[sid].gpu_type == gpu_type
                ]
                found = _gather(pool, times, gpus, view.spec.one_server)
                if found is None:
                    continue
                config, start = found
                rate = estimator.config_rate(view.spec, config, servers)
                if not rate or rate <= 0:
                    continue
                finish = start + view.remaining_samples / rate
                blocks = any(t == gpu_type and need > gpus for need, t in only)
                if best is None or (blocks, finish, gpus) < best[:3]:
                    best = (blocks, finish, gpus, config, start)
        old = previous.get(view.id)
        if old is not None and not any(s in taken for s in old.config.servers):
            old_start = _when(times, old.config)
            if (
                old_start is None
                and snapshot.now < old.due_s + RESERVATION_GRACE_ROUNDS * settings.round_seconds
            ):
                # Some of its GPUs are out of the capacity for now (a profiling run, a checkpoint being
                # written): they come back, and dropping the reservation would open the drained servers.
                old_start = max(old.start_s, snapshot.now)
            old_fits = _allowed(old.config.gpus, bool(out), budget, room.get(tenant)) and typecaps.fits(
                tenant, typecaps.gpus_by_type(old.config, servers), type_room
            )
            if (
                old_start is not None
                and old_fits
                and (best is None or not best[4] < old_start - settings.round_seconds)
            ):
                best = (False, 0.0, old.config.gpus, old.config, old_start)
        if best is None:
            continue
        _, _, gpus, config, start = best
        since, due = snapshot.now, start
        if old is not None:
            since = old.since_s
            if config == old.config:
                due = min(old.due_s, start)
        out.append(Reservation(view.id, config, start, since, due))
        taken.update(config.servers)
        budget -= config.gpus
        if tenant in room:
            room[tenant] -= config.gpus
        typecaps.take(tenant, typecaps.gpus_by_type(config, servers), type_room)
    return out


def _allowed(gpus: int, later: bool, budget: float, room: int | None) -> bool:
    """Within the share of the cluster reservations may take (the first is always allowed) and the
    tenant's cap (`room`: GPUs it may still take; None without a cap)."""
    return not (later and gpus > budget) and (room is None or gpus <= room)


def _ahead_of_narrow(
    ordered: Sequence[JobView], previous: Mapping[JobId, Reservation], settings: SchedulerSettings
) -> set[JobId]:
    """Waiting big jobs the queue puts ahead of every waiting narrower job (those already reserved
    too): by priority it is their turn, yet the program, valuing each job by its normalised
    throughput, would rather fill their GPUs with many small ones."""
    out = set(previous)
    for view in ordered:
        if view.current is not None:
            continue
        if view.spec.requirements.minimum < settings.reserve_min_gpus:
            break
        out.add(view.id)
    return out


def p90_finish_s(
    view: JobView,
    config: Config,
    estimator: Estimator,
    servers: Mapping[ServerId, Server],
    now: float,
    settings: SchedulerSettings,
) -> float | None:
    """[ours] A pessimistic finish of `view` started now on `config`: its restart, then the estimated
    run time times `backfill_p90_factor` (None without a rate estimate)."""
    rate = estimator.config_rate(view.spec, config, servers)
    if not rate or rate <= 0:
        return None
    return now + view.spec.restart_s + view.remaining_samples / rate * settings.backfill_p90_factor


# [ours] How many waiting jobs, in queue order, a backfill pass looks at.
BACKFILL_SCAN = 500


@dataclass(slots=True)
class Held:
    """What this plan's reservations do to it (`hold`), and the backfill it then makes (`backfill`)."""

    reservations: list[Reservation] = field(default_factory=list)
    start: dict[JobId, Config] = field(default_factory=dict)  # reserved jobs whose GPUs are free: start
    keep: dict[JobId, Config] = field(default_factory=dict)  # running on draining servers: kept as is
    closed: dict[ServerId, int] = field(default_factory=dict)  # idle GPUs of draining servers
    until: dict[ServerId, Reservation] = field(default_factory=dict)  # draining server -> its reservation
    waiting: set[JobId] = field(default_factory=set)  # reserved jobs not started: out of the program
    backfills: dict[JobId, Backfill] = field(default_factory=dict)

    @property
    def out_of_program(self) -> set[JobId]:
        """Reserved jobs that start now. A reserved job still waiting stays in the program: it may be
        placed elsewhere (the closed servers are out of the program's capacity)."""
        return set(self.start)


def hold(
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    ctx: PriorityContext,
    ordered: Sequence[JobView],
    capacity: Mapping[ServerId, int],
    running: Mapping[JobId, Config],
    previous: Mapping[JobId, Reservation],
    first: bool,
    type_limits: Mapping[typecaps.TypeKey, int],
) -> Held:
    """Choose the reservations and say, per reservation, whether its job starts now (its GPUs are idle)
    or its servers drain: their running jobs are kept (in a first plan, those that overran the
    reservation's start by a round and are not protected are not) and their idle GPUs are closed to
    the program, open only to backfill."""
    out = Held()
    if not settings.reservations:
        return out
    servers = snapshot.server_map()
    times = free_times(snapshot, estimator, settings, capacity, running, first)
    tenant_of = {v.id: v.spec.tenant for v in snapshot.jobs}
    type_room = typecaps.type_room(
        type_limits,
        typecaps.held_by_type(((tenant_of[j], c) for j, c in running.items()), servers),
    )
    out.reservations = choose(
        snapshot,
        estimator,
        settings,
        ctx,
        ordered,
        times,
        previous,
        tenant_room(snapshot, running),
        type_room,
    )
    idle = dict(capacity)
    on_server: dict[ServerId, list[JobId]] = {}
    for jid, config in running.items():
        for sid, g in config.parts:
            idle[sid] = idle.get(sid, 0) - g
            on_server.setdefault(sid, []).append(jid)
    views = {v.id: v for v in snapshot.jobs}
    for r in out.reservations:
        if all(idle.get(sid, 0) >= g for sid, g in r.config.parts):
            out.start[r.job_id] = r.config
            for sid, g in r.config.parts:
                idle[sid] -= g
            continue
        out.waiting.add(r.job_id)
        overran = first and snapshot.now >= r.due_s + settings.round_seconds
        for sid in r.config.servers:
            out.until[sid] = r
            out.closed[sid] = max(0, idle.get(sid, 0))
            for jid in on_server.get(sid, ()):
                view = views[jid]
                if first and not protected(view, settings.min_attempt_s):
                    end = estimated_end_s(view, running[jid], estimator, servers, snapshot.now)
                    if overran or (
                        settings.reserve_preempt and end > release_s(view, end, snapshot.now, settings, first)
                    ):
                        continue  # not kept: preempted (or moved) by this plan
                out.keep[jid] = running[jid]
    return out


def tenant_room(snapshot: ClusterSnapshot, running: Mapping[JobId, Config]) -> dict[str, int]:
    """GPUs each capped tenant may still take beyond what its jobs in `running` hold."""
    held: dict[str, int] = {}
    for view in snapshot.jobs:
        if view.id in running:
            held[view.spec.tenant] = held.get(view.spec.tenant, 0) + running[view.id].gpus
    return {
        name: q.cap_gpus - held.get(name, 0) for name, q in snapshot.tenants.items() if q.cap_gpus is not None
    }


def backfill(
    held: Held,
    snapshot: ClusterSnapshot,
    estimator: Estimator,
    settings: SchedulerSettings,
    ordered: Sequence[JobView],
    assignment: Mapping[JobId, Config],
    placeable: Collection[JobId],
    type_limits: Mapping[typecaps.TypeKey, int],
) -> dict[JobId, Config]:
    """Waiting jobs, in queue order, onto the idle GPUs of draining servers, each on one server at the
    count whose P90 finish is earliest, if that falls before the reservation's start (recorded in
    `held.backfills`). Tenant caps hold."""
    if not any(held.closed.values()):
        return {}
    servers = snapshot.server_map()
    used: dict[str, int] = {}
    tenant_of = {v.id: v.spec.tenant for v in snapshot.jobs}
    for jid, config in assignment.items():
        if jid in tenant_of:
            used[tenant_of[jid]] = used.get(tenant_of[jid], 0) + config.gpus
    type_room = typecaps.type_room(
        type_limits,
        typecaps.held_by_type(((tenant_of[j], c) for j, c in assignment.items() if j in tenant_of), servers),
    )
    closed = dict(held.closed)
    added: dict[JobId, Config] = {}
    scanned = 0
    for view in ordered:
        if not any(closed.values()) or scanned >= BACKFILL_SCAN:
            break
        if view.current is not None or view.id in assignment or view.id in held.out_of_program:
            continue
        if view.id not in placeable:
            continue
        scanned += 1
        quota = snapshot.tenants.get(view.spec.tenant)
        room = (
            None
            if quota is None or quota.cap_gpus is None
            else quota.cap_gpus - used.get(view.spec.tenant, 0)
        )
        types = estimator.profiled_types(view.id)
        best: tuple[float, Config, Reservation] | None = None
        for sid, n in closed.items():
            if n <= 0 or servers[sid].gpu_type not in types:
                continue
            r = held.until[sid]
            for gpus in view.spec.requirements.counts:
                if gpus > n or (room is not None and gpus > room):
                    continue
                if not typecaps.fits(view.spec.tenant, {servers[sid].gpu_type: gpus}, type_room):
                    continue
                config = Config.single(sid, gpus)
                finish = p90_finish_s(view, config, estimator, servers, snapshot.now, settings)
                if finish is not None and finish <= r.start_s and (best is None or finish < best[0]):
                    best = (finish, config, r)
        if best is None:
            continue
        finish, config, r = best
        added[view.id] = config
        held.backfills[view.id] = Backfill(r.job_id, r.start_s, finish)
        closed[config.servers[0]] -= config.gpus
        used[view.spec.tenant] = used.get(view.spec.tenant, 0) + config.gpus
        typecaps.take(view.spec.tenant, typecaps.gpus_by_type(config, servers), type_room)
    return added
