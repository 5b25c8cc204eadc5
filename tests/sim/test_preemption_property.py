"""Preemption properties of the Hops planner, driven through the simulator over many random scenarios.

Every scenario is a small random cluster (GPU types, servers, GPU counts) and a random Poisson workload
with random round and minimum-attempt settings. A recording `Simulation` notes every launch and every
checkpoint-and-stop the state machine commands; afterwards, for each scenario:
- no job is preempted or moved inside its minimum attempt length (min_attempt_s + 2 x restart_s after
  its attempt started; the scenarios have no guarantees, caps or node losses, the only exceptions);
- no preemption cycle: a job stopped out of a configuration does not retake that same configuration
  within `CYCLE_ROUNDS` rounds, unless a job or a profiling run that held GPUs on those servers has
  ended meanwhile (the GPUs came back because it finished: no decision was reversed).

HOPS_PROPERTY_SCENARIOS sets the number of scenarios (default 1000); each is a fraction of a second, as
small programs are solved by the planner's in-process branch and bound.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from typing import Any

import pytest

from hopsmgr.control.commands import CheckpointAndStop, Command, JobChange, LaunchAttempt, StartProfiling
from hopsmgr.core.lifecycle import TERMINAL
from hopsmgr.core.model import Config, Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob, poisson_workload

WORLD = paper_world(seed=3)
TYPES = (("rtx3090", "A"), ("titanxp", ""), ("gtx1080ti", ""))
SCENARIOS = int(os.environ.get("HOPS_PROPERTY_SCENARIOS", "1000"))
CYCLE_ROUNDS = 2


class RecordingSimulation(Simulation):
    """Keeps every launch (time, job, placement) and every checkpoint-and-stop with its attempt's age."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launches: list[tuple[float, str, Config]] = []
        self.stops: list[tuple[float, str, Config, float, str]] = []  # time, job, config, age, reason
        self.ends: dict[str, float] = {}
        self.profiled: dict[str, tuple[str, float]] = {}  # profiling attempt -> (server, started)
        self.profiles_ended: list[tuple[str, float, float]] = []  # server, started, ended

    def _do(self, command: Command) -> None:
        if isinstance(command, StartProfiling):
            self.profiled[command.attempt_id] = (command.server_id, self.now)
        if isinstance(command, LaunchAttempt):
            self.launches.append((self.now, command.job_id, command.placement))
        elif isinstance(command, CheckpointAndStop):
            attempt = self.machine.state.attempts[command.attempt_id]
            started = attempt.started if attempt.started is not None else self.now
            self.stops.append(
                (self.now, attempt.job_id, attempt.placement, self.now - started, command.reason)
            )
        super()._do(command)

    def _end_profile(self, end: Any) -> None:
        if end.attempt_id in self.profiles and end.attempt_id in self.profiled:
            server, started = self.profiled.pop(end.attempt_id)
            self.profiles_ended.append((server, started, self.now))
        super()._end_profile(end)

    def _changed(self, change: JobChange) -> None:
        if change.new in TERMINAL:
            self.ends[change.job_id] = change.at
        super()._changed(change)


def scenario(seed: int) -> tuple[list[Server], list[WorkloadJob], SchedulerSettings]:
    rng = random.Random(seed)
    servers: list[Server] = []
    for k in range(rng.randint(2, 4)):
        gpu_type, host = rng.choice(TYPES)
        servers.append(Server(f"s{k}", gpu_type, rng.choice((1, 2, 4)), host_model=host, order=k))
    per_type: dict[str, int] = {}
    for s in servers:
        per_type[s.gpu_type] = per_type.get(s.gpu_type, 0) + s.gpus
    total = max(per_type.values())  # a placement uses one GPU type
    scale = rng.uniform(0.01, 0.08)
    jobs = [
        dataclasses.replace(j, total_samples=j.total_samples * scale)
        for j in poisson_workload(WORLD, rng.randint(3, 9), rng.uniform(30.0, 300.0), seed=seed)
        if j.requirements.minimum <= total
    ]
    settings = SchedulerSettings(
        round_seconds=rng.choice((60.0, 120.0, 300.0)), min_attempt_s=rng.choice((0.0, 120.0, 300.0, 600.0))
    )
    return servers, jobs, settings


def run_scenario(seed: int) -> list[str]:
    servers, jobs, settings = scenario(seed)
    if not jobs:
        return []
    sim = RecordingSimulation(
        WORLD, servers, jobs, make_policy("hops", settings), SimOptions(seed=seed), time.perf_counter
    )
    sim.run()
    restart = {j.spec.id: j.spec.restart_s for j in sim.jobs.values()}
    problems: list[str] = []
    for at, job_id, config, age, reason in sim.stops:
        if reason not in ("preempted", "migrated"):
            continue
        protected = settings.min_attempt_s + 2 * restart[job_id]
        if age < protected - 1e-6:
            problems.append(
                f"seed {seed}: {job_id} {reason} at t={at:.0f} after {age:.0f} s (< {protected:.0f})"
            )
        window = CYCLE_ROUNDS * settings.round_seconds
        for t, other, placement in sim.launches:
            if other == job_id and placement == config and at < t < at + window:
                freed = any(
                    t_taker < t
                    and set(taken.servers) & set(config.servers)
                    and at < sim.ends.get(taker, t + 1) <= t
                    for t_taker, taker, taken in sim.launches
                    if taker != job_id
                )
                freed = freed or any(
                    server in config.servers and started < t and at < ended <= t
                    for server, started, ended in sim.profiles_ended
                )
                if freed:
                    continue
                problems.append(
                    f"seed {seed}: {job_id} left {config} at t={at:.0f} ({reason}) and retook it at t={t:.0f}"
                )
    return problems


def test_no_preemption_inside_the_minimum_attempt_and_no_cycles() -> None:
    problems: list[str] = []
    for seed in range(SCENARIOS):
        problems += run_scenario(seed)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("seed", [7])
def test_the_scenarios_do_preempt(seed: int) -> None:
    # The property is not vacuous: across the first scenarios some jobs are checkpointed and stopped.
    stops = 0
    for s in range(seed, seed + 40):
        servers, jobs, settings = scenario(s)
        if not jobs:
            continue
        sim = RecordingSimulation(
            WORLD, servers, jobs, make_policy("hops", settings), SimOptions(seed=s), time.perf_counter
        )
        sim.run()
        stops += sum(1 for stop in sim.stops if stop[4] in ("preempted", "migrated"))
    assert stops > 0
