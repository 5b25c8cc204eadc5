"""A test driver of the scheduler state machine: a manual clock, a recording executor, inline plans.

`Harness.feed(event)` hands an event to the machine at the harness's `now`, answers PlanRequests at
once with the policy (as the simulator does) and ContinuePlans with PlanContinue (as the master does,
where the machine applies plans in slices), records every command, and checks the machine's
invariants after each event: no GPU claimed twice, no device index given twice, every live job in
exactly one state with at most one current attempt, attempt ids unique. `close()` checks them again
and is called by the `harness` fixture at teardown.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from hopsmgr.control.commands import Command, ContinuePlan, Persist, PlanRequest, PlanSoon
from hopsmgr.control.diagram import EMITS
from hopsmgr.control.events import Event, NodeBeat, PlanContinue, PlanReady
from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.control.planning import compute_plan
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.lifecycle import TERMINAL
from hopsmgr.core.model import JobSpec, RequirementSet, Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.base import HopsPolicy, Policy

PROFILE = TimeProfile(tf_s=0.02, tb_s=0.04, tu_s=0.005, td_hit_s=0.001, td_miss_s=0.001)

SERVERS = (
    Server("v100-1", "v100", 4, order=1),
    Server("v100-2", "v100", 4, order=2),
    Server("p100-1", "p100", 2, order=3),
)


def spec(
    job_id: str, gpus: Sequence[int] = (1,), samples: float = 1e5, tenant: str = "default", at: float = 0.0
) -> JobSpec:
    return JobSpec(
        id=job_id,
        requirements=RequirementSet.of(gpus),
        total_samples=samples,
        batch_size=32,
        tenant=tenant,
        submit_time=at,
        restart_s=20.0,
    )


@dataclass
class Harness:
    servers: tuple[Server, ...] = SERVERS
    tenants: tuple[TenantQuota, ...] = ()
    settings: ControlSettings = field(default_factory=ControlSettings)
    policy: Policy | None = None
    now: float = 0.0
    commands: list[Command] = field(default_factory=list)
    plan_soon: int = 0
    auto_plan: bool = True
    auto_continue: bool = True  # answer ContinuePlan (a plan applied in slices) at once, as the master

    def __post_init__(self) -> None:
        self.machine = SchedulerMachine(self.servers, self.tenants, self.settings, started=self.now)
        self.policy = self.policy or HopsPolicy(self.settings.scheduler)
        self.seen_attempts: set[str] = set()
        self.stim = itertools.count(1)
        for s in self.servers:
            self.feed(NodeBeat(self.stimulus(), s.id, True, s, s.gpus))

    def stimulus(self) -> str:
        return f"test-{next(self.stim)}"

    def feed(self, event: Event) -> list[Command]:
        """Handle `event` (and the PlanReady of any plan it requests); the commands, in order."""
        out = self.machine.handle(event, self.now)
        allowed = EMITS[type(event)]
        assert all(isinstance(c, allowed) for c in out), (
            type(event).__name__,
            [type(c).__name__ for c in out],
        )
        self.check()
        done: list[Command] = []
        for command in out:
            done.append(command)
            if isinstance(command, PlanSoon):
                self.plan_soon += 1
            if isinstance(command, PlanRequest) and self.auto_plan:
                assert self.policy is not None
                ready = compute_plan(command, self.policy, self.machine.estimator, time.perf_counter)
                done += self.feed(ready)
            if isinstance(command, ContinuePlan) and self.auto_continue:
                done += self.feed(PlanContinue(self.stimulus()))
        self.commands += [c for c in done if c not in self.commands]
        return done

    def of(self, kind: type, commands: Sequence[Command] | None = None) -> list:  # type: ignore[type-arg]
        return [c for c in (self.commands if commands is None else commands) if isinstance(c, kind)]

    def records(self, commands: Sequence[Command]) -> list[object]:
        return [r for c in commands if isinstance(c, Persist) for r in c.records]

    def check(self) -> None:
        state = self.machine.state
        assert state.held() == state.held_recount(), (state.held(), state.held_recount())
        assert state.profiling_gpus == state.profiling_gpus_recount()
        for sid, n in state.held().items():
            assert n <= state.nodes[sid].server.gpus, f"{sid} claimed {n} GPUs"
        devices = Counter(
            (sid, d) for a in state.attempts.values() for sid, ds in a.devices.items() for d in ds
        )
        assert all(n == 1 for n in devices.values()), devices
        for job in state.jobs.values():
            assert job.state not in TERMINAL
            runs = [
                a
                for a in state.attempts.values()
                if a.job_id == job.id and not a.profiling and not a.stopping
            ]
            assert len([a for a in runs if a.id == job.attempt]) <= 1
        for attempt_id in state.attempts:
            self.seen_attempts.add(attempt_id)
        live = Counter(j.state for j in state.jobs.values())
        assert live == Counter({k: n for k, n in state.counts.items() if n}), (live, state.counts)

    def close(self) -> None:
        self.check()
        ids = [
            c.attempt_id
            for c in self.commands
            if hasattr(c, "attempt_id") and type(c).__name__ in ("LaunchAttempt", "StartProfiling")
        ]
        assert len(ids) == len(set(ids)), "an attempt was launched twice"


__all__ = ["PROFILE", "SERVERS", "Harness", "PlanReady", "SchedulerSettings", "spec"]
