"""What is decided about a job before any plan places it: whether it can ever run on the cluster's
servers (`unplaceable_reason`), and the profiling queue's single-GPU runs for new jobs
(`profiling_runs`). Pure, like the rest of the core."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from hopsmgr.core.estimates import Estimator
from hopsmgr.core.model import ClusterSnapshot, GpuType, JobSpec, Server, ServerId
from hopsmgr.core.plan import ProfilingRun


def unplaceable_reason(
    job: JobSpec,
    servers: Iterable[Server],
    estimator: Estimator,
    type_gpus: Mapping[GpuType, int] | None = None,
    mixed: bool = False,
) -> str | None:
    """Why `job` can never run on these servers (whatever else runs), or None if it can.

    `type_gpus` (GPUs of `servers` per type) may be passed when asking for many jobs at once. With
    `mixed` (the `mixed_types` setting) a placement may span the profiled types."""
    if type_gpus is None:
        type_gpus = gpus_per_type(servers)
    if not type_gpus:
        return "no server is available"
    profiled = estimator.profiled_types(job.id)
    known = [t for t in type_gpus if t in profiled]
    if not known:
        return "no throughput estimate on any available GPU type (not profiled)"
    if job.one_server:
        largest_server = max((s.gpus for s in servers if s.gpu_type in profiled), default=0)
        if job.requirements.minimum > largest_server:
            return (
                f"smallest requirement {job.requirements.minimum} GPUs exceeds the {largest_server} GPUs "
                "of the largest profiled, available server, and the job runs on one server"
            )
        return None
    if mixed:
        together = sum(type_gpus[t] for t in known)
        if job.requirements.minimum > together:
            return (
                f"smallest requirement {job.requirements.minimum} GPUs exceeds the {together} GPUs of the "
                f"profiled, available GPU types together ({', '.join(sorted(known))})"
            )
        return None
    # without mixed_types, placements never mix GPU types: the job must fit one profiled type
    largest = max(known, key=lambda t: (type_gpus[t], t))
    if job.requirements.minimum > type_gpus[largest]:
        return (
            f"smallest requirement {job.requirements.minimum} GPUs exceeds the {type_gpus[largest]} GPUs "
            f"of the largest profiled, available GPU type ({largest}); placements do not mix GPU types"
        )
    return None


def gpus_per_type(servers: Iterable[Server]) -> dict[GpuType, int]:
    totals: dict[GpuType, int] = {}
    for s in servers:
        totals[s.gpu_type] = totals.get(s.gpu_type, 0) + s.gpus
    return totals


def profiling_runs(
    pending: Sequence[JobSpec], snapshot: ClusterSnapshot, estimator: Estimator, busy: Mapping[ServerId, int]
) -> list[ProfilingRun]:
    """One single-GPU run per new job and missing GPU type, spread over servers with idle GPUs (the
    server of the type with the most idle GPUs first). Stops as soon as no idle GPU is left."""
    heaps: dict[GpuType, list[tuple[int, int, Server]]] = {}
    for k, server in enumerate(snapshot.servers):
        free = snapshot.capacity.get(server.id, 0) - busy.get(server.id, 0)
        if free > 0:
            heaps.setdefault(server.gpu_type, []).append((-free, k, server))
    for heap in heaps.values():
        heapq.heapify(heap)
    runs: list[ProfilingRun] = []
    for job in sorted(pending, key=lambda j: (j.submit_time, j.id)):
        if not heaps:
            break
        for gpu_type in sorted(heaps):
            if estimator.has_profile(job.id, gpu_type):
                continue
            neg_free, k, server = heapq.heappop(heaps[gpu_type])
            runs.append(ProfilingRun(job.id, server.id, gpu_type))
            if neg_free + 1 < 0:
                heapq.heappush(heaps[gpu_type], (neg_free + 1, k, server))
            if not heaps[gpu_type]:
                del heaps[gpu_type]
    return runs
