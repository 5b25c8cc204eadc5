"""The fastest a job can run on a cluster of the paper world: best-case rates per server group.

A group is the servers of one GPU type and host model ("rtx3090/C"). A job's best-case rate on `n` GPUs
of a group is the paper world's `best_case_rates` (every part with the best hidden factors found in the
group) over every way of splitting `n` GPUs across the group's servers, times the job's own hidden
factor. No real placement in the group runs faster, and a placement spanning groups runs no faster than
its GPUs' shares of each group's rate at its count (tests/sim/test_jct_bound.py checks both), so these
rates bound what any scheduler can do: bench/jct_parts.py (a job's best run time) and bench/jct_bound.py
(a lower bound on the average JCT) read them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

from hopsmgr.core.model import Server
from hopsmgr.sim.engine import job_key
from hopsmgr.sim.paperworld import PaperWorld
from hopsmgr.sim.truth import gpu_key, job_factor
from hopsmgr.sim.workload import WorkloadJob


def group_of(server: Server) -> str:
    """A server's group: its GPU type and host model ("rtx3090/C")."""
    return f"{gpu_key(server.gpu_type)}/{server.host_model}"


def splits(n: int, most: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every multiset of at most `parts` positive counts of at most `most` each that add up to `n`."""
    if n == 0:
        yield ()
        return
    if parts == 0:
        return
    for first in range(min(n, most), 0, -1):
        for rest in splits(n - first, first, parts - 1):
            yield (first, *rest)


class BestRates:
    """Best-case samples/s per (model, group, GPU count) on a cluster's servers."""

    def __init__(self, world: PaperWorld, servers: Sequence[Server]) -> None:
        self.world = world
        self.groups: dict[str, list[Server]] = {}
        for server in servers:
            self.groups.setdefault(group_of(server), []).append(server)

    def capacity(self) -> dict[str, int]:
        """GPUs per group."""
        return {name: sum(s.gpus for s in servers) for name, servers in self.groups.items()}

    @functools.cache  # noqa: B019 - one table per analysis, kept for its length
    def rate(self, model: str, group: str, count: int) -> float:
        """The model's best-case rate on `count` GPUs of `group` (job factor left out; 0 if none fit)."""
        servers = self.groups[group]
        per = min(s.gpus for s in servers)
        return max(
            self.world.best_case_rates(model, servers, list(splits(count, per, len(servers)))), default=0.0
        )

    def job_rates(self, job: WorkloadJob) -> dict[str, list[tuple[int, float]]]:
        """Per group, (GPU count, samples/s) for each of the job's counts, its hidden factor applied."""
        factor = job_factor(self.world.seed, self.world.model(job.model).name, job_key(job.job_id))
        out: dict[str, list[tuple[int, float]]] = {}
        for group in self.groups:
            points = [(n, self.rate(job.model, group, n) * factor) for n in job.requirements.counts]
            points = [(n, rate) for n, rate in points if rate > 0]
            if points:
                out[group] = points
        return out

    def best_run_s(self, job: WorkloadJob) -> float:
        """The job's run time at its fastest configuration anywhere on the cluster: no placement beats it."""
        rates = [rate for points in self.job_rates(job).values() for _, rate in points]
        if not rates:
            raise ValueError(f"job {job.job_id}: none of its GPU counts fits the cluster")
        return job.total_samples / max(rates)
