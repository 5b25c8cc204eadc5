"""[ours] Tenants' caps and guarantees per GPU type (`cap_gpus_by_type`, `guaranteed_gpus_by_type`).

Both become *type limits*, each a capacity row on the GPUs of one type held by some tenants' jobs:
- a cap: row (tenant, type), the tenant's own jobs, at most its cap;
- a guarantee of G GPUs of a type, while the tenant holds fewer and has a waiting job that could run
  there within the shortfall: row ("!" + tenant, type), every *other* tenant's jobs, at most the type's
  GPUs less G. Other tenants borrow those GPUs freely while the owner does not want them; when it does,
  the borrowers over the row lose their protection and the plan checkpoints them (as a tenant's own
  `guaranteed_gpus` reclaims borrowed GPUs), and the owner's waiting job goes to the head of the queue.

Pure helpers for every place of the planner that enforces tenant caps (the program's rows, the fill of
idle GPUs, protected and kept jobs, reservations and backfill). Tenant names cannot hold "!".
"""

from __future__ import annotations

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
    """The type limits of this instant: every cap per type, and every guarantee per type whose tenant
    holds fewer GPUs of the type than guaranteed and has a waiting job with a rate there (from
    `estimator`; without one, any waiting job) whose smallest count fits the shortfall."""
    out: dict[TypeKey, int] = {}
    for name, quota in snapshot.tenants.items():
        for gpu_type, cap in quota.type_caps:
            out[(name, gpu_type)] = cap
    owed = owed_by_type(snapshot, estimator)
    if owed:
        total: dict[GpuType, int] = {}
        for server in snapshot.servers:
            total[server.gpu_type] = total.get(server.gpu_type, 0) + server.gpus
        for name, gpu_type in {key for key in owed.values()}:
            guaranteed = dict(snapshot.tenants[name].type_guarantees)[gpu_type]
            out[(OTHERS + name, gpu_type)] = max(0, total.get(gpu_type, 0) - guaranteed)
    return out


def owed_by_type(snapshot: ClusterSnapshot, estimator: Estimator | None = None) -> dict[JobId, TypeKey]:
    """The waiting jobs within their tenant's shortfall under a guarantee per type (job -> (tenant,
    type)), by submit time: they go to the head of the queue, and make the guarantee's limit active."""
    guaranteed = {name: q.type_guarantees for name, q in snapshot.tenants.items() if q.type_guarantees}
    if not guaranteed:
        return {}
    short = _shortfalls(snapshot, guaranteed, snapshot.server_map())
    out: dict[JobId, TypeKey] = {}
    waiting = sorted(
        (v for v in snapshot.jobs if v.current is None), key=lambda v: (v.spec.submit_time, v.id)
    )
    for view in waiting:
        for gpu_type in sorted(t for (name, t) in short if name == view.spec.tenant):
            key = (view.spec.tenant, gpu_type)
            need = view.spec.requirements.minimum
            if need <= short[key] and _runs_on(view, gpu_type, estimator):
                out[view.id] = key
                short[key] -= need
                break
    return out


def _shortfalls(
    snapshot: ClusterSnapshot,
    guaranteed: Mapping[str, tuple[tuple[GpuType, int], ...]],
    servers: Mapping[ServerId, Server],
) -> dict[TypeKey, int]:
    held = held_by_type(
        (
            (v.spec.tenant, v.current)
            for v in snapshot.jobs
            if v.current is not None and v.spec.tenant in guaranteed
        ),
        servers,
    )
    return {
        (name, gpu_type): g - held.get((name, gpu_type), 0)
        for name, pairs in guaranteed.items()
        for gpu_type, g in pairs
        if held.get((name, gpu_type), 0) < g
    }


def _runs_on(view: JobView, gpu_type: GpuType, estimator: Estimator | None) -> bool:
    if estimator is None:
        return True
    rate = estimator.type_rate(view.spec, gpu_type)
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
    on its type: such jobs lose their protection (a cap, or an owner's guarantee, beats the quantum)."""
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


def gives_up_limited_gpus(
    tenant: str,
    limits_now: Mapping[TypeKey, int],
    current: Config,
    new: Config | None,
    servers: Mapping[ServerId, Server],
) -> bool:
    """Whether a change from `current` to `new` (None: preempted) holds fewer GPUs of a type under a
    limit that counts `tenant`: the program's rows counted the new placement, so keeping the old one
    could break the limit."""
    types = {gpu_type for key, gpu_type in limits_now if applies(key, tenant)}
    if not types:
        return False
    before = gpus_by_type(current, servers)
    after = gpus_by_type(new, servers) if new is not None else {}
    return any(before.get(gpu_type, 0) > after.get(gpu_type, 0) for gpu_type in types)


def head_first(ordered: list[JobView], first: Iterable[JobId]) -> list[JobView]:
    """`ordered` with the jobs of `first` moved to its head, in their own order."""
    ids = set(first)
    if not ids:
        return ordered
    return [v for v in ordered if v.id in ids] + [v for v in ordered if v.id not in ids]
