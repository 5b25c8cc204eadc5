"""[ours] Tenants' caps and guarantees per GPU type (`cap_gpus_by_type`, `guaranteed_gpus_by_type`).

Both become *type limits*, each a capacity row on the GPUs of one type held by some tenants' jobs:
- a cap: row (tenant, type), the tenant's own jobs, at most its cap;
- a guarantee of G GPUs of a type protects P = min(G, what the owner's jobs hold there + the smallest
  counts of its owed waiting jobs): while P > 0, row ("!" + tenant, type), every *other* tenant's jobs,
  at most the type's usable GPUs less P. The owner's jobs within the guarantee keep their GPUs;
  borrowers over the row lose their protection and the plan checkpoints them; owed jobs head the
  queue. Otherwise the others borrow the type freely (`plan_limits`).

Pure helpers for every place of the planner that enforces tenant caps (the program's rows, the fill of
idle GPUs, protected and kept jobs, reservations and backfill). Tenant names cannot hold "!".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobView, Server, ServerId

TypeKey = tuple[str, GpuType]
"""(tenant, GPU type), or ("!" + tenant, type) for the other tenants' room under a guarantee."""
OTHERS = "!"


def gpus_by_type(config: Config, servers: Mapping[ServerId, Server]) -> dict[GpuType, int]:
    """The GPUs of each type `config` uses."""
    out: dict[GpuType, int] = {}
    for sid, g in config.parts:
        gpu_type = servers[sid].gpu_type
        out[gpu_type] = out.get(gpu_type, 0) + g
    return out


def held_by_type(
    placements: Iterable[tuple[str, Config]], servers: Mapping[ServerId, Server]
) -> dict[TypeKey, int]:
    """GPUs held per (tenant, type) by `placements`: (tenant, configuration) pairs."""
    held: dict[TypeKey, int] = {}
    for tenant, config in placements:
        for gpu_type, n in gpus_by_type(config, servers).items():
            held[(tenant, gpu_type)] = held.get((tenant, gpu_type), 0) + n
    return held


def applies(key: str, tenant: str) -> bool:
    """Whether a limit's row (its key's first part) counts the jobs of `tenant`."""
    return key[1:] != tenant if key.startswith(OTHERS) else key == tenant


def limits(snapshot: ClusterSnapshot, estimator: Estimator | None = None) -> dict[TypeKey, int]:
    """The type limits of this instant (`plan_limits`' first part)."""
    return plan_limits(snapshot, estimator)[0]


def plan_limits(
    snapshot: ClusterSnapshot, estimator: Estimator | None = None
) -> tuple[dict[TypeKey, int], dict[JobId, TypeKey]]:
    """The type limits of this instant, and the waiting jobs owed GPUs under a guarantee per type
    (job -> (tenant, type)).

    Every cap per type is a limit. A guarantee of G GPUs of type T protects P = min(G, held + owed)
    of them: `held` the GPUs of T the owner's jobs hold, `owed` the smallest counts of its waiting
    jobs, by submit time, that fit the rest of the guarantee (and of its caps), can run on T (a rate
    there, the transfer prior's included, through `estimator`; without one, any job) and fit T's usable
    GPUs. While P > 0, the other tenants together may hold at most T's usable GPUs less P: the
    owner's jobs within the guarantee keep their GPUs, and its owed jobs get room there (the owed jobs
    also head the queue)."""
    guaranteed = {name: q.type_guarantees for name, q in snapshot.tenants.items() if q.type_guarantees}
    out: dict[TypeKey, int] = {}
    for name, quota in snapshot.tenants.items():
        for gpu_type, cap in quota.type_caps:
            out[(name, gpu_type)] = cap
    if not guaranteed:
        return out, {}
    servers = snapshot.server_map()
    capacity = snapshot.capacity
    usable: dict[GpuType, int] = {}
    largest: dict[GpuType, int] = {}
    for sid, n in capacity.items():
        if sid in servers and n > 0:
            gpu_type, n = servers[sid].gpu_type, min(n, servers[sid].gpus)
            usable[gpu_type] = usable.get(gpu_type, 0) + n
            largest[gpu_type] = max(largest.get(gpu_type, 0), n)

    def runs(config: Config | None) -> bool:  # as the planner takes running jobs: on usable GPUs
        return config is not None and all(
            sid in servers and capacity.get(sid, 0) >= g for sid, g in config.parts
        )

    running = [(v.spec.tenant, v.current) for v in snapshot.jobs if v.current is not None and runs(v.current)]
    held = held_by_type(((t, c) for t, c in running if t in guaranteed), servers)
    cap_left: dict[str, float] = {}
    for name in guaranteed:
        total_cap = snapshot.tenants[name].cap_gpus
        cap_left[name] = (
            math.inf if total_cap is None else total_cap - sum(c.gpus for t, c in running if t == name)
        )
    # What each type can still give owed jobs once every owner keeps what it holds within its guarantee.
    budget = dict(usable)
    room: dict[TypeKey, int] = {}
    for name, pairs in guaranteed.items():
        quota = snapshot.tenants[name]
        for gpu_type, g in pairs:
            have = held.get((name, gpu_type), 0)
            budget[gpu_type] = budget.get(gpu_type, 0) - min(g, have)
            type_cap = quota.cap_of_type(gpu_type)
            room[(name, gpu_type)] = min(g, type_cap if type_cap is not None else g) - have
    owed: dict[JobId, TypeKey] = {}
    # Waiting jobs, and running ones the planner will not keep where they are (their GPUs left the capacity).
    waiting = sorted(
        (v for v in snapshot.jobs if v.spec.tenant in guaranteed and not runs(v.current)),
        key=lambda v: (v.spec.submit_time, v.id),
    )
    minimum = {v.id: v.spec.requirements.minimum for v in waiting}
    for view in waiting:
        name, need = view.spec.tenant, view.spec.requirements.minimum
        for gpu_type in sorted(t for (n, t) in room if n == name):
            key = (name, gpu_type)
            fits_type = need <= (largest if view.spec.one_server else usable).get(gpu_type, 0)
            fits = need <= min(room[key], budget.get(gpu_type, 0), cap_left[name]) and fits_type
            if fits and _runs_on(view, gpu_type, servers, estimator):
                owed[view.id] = key
                room[key] -= need
                budget[gpu_type] -= need
                cap_left[name] -= need
                break
    for name, pairs in guaranteed.items():
        for gpu_type, g in pairs:
            wanted = sum(minimum[j] for j, key in owed.items() if key == (name, gpu_type))
            protected = min(g, held.get((name, gpu_type), 0) + wanted)
            if protected > 0:
                out[(OTHERS + name, gpu_type)] = max(0, usable.get(gpu_type, 0) - protected)
    return out, owed


