"""Shared by the forecast tests (tests/forecast/, and tests/master/test_forecast_worker.py): a one-server
cluster, greedy and exact forecast settings, and a simulation of three jobs run for a while, the state that
forecasts start from.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hopsmgr.config import parse_cluster_config
from hopsmgr.core.model import RequirementSet
from hopsmgr.forecast.future import FutureOptions
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.run import ForecastSettings
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob

CLUSTER = parse_cluster_config(
    {
        "cluster": {"name": "one"},
        "servers": [{"id": "s1", "gpu_type": "rtx3090", "gpus": 4, "host_model": "a"}],
        "tenants": [{"name": "t"}],
        "scheduler": {"round_seconds": 300},
    }
)
# greedy plans only (exact_s=0): most forecast tests check the greedy policy's futures
GREEDY = FutureOptions(sigma=0.0, arrivals=False, exact_s=0.0)
EXACT = ForecastSettings(min_futures=1, max_futures=1, future=GREEDY)
NO_PREEMPTION = replace(EXACT, future=replace(EXACT.future, keep_bonus=float("inf")))


def workload() -> list[WorkloadJob]:
    world = paper_world(seed=1)
    model = world.models()[0].name
    return [
        WorkloadJob(f"j{i}", float(i), model, RequirementSet.of([4]), 4 * 64 * (40_000 + 20_000 * i), 64, "t")
        for i in range(3)
    ]


def started(until_s: float, keep_bonus: float = 0.0) -> Simulation:
    """The simulation with every job arrived, run to `until_s` (the first job runs, two wait)."""
    world = paper_world(seed=1)
    sim = Simulation(
        world,
        CLUSTER.servers,
        workload(),
        ForecastPolicy(CLUSTER.scheduler, keep_bonus=keep_bonus),
        SimOptions(profiling=False, seed=1),
        time.perf_counter,
        tenants=CLUSTER.tenant_map(),
    )
    sim.advance(until=lambda: sim.now >= until_s)
    return sim
