"""Greedy placement primitives the baselines (Gavel, Sia, FIFO) share.

Pure helpers: usable capacity, servers per type, throughput of n GPUs of a type on a representative
placement, and packing a GPU count onto a type's servers (best fit on one server, else the fewest
servers, largest free first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import ClusterSnapshot, Config, GpuType, JobId, JobSpec, JobView, Server, ServerId
from hopsmgr.core.planner import Plan, PlanKind, SolverStats

# How the Gavel and Sia baselines order their queue: as published, or by latency ratio (the Hops paper's
# comparison).
QueueOrder = Literal["published", "latency_ratio"]
QUEUE_ORDERS: tuple[str, ...] = ("published", "latency_ratio")


def usable_capacity(snapshot: ClusterSnapshot) -> dict[ServerId, int]:
    """GPUs each known server can give this round (never more than it has); servers giving none left out."""
    servers = snapshot.server_map()
    out: dict[ServerId, int] = {}
    for sid, n in snapshot.capacity.items():
        if sid in servers and n > 0:
            out[sid] = min(n, servers[sid].gpus)
    return out


def servers_by_type(
    snapshot: ClusterSnapshot, capacity: Mapping[ServerId, int]
) -> dict[GpuType, list[Server]]:
    """Servers with usable GPUs, per GPU type, in adjacency order (`order`, then id)."""
    groups: dict[GpuType, list[Server]] = {}
    for server in sorted(snapshot.servers, key=lambda s: (s.order, s.id)):
        if capacity.get(server.id, 0) > 0:
            groups.setdefault(server.gpu_type, []).append(server)
    return groups


def type_gpus(
    by_type: Mapping[GpuType, Sequence[Server]], capacity: Mapping[ServerId, int]
) -> dict[GpuType, int]:
    return {t: sum(capacity[s.id] for s in servers) for t, servers in by_type.items()}


def fits(config: Config, free: Mapping[ServerId, int]) -> bool:
    return all(free.get(sid, 0) >= g for sid, g in config.parts)


def take(config: Config, free: dict[ServerId, int]) -> None:
    for sid, g in config.parts:
        free[sid] = free.get(sid, 0) - g


def pack(
    servers: Sequence[Server], free: Mapping[ServerId, int], gpus: int, one_server: bool = False
) -> Config | None:
    """`gpus` GPUs on these servers: best fit on one server, else (not for a job submitted for
    `one_server`) the fewest servers; None if they lack room.

    One server: the one with the least free GPUs that still holds `gpus` (earliest in order on ties).
    Several: servers by free GPUs, most first, until the count is covered; the last piece goes to the
    server with the least free GPUs that holds it, so the count of servers is minimal and fragments small.
    """
    if gpus <= 0:
        return None
    rank = {s.id: k for k, s in enumerate(servers)}
    holders = [s for s in servers if free.get(s.id, 0) >= gpus]
    if holders:
        best = min(holders, key=lambda s: (free[s.id], rank[s.id]))
        return Config.single(best.id, gpus)
    if one_server:
        return None
    pool = sorted((s for s in servers if free.get(s.id, 0) > 0), key=lambda s: (-free[s.id], rank[s.id]))
    if sum(free[s.id] for s in pool) < gpus:
        return None
    parts: dict[ServerId, int] = {}
    need = gpus
    for k, server in enumerate(pool):
        if free[server.id] >= need:
            # Last piece: best fit among the servers not used yet.
            last = min((s for s in pool[k:] if free[s.id] >= need), key=lambda s: (free[s.id], rank[s.id]))
            parts[last.id] = need
            return Config.of(parts)
        parts[server.id] = free[server.id]
        need -= free[server.id]
    return None


def representative_rate(
    estimator: Estimator,
    job: JobSpec,
    servers: Sequence[Server],
    capacity: Mapping[ServerId, int],
    server_map: Mapping[ServerId, Server],
    gpus: int,
) -> float | None:
    """Samples/s of `job` on `gpus` GPUs of one type (the type of `servers`), None if unknown or too big.

    Measured on a representative placement of the whole type (not of what is free now): the first server
    in order that holds `gpus`, else the fewest servers (as `pack` chooses over the full capacity).
    """
    if not servers or not estimator.has_profile(job.id, servers[0].gpu_type):
        return None
    holder = next((s for s in servers if capacity.get(s.id, 0) >= gpus), None)
    config = Config.single(holder.id, gpus) if holder is not None else pack(servers, capacity, gpus)
    if config is None:
        return None
    rate = estimator.config_rate(job, config, server_map)
    return rate if rate is not None and rate > 0 else None


def unplaceable_reasons(
    views: Iterable[JobView],
    gpus_of_type: Mapping[GpuType, int],
    estimator: Estimator,
    size: Callable[[JobSpec], int],
) -> dict[JobId, str]:
    """Jobs that can never run as the policy sizes them: no profiled type, or `size` above every such type."""
    reasons: dict[JobId, str] = {}
    for view in views:
        known = {t: n for t, n in gpus_of_type.items() if estimator.has_profile(view.id, t)}
        if not known:
            reasons[view.id] = "no throughput estimate on any available GPU type (not profiled)"
        elif size(view.spec) > max(known.values()):
            reasons[view.id] = (
                f"needs {size(view.spec)} GPUs, more than any profiled GPU type has "
                f"(largest: {max(known.values())})"
            )
    return reasons


def kept_placements(
    views: Iterable[JobView], free: dict[ServerId, int], keep: Callable[[JobView], bool] | None = None
) -> dict[JobId, Config]:
    """Running jobs that keep their current placement where it still fits (taken from `free`)."""
    out: dict[JobId, Config] = {}
    for view in views:
        if view.current is not None and (keep is None or keep(view)) and fits(view.current, free):
            take(view.current, free)
            out[view.id] = view.current
    return out


def idle_after(capacity: Mapping[ServerId, int], assignments: Mapping[JobId, Config]) -> int:
    used: dict[ServerId, int] = {}
    for config in assignments.values():
        for sid, g in config.parts:
            used[sid] = used.get(sid, 0) + g
    return sum(max(0, n - used.get(sid, 0)) for sid, n in capacity.items())


def arrival_order(views: Iterable[JobView]) -> list[JobView]:
    return sorted(views, key=lambda v: (v.spec.submit_time, v.id))


def keep_plan(
    snapshot: ClusterSnapshot, capacity: Mapping[ServerId, int], kind: PlanKind, model: str, elapsed_s: float
) -> Plan:
    """The answer of a policy without fragment plans to a within-round call: keep what runs."""
    kept = kept_placements(snapshot.jobs, dict(capacity))
    return Plan(
        kind,
        snapshot.now,
        kept,
        order=tuple(v.id for v in snapshot.jobs),
        stats=SolverStats(method="keep", model=model, total_s=elapsed_s),
        idle_gpus=idle_after(capacity, kept),
    )
