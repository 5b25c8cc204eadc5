"""One scheduler, two drivers: a simulated run replayed through the master's driver makes the same
decisions and leaves the same end states in the master's store.

The simulator runs a small workload (its machine's every event and every command recorded). The same
events, at the same instants, then go through `hopsmgr.master.controller.Controller.feed` (a real
SQLite store in a temporary directory; node commands recorded instead of sent to nodes). The commands
must be the same, in the same order, and the store's job rows must end as the simulator's jobs did.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.config import ClusterConfig
from hopsmgr.control.commands import Command, LaunchAttempt, PlanRequest, StartProfiling
from hopsmgr.control.events import Event, JobSubmitted
from hopsmgr.core.model import Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.controller import Controller
from hopsmgr.master.state import JobPayload
from hopsmgr.master.store import Store
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import poisson_workload

WORLD = paper_world(seed=1)
SERVERS = (
    Server("rtx-a1", "rtx3090", 4, host_model="A", order=1),
    Server("txp-1", "titanxp", 4, order=2),
    Server("gtx-1", "gtx1080ti", 2, order=3),
)


class NoExecutor:
    name = "none"

    async def close(self) -> None:
        return None


def simulated(policy: str) -> tuple[Simulation, list[tuple[Event, float, list[Command]]]]:
    workload = [
        dataclasses.replace(j, total_samples=j.total_samples * 0.05)
        for j in poisson_workload(WORLD, 10, 60.0, seed=3)
        if j.requirements.maximum <= 4
    ]
    sim = Simulation(
        WORLD,
        SERVERS,
        workload,
        make_policy(policy, SchedulerSettings()),
        SimOptions(seed=2),
        time.perf_counter,
    )
    log: list[tuple[Event, float, list[Command]]] = []
    handle = sim.machine.handle

    def recorded(event: Event, now: float) -> list[Command]:
        out = handle(event, now)
        log.append((event, now, out))
        return out

    sim.machine.handle = recorded  # type: ignore[method-assign]
    result = sim.run()
    assert all(r.completed for r in result.jobs)
    return sim, log


def master_for(sim: Simulation, tmp_path: Path) -> tuple[Controller, list[float]]:
    config = ClusterConfig("drivers", tuple(sim.servers), sim.machine.settings.scheduler, ())
    clock = [0.0]
    ctl = Controller(config, Store(tmp_path / "state.db"), NoExecutor(), clock=lambda: clock[0])  # type: ignore[arg-type]
    ctl.machine.settings = (
        sim.machine.settings
    )  # the simulator's policy: its fragment plans, no profiling gap
    ctl.open(str(tmp_path / "checkpoints"))
    sent: list[Command] = []
    ctl.on_command = sent.append
    return ctl, clock


def comparable(commands: list[Command]) -> list[Any]:
    """Commands as plain values (a PlanRequest's snapshot compared by its parts)."""
    out = []
    for c in commands:
        if isinstance(c, PlanRequest):
            out.append(("plan", c.request_id, c.kind, c.snapshot.capacity, c.snapshot.jobs, c.to_profile))
        else:
            out.append(c)
    return out


@pytest.mark.parametrize("policy", ["hops", "gavel"])
def test_a_simulated_run_replayed_through_the_master_makes_the_same_decisions(
    tmp_path: Path, policy: str
) -> None:
    sim, log = simulated(policy)
    ctl, clock = master_for(sim, tmp_path)
    ctl.machine.started = sim.machine.started
    started = 0
    for event, now, expected in log:
        clock[0] = now
        if isinstance(event, JobSubmitted):
            ctl.job_seq += 1
            ctl.payloads[event.spec.id] = JobPayload(ctl.job_seq, event.spec.id, ("train",), {}, "", "plain")
        got = ctl.feed(event)
        assert comparable(got) == comparable(expected), type(event).__name__
        started += sum(isinstance(c, LaunchAttempt | StartProfiling) for c in got)
    assert started > 10
    rows = {r["id"]: r for r in ctl.store.jobs()}
    assert set(rows) == set(sim.jobs)
    for job_id, truth in sim.jobs.items():
        assert truth.final is not None
        assert rows[job_id]["state"] == truth.final.value
        assert rows[job_id]["ended"] == truth.end
        assert rows[job_id]["running_s"] == truth.running_s
        states = [e["state"] for e in ctl.store.events(job_id)]
        assert states[-1] == truth.final.value
    attempts = [a for j in sim.jobs for a in ctl.store.attempts(j)]
    assert len(attempts) == started and all(a["ended"] is not None for a in attempts)
    assert sum(r["preemptions"] for r in rows.values()) == sim.preemptions
    ctl.store.close()
