"""Configuration generation and placement sensitivity (HOPS.md section 4).

For each window job, per GPU type and per requirement R_k, over servers with usable GPUs:
- aggregated `{t: R_k}` on every server t that can hold R_k;
- for low-sensitivity jobs, distributed configurations over adjacent servers of the type (in `order`),
  each server filled as much as possible, one per starting server, so the space stays O(servers);
  generation for R_k stops once too few servers remain after the start.
A high-sensitivity job (rho > sigma) gets aggregated configurations only, unless no single server of
any type can hold its smallest requirement: then it may span servers too (our reading of the paper);
and a count larger than every server of a type spans that type's servers [ours].
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import Config, GpuType, JobSpec, Server, ServerId


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    rate: float


@functools.lru_cache(maxsize=65536)
def _single(server: ServerId, gpus: int) -> Config:
    """Configurations are immutable values: one object per (server, GPUs) is enough."""
    return Config.single(server, gpus)


def group_by_type(servers: Iterable[Server], capacity: Mapping[ServerId, int]) -> dict[GpuType, list[Server]]:
    """Servers with usable GPUs, per type, in adjacency order."""
    groups: dict[GpuType, list[Server]] = {}
    for server in sorted(servers, key=lambda s: (s.order, s.id)):
        if capacity.get(server.id, 0) > 0:
            groups.setdefault(server.gpu_type, []).append(server)
    return groups


def sensitivity(job: JobSpec, by_type: Mapping[GpuType, Sequence[Server]], estimator: Estimator) -> float:
    """Placement sensitivity rho: worst case over GPU types with two servers (1.0 when unknown)."""
    worst = 1.0
    for servers in by_type.values():
        if len(servers) >= 2:
            rho = estimator.sensitivity(job, servers[0], servers[1])
            if rho is not None:
                worst = max(worst, rho)
    return worst


def may_span(job: JobSpec, rho: float, sigma: float, largest_server: int) -> bool:
    """Low-sensitivity jobs may span servers; high-sensitivity ones only if nothing else can hold them;
    a job submitted for one server never."""
    return not job.one_server and (rho <= sigma or job.requirements.minimum > largest_server)


def distributed_parts(
    servers: Sequence[Server], free: Mapping[ServerId, int], start: int, gpus: int
) -> list[tuple[ServerId, int]] | None:
    """Fill servers[start:] in order until `gpus` are found; None if they run out first."""
    parts: list[tuple[ServerId, int]] = []
    need = gpus
    for server in servers[start:]:
        take = min(free.get(server.id, 0), need)
        if take > 0:
            parts.append((server.id, take))
            need -= take
        if need == 0:
            return parts
    return None


def generate(
    job: JobSpec,
    by_type: Mapping[GpuType, Sequence[Server]],
    free: Mapping[ServerId, int],
    servers: Mapping[ServerId, Server],
    estimator: Estimator,
    span: bool,
    counts: Collection[int] | None = None,
    mixed: bool = False,
) -> list[Candidate]:
    """All candidate configurations of `job` over the `free` GPUs, with their estimated rates (only
    those of `counts` GPUs when given); with `mixed`, also placements across GPU types
    (`mixed_candidates`)."""
    out: list[Candidate] = []
    seen: set[Config] = set()
    if mixed and len(by_type) > 1 and not job.one_server:
        out += mixed_candidates(job, by_type, free, servers, estimator, counts, seen)
    for type_servers in by_type.values():
        largest = max((s.gpus for s in type_servers), default=0)
        for gpus in job.requirements:
            if counts is not None and gpus not in counts:
                continue
            for server in type_servers:
                if free.get(server.id, 0) >= gpus:
                    per_gpu = estimator.per_gpu_rate(job, server, gpus, 1)
                    if per_gpu is not None and per_gpu > 0:
                        out.append(Candidate(_single(server.id, gpus), per_gpu * gpus))
            # [ours] a count no server of this type can hold spans its servers even for a
            # high-sensitivity job: otherwise the type could never run it, however fast it is there
            # (the program still weighs the estimated cross-server rate against every other option)
            if job.one_server or not (span or gpus > largest):
                continue
            for start in range(len(type_servers)):
                parts = distributed_parts(type_servers, free, start, gpus)
                if parts is None:
                    break
                if len(parts) < 2:
                    continue
                _add(out, seen, parts, job, servers, estimator)
    return out


def _add(
    out: list[Candidate],
    seen: set[Config],
    parts: list[tuple[ServerId, int]],
    job: JobSpec,
    servers: Mapping[ServerId, Server],
    estimator: Estimator,
) -> None:
    """Append the configuration of `parts` with its estimated rate, unless seen or without a rate."""
    config = Config(tuple(sorted(parts)))
    if config in seen:
        return
    seen.add(config)
    rate = estimator.config_rate(job, config, servers)
    if rate is not None and rate > 0:
        out.append(Candidate(config, rate))


def mixed_candidates(
    job: JobSpec,
    by_type: Mapping[GpuType, Sequence[Server]],
    free: Mapping[ServerId, int],
    servers: Mapping[ServerId, Server],
    estimator: Estimator,
    counts: Collection[int] | None,
    seen: set[Config],
) -> list[Candidate]:
    """[ours] Placements that span GPU types, for low-sensitivity jobs: per requirement, the free GPUs
    taken greedily from the fastest servers (for this job) and, separately, from the servers with the
    most free GPUs (the fewest servers, using fragments whole); kept only if they span two types. The
    ranks split the global batch by speed (Estimator.rank_shares), so slow GPUs add their own rate
    instead of setting the pace of all. O(servers log servers) per requirement."""
    pool = [s for group in by_type.values() for s in group if free.get(s.id, 0) > 0]
    speed: dict[ServerId, float] = {}
    for server in pool:
        rate = estimator.per_gpu_rate(job, server, 1, 1)
        if rate is not None and rate > 0:
            speed[server.id] = rate
    pool = [s for s in pool if s.id in speed]
    orders = (
        sorted(pool, key=lambda s: (-speed[s.id], s.order, s.id)),
        sorted(pool, key=lambda s: (-free.get(s.id, 0), -speed[s.id], s.order, s.id)),
    )
    out: list[Candidate] = []
    for gpus in job.requirements:
        if counts is not None and gpus not in counts:
            continue
        for order in orders:
            parts = distributed_parts(order, free, 0, gpus)
            if parts is None or len({servers[sid].gpu_type for sid, _ in parts}) < 2:
                continue
            _add(out, seen, parts, job, servers, estimator)
    return out
