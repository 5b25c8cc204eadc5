"""[ours] Tenants' caps per GPU type (`cap_gpus_by_type`): the GPUs of one type a tenant's jobs may hold.

Pure helpers for the planner's places that enforce tenant caps (the program's capacity rows, the fill
of idle GPUs, the protected and kept jobs, reservations and backfill): how many GPUs of each type a
configuration uses, what each capped (tenant, type) pair holds, and what it may still take.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hopsmgr.core.model import Config, GpuType, Server, ServerId, TenantQuota

TypeKey = tuple[str, GpuType]
"""(tenant, GPU type)."""


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


def type_room(tenants: Mapping[str, TenantQuota], held: Mapping[TypeKey, int]) -> dict[TypeKey, int]:
    """For every capped (tenant, type): the GPUs of that type the tenant may still take (negative when
    it holds more than its cap, after the cap was lowered)."""
    return {
        (name, gpu_type): cap - held.get((name, gpu_type), 0)
        for name, quota in tenants.items()
        for gpu_type, cap in quota.type_caps
    }


def fits(tenant: str, uses: Mapping[GpuType, int], room: Mapping[TypeKey, int]) -> bool:
    """Whether GPUs by type `uses` stay within the tenant's room on every capped type."""
    return all(n <= room.get((tenant, gpu_type), n) for gpu_type, n in uses.items())


def take(tenant: str, uses: Mapping[GpuType, int], room: dict[TypeKey, int]) -> None:
    """Charge `uses` to the tenant's room on its capped types."""
    for gpu_type, n in uses.items():
        if (tenant, gpu_type) in room:
            room[(tenant, gpu_type)] -= n


def over_a_type_cap(tenant: str, room: Mapping[TypeKey, int]) -> frozenset[GpuType]:
    """The types on which `tenant` holds more than its cap."""
    return frozenset(gpu_type for (name, gpu_type), left in room.items() if name == tenant and left < 0)


def jobs_over_type_caps(
    placed: Mapping[str, Config],
    tenant_of: Mapping[str, str],
    tenants: Mapping[str, TenantQuota],
    servers: Mapping[ServerId, Server],
) -> frozenset[str]:
    """The jobs of `placed` (job -> configuration) that use a type on which their tenant, counting all of
    `placed`, holds more than its cap: such jobs lose their protection (a cap beats the quantum)."""
    if not any(q.type_caps for q in tenants.values()):
        return frozenset()
    held = held_by_type(((tenant_of[jid], c) for jid, c in placed.items()), servers)
    over = {key for key, left in type_room(tenants, held).items() if left < 0}
    return frozenset(
        jid
        for jid, config in placed.items()
        if any((tenant_of[jid], gpu_type) in over for gpu_type in gpus_by_type(config, servers))
    )


def gives_up_capped_gpus(
    quota: TenantQuota | None, current: Config, new: Config | None, servers: Mapping[ServerId, Server]
) -> bool:
    """Whether a change from `current` to `new` (None: preempted) holds fewer GPUs of a type the
    tenant's quota caps: the program's cap rows counted the new placement, so keeping the old one
    could break the cap."""
    if quota is None or not quota.type_caps:
        return False
    before = gpus_by_type(current, servers)
    after = gpus_by_type(new, servers) if new is not None else {}
    return any(before.get(gpu_type, 0) > after.get(gpu_type, 0) for gpu_type, _ in quota.type_caps)