def owed_by_type(snapshot: ClusterSnapshot, estimator: Estimator | None = None) -> dict[JobId, TypeKey]:
    """The waiting jobs owed GPUs under a guarantee per type (`plan_limits`' second part)."""
    return plan_limits(snapshot, estimator)[1]


def _runs_on(
    view: JobView, gpu_type: GpuType, servers: Mapping[ServerId, Server], estimator: Estimator | None
) -> bool:
    if estimator is None:
        return True
    server = next((s for s in servers.values() if s.gpu_type == gpu_type), None)
    if server is None:
        return False
    rate = estimator.per_gpu_rate(view.spec, server, 1, 1)
    return rate is not None and rate > 0


def type_room(limits_now: Mapping[TypeKey, int], held: Mapping[TypeKey, int]) -> dict[TypeKey, int]:
    """For every limit: the GPUs of its type its tenants' jobs may still take beyond `held` (per
    (tenant, type)); negative when they hold more, after a cap was lowered or while an owner waits."""
    return {
        (key, gpu_type): cap - sum(n for (t, k), n in held.items() if k == gpu_type and applies(key, t))
        for (key, gpu_type), cap in limits_now.items()
    }


def fits(tenant: str, uses: Mapping[GpuType, int], room: Mapping[TypeKey, int]) -> bool:
    """Whether GPUs by type `uses` of one of `tenant`'s jobs stay within every limit that counts it."""
    return all(
        uses[gpu_type] <= left
        for (key, gpu_type), left in room.items()
        if gpu_type in uses and applies(key, tenant)
    )


def take(tenant: str, uses: Mapping[GpuType, int], room: dict[TypeKey, int]) -> None:
    """Charge `uses` to every limit that counts `tenant`'s jobs."""
    for key, gpu_type in list(room):
        if applies(key, tenant) and gpu_type in uses:
            room[(key, gpu_type)] -= uses[gpu_type]


def jobs_over_type_caps(
    placed: Mapping[JobId, Config],
    tenant_of: Mapping[JobId, str],
    limits_now: Mapping[TypeKey, int],
    servers: Mapping[ServerId, Server],
) -> frozenset[JobId]:
    """The jobs of `placed` (job -> configuration) counted by a limit that `placed` as a whole exceeds,
    on its type: such jobs lose their protection (a cap, or an owner's guarantee, beats the quantum;
    jobs within their own tenant's `guaranteed_gpus` keep their place by its weight boost)."""
    if not limits_now:
        return frozenset()
    held = held_by_type(((tenant_of[jid], c) for jid, c in placed.items()), servers)
    over = [(key, gpu_type) for (key, gpu_type), left in type_room(limits_now, held).items() if left < 0]
    return frozenset(
        jid
        for jid, config in placed.items()
        if any(
            applies(key, tenant_of[jid]) and gpu_type in gpus_by_type(config, servers)
            for key, gpu_type in over
        )
    )


def change_back(
    current: Config, new: Config | None, servers: Mapping[ServerId, Server]
) -> dict[GpuType, int]:
    """GPUs per type that keeping `current` instead of `new` (None: preempted) holds more (or, negative,
    fewer) than the plan."""
    before = gpus_by_type(current, servers)
    after = gpus_by_type(new, servers) if new is not None else {}
    return {t: before.get(t, 0) - after.get(t, 0) for t in before.keys() | after.keys()}


def merged(*held: Mapping[TypeKey, int]) -> dict[TypeKey, int]:
    """The sum of GPUs held per (tenant, type)."""
    out: dict[TypeKey, int] = {}
    for part in held:
        for key, n in part.items():
            out[key] = out.get(key, 0) + n
    return out


def head_first(ordered: list[JobView], first: Iterable[JobId]) -> list[JobView]:
    """`ordered` with the jobs of `first` moved to its head, in their own order."""
    ids = set(first)
    if not ids:
        return ordered
    return [v for v in ordered if v.id in ids] + [v for v in ordered if v.id not in ids]
