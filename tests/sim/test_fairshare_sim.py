"""Fair share in the simulator: a tenant that inflates its jobs' GPU counts gains nothing by it.

Two tenants of equal weight submit the same stream of jobs to a small, contended cluster; in the
second run tenant b asks for twice the GPUs for each of its jobs (the same work). With fair share,
b's jobs finish no sooner on average than when it asked honestly: the extra GPUs are charged to it,
so its later jobs rank lower.
"""

from __future__ import annotations

import time

import pytest

from hopsmgr.control.usage import current_usage
from hopsmgr.core.model import RequirementSet, Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.outcome import SimResult
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob

WORLD = paper_world(seed=1)
SERVERS = (
    Server("r1", "rtx3090", 4, host_model="A", order=1),
    Server("r2", "rtx3090", 4, host_model="A", order=2),
)
TENANTS = {"a": TenantQuota("a"), "b": TenantQuota("b")}
MODEL = "ResNet18"


def stream(inflate_b: bool) -> list[WorkloadJob]:
    jobs = []
    spec = WORLD.model(MODEL)
    for k in range(24):
        tenant = "a" if k % 2 == 0 else "b"
        gpus = 2 if tenant == "b" and inflate_b else 1
        jobs.append(
            WorkloadJob(
                job_id=f"{tenant}{k:02d}",
                arrival_s=60.0 * k,
                model=spec.name,
                requirements=RequirementSet.rigid(gpus),
                total_samples=1800.0 * WORLD.reference_rate(spec.name, 1),
                batch_size=spec.batch_size,
                tenant=tenant,
            )
        )
    return jobs


class UsageSimulation(Simulation):
    """Samples each tenant's charged use (reference-GPU-seconds) at every round."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.usage_samples: list[tuple[float, dict[str, float]]] = []

    def _round(self) -> None:
        super()._round()
        self.usage_samples.append((self.now, current_usage(self.machine.state, self.now, 1e9)))


def run(inflate_b: bool, fairshare: bool) -> tuple[UsageSimulation, SimResult]:
    settings = SchedulerSettings(fairshare=fairshare)
    sim = UsageSimulation(
        WORLD,
        SERVERS,
        stream(inflate_b),
        make_policy("hops", settings),
        SimOptions(seed=1),
        time.perf_counter,
        tenants=TENANTS,
    )
    return sim, sim.run()


def share_of_b(sim: UsageSimulation, result: SimResult) -> float:
    """b's share of the GPU time charged by the time half of all jobs had ended (both tenants still
    have work waiting then)."""
    ends = sorted(j.end_time for j in result.jobs if j.end_time is not None)
    half = ends[len(ends) // 2]
    _, used = max((s for s in sim.usage_samples if s[0] <= half), key=lambda s: s[0])
    return used.get("b", 0.0) / sum(used.values())


def test_inflating_gpu_counts_gains_no_share() -> None:
    honest = share_of_b(*run(False, True))
    inflated = share_of_b(*run(True, True))
    off = share_of_b(*run(True, False))
    print("b share honest", honest, "inflated", inflated, "inflated without fair share", off)
    assert honest == pytest.approx(0.5, abs=0.08)
    assert inflated <= 0.5 + 0.05, (honest, inflated)
    assert off > 0.55  # the control: without fair share the inflating tenant does take more
