"""The fastest a job can run on a cluster of the paper world: best-case rates per server group.

A group is the servers of one GPU type and host model ("rtx3090/C"). A job's best-case rate on `n` GPUs
of a group is the paper world's `best_case_rates` (every part with the best hidden factors found in the
group) over every way of splitting `n` GPUs across as many servers as the cluster has, times the job's
own hidden factor. No real placement in the group runs faster (monotonicity: PaperWorld.best_case_rates).
A placement spanning groups ran at most 2.1% faster than its GPUs' shares of each group's rate at its
count, in every case we tried (tests/sim/test_jct_bound.py repeats a sweep), so job rates carry a 5%
margin (`ACROSS_GROUPS_MARGIN`). With it these rates bound what a scheduler can do, as far as that
measurement goes: bench/jct_parts.py (a job's best run time) and bench/jct_bound.py (a lower bound on
the average JCT) read them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

from hopsmgr.core.model import Server
from hopsmgr.sim.paperworld import PaperWorld
from hopsmgr.sim.simstate import job_key
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


# A placement across groups can run up to 2.1% faster than its GPUs' shares of each group's rate (the
# split of the batch by speed is not linear): the worst of 30,000 random placements and a sweep of
# one-, two- and four-GPU parts over one to three groups (paper-16, -64 and -512, per-server variation 0
# and 0.08, seeds 1-5). Every rate a job is given carries this margin; it is measured, not proven.
ACROSS_GROUPS_MARGIN = 1.05


class BestRates:
    """Best-case samples/s per (model, group, GPU count) on a cluster's servers."""

    def __init__(
        self, world: PaperWorld, servers: Sequence[Server], margin: float = ACROSS_GROUPS_MARGIN
    ) -> None:
        self.world = world
        self.margin = margin
        self.groups: dict[str, list[Server]] = {}
        for server in servers:
            self.groups.setdefault(group_of(server), []).append(server)
        self.servers = len(servers)
        self.total_gpus = sum(s.gpus for s in servers)

    def capacity(self) -> dict[str, int]:
        """GPUs per group."""
        return {name: sum(s.gpus for s in servers) for name, servers in self.groups.items()}

    @functools.cache  # noqa: B019 - one table per analysis, kept for its length
    def rate(self, model: str, group: str, count: int) -> float:
        """The model's best-case rate on `count` GPUs of `group` (job factor left out).

        Every split of `count` over as many servers as the whole cluster has, each part up to the
        group's largest server, counts: a placement across groups may spread its GPUs wider than the
        group alone could, and its share of this group is bounded at this rate."""
        servers = self.groups[group]
        most = max(s.gpus for s in servers)
        return max(self.world.best_case_rates(model, servers, list(splits(count, most, self.servers))))

    def job_rates(self, job: WorkloadJob) -> dict[str, list[tuple[int, float]]]:
        """Per group, (GPU count, samples/s) for each of the job's counts, its hidden factor and the
        margin for placements across groups applied."""
        factor = self.margin * job_factor(
            self.world.seed, self.world.model(job.model).name, job_key(job.job_id)
        )
        out: dict[str, list[tuple[int, float]]] = {}
        for group in self.groups:
            points = [
                (n, self.rate(job.model, group, n) * factor)
                for n in job.requirements.counts
                if n <= self.total_gpus
            ]
            if points:
                out[group] = points
        return out

    def best_run_s(self, job: WorkloadJob) -> float:
        """The job's run time at its fastest configuration anywhere on the cluster: no placement beats it."""
        rates = [rate for points in self.job_rates(job).values() for _, rate in points]
        if not rates:
            raise ValueError(f"job {job.job_id}: none of its GPU counts fits the cluster")
        return job.total_samples / max(rates)
