"""The round loop: RoundTicks for the state machine, and its plan requests answered off the event loop.

Every `round_seconds` the machine gets a first-plan tick; between rounds, when it asked for one
(PlanSoon: GPUs freed, jobs arrived), a fragment-plan tick after the burst settles. A PlanRequest is
answered by `hopsmgr.control.planning.compute_plan` in a worker thread, on the request's immutable
snapshot and a copy of the estimator (the machine keeps learning meanwhile); the PlanReady goes back
to the machine, whose Persist is committed before any command goes to a node (the test-only crash
points of hopsmgr.master.faults sit on either side of that commit).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import structlog

from hopsmgr.control.commands import (
    AttemptRow,
    CheckpointAndStop,
    Command,
    ContinuePlan,
    Persist,
    PlanRequest,
)
from hopsmgr.control.events import PlanContinue, PlanReady, RoundTick
from hopsmgr.control.planning import compute_plan, fallback_plan
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.planner import PlanKind
from hopsmgr.master import faults
from hopsmgr.master.commands import rendezvous_port, torchrun_argv
from hopsmgr.master.controller import Controller
from hopsmgr.master.heartbeats import check_health
from hopsmgr.master.planner_process import PlannerProcess
from hopsmgr.master.store import Store
from hopsmgr.master.writer import Op
from hopsmgr.policies.base import HopsPolicy, Policy

log = structlog.get_logger("hopsmgr.master")

__all__ = ["RoundLoop", "rendezvous_port", "torchrun_argv"]
ESTIMATOR_SAVE_S = 300.0


class RoundLoop:
    def __init__(self, ctl: Controller, policy: Policy | None = None) -> None:
        self.ctl = ctl
        self.policy: Policy = policy or HopsPolicy(ctl.config.scheduler)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="planner")
        m, sched = ctl.config.master, ctl.config.scheduler
        self.deadline_s = m.plan_deadline_s or sched.time_limit_s + 5.0
        self.process: PlannerProcess | None = None
        if m.planner == "process" and policy is None:
            self.process = PlannerProcess(sched)
            self.process.start()
        self.lock = asyncio.Lock()
        self.round_s: list[float] = []
        self.solve_s: list[float] = []
        self.rounds = 0
        self.last: dict[str, Any] = {}
        self.estimator_saved = -ESTIMATOR_SAVE_S
        # a new leader (PostgreSQL) plans only after (min_s, max_s): at least min_s, then as soon as every
        # node beat since the takeover, at the latest max_s
        self.settle_s: tuple[float, float] = (0.0, 0.0)
        self.first_plan_at: float | None = None  # wall-clock time of this master's first plan

    async def settle(self) -> None:
        low, high = self.settle_s
        start = time.monotonic()
        while True:
            waited = time.monotonic() - start
            if waited >= high or (waited >= low and all(n.seen for n in self.ctl.nodes.values())):
                break
            await asyncio.sleep(0.05)
        if high:
            seen = sum(1 for n in self.ctl.nodes.values() if n.seen)
            log.info("leader_settled", waited_s=round(time.monotonic() - start, 2), nodes_seen=seen)

    async def run(self) -> None:
        """First plans every round_seconds; fragment plans when the machine asks for one in between."""
        interval = self.ctl.config.scheduler.round_seconds
        await self.settle()
        next_first = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_first:
                next_first = now + interval
                self.ctl.next_round_at = self.ctl.clock() + interval  # what the forecasts plan from
                await self._safe_round("first")
                continue
            try:
                await asyncio.wait_for(self.ctl.wake.wait(), timeout=next_first - now)
            except asyncio.TimeoutError:
                continue
            # Let a burst of events settle into one fragment plan, and keep plans apart by at least
            # their own cost (a plan over 10,000 queued jobs is CPU work the API and heartbeats share).
            gap = max(0.2, min(5.0, 2 * (self.round_s[-1] if self.round_s else 0.0)))
            await asyncio.sleep(gap)
            await self._safe_round("fragment")

    async def _safe_round(self, kind: PlanKind) -> None:
        """A round that fails (a bug) is logged and skipped; the next one starts from fresh state."""
        try:
            await self.round(kind)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("round_failed", kind=kind, error=repr(exc))
            self.ctl.machine.drop_plan_cycle()  # a request or plan left half-way would block all others
            await asyncio.sleep(1.0)

    async def health(self) -> None:
        while True:
            check_health(self.ctl)
            self.ctl.flush()
            await asyncio.sleep(min(1.0, self.ctl.settings.heartbeat_interval_s / 2))

    async def round(self, kind: PlanKind) -> None:
        async with self.lock:
            await self._round(kind)

    async def _round(self, kind: PlanKind) -> None:
        ctl = self.ctl
        t0 = time.perf_counter()
        ctl.wake.clear()  # requests from here on wake the next plan (none is lost while this one runs)
        now = ctl.clock()
        tick = RoundTick(f"round-{kind}-{now:.3f}", kind)
        commands = ctl.feed(tick)
        while any(isinstance(c, ContinuePlan) for c in commands):  # the request prepared in steps
            await asyncio.sleep(0)  # heartbeats and API calls between two steps
            commands = ctl.feed(PlanContinue(tick.stimulus_id))
        request = next((c for c in commands if isinstance(c, PlanRequest)), None)
        while request is not None:
            ready = await self._answer(request, time.monotonic() + self.deadline_s)
            plan = ready.plan
            ctl.plans[plan.kind] = plan
            if plan.kind == "first":
                ctl.plans["fragment"] = plan
            commands = ctl.handle(ready)
            launches, stops = self._act(commands)
            while any(isinstance(c, ContinuePlan) for c in commands):  # applied (then prepared) in slices
                await asyncio.sleep(0)  # heartbeats and API calls between two slices
                commands = ctl.handle(PlanContinue(ready.stimulus_id))
                more_launches, more_stops = self._act(commands)
                launches, stops = launches + more_launches, stops + more_stops
            if self.first_plan_at is None:
                self.first_plan_at = ctl.clock()
            queued = [
                j for j in plan.order if j in ctl.state.jobs and ctl.state.jobs[j].state == JobState.QUEUED
            ]
            ctl.positions = {j: i + 1 for i, j in enumerate(queued)}
            self._record(request, ready, launches, stops, time.perf_counter() - t0)
            t0 = time.perf_counter()
            request = next((c for c in commands if isinstance(c, PlanRequest)), None)
            await asyncio.sleep(0)

    async def _answer(self, request: PlanRequest, deadline: float) -> PlanReady:
        """The plan for `request`, from the planner process (or thread) by `deadline`, else the fallback."""
        if self.process is not None:
            return await self.process.plan(request, self.ctl.estimator, deadline)
        estimator = Estimator.from_state(self.ctl.estimator.export_state())  # the planner's own copy
        work = asyncio.get_running_loop().run_in_executor(
            self.pool, compute_plan, request, self.policy, estimator, time.perf_counter
        )
        try:
            return await asyncio.wait_for(asyncio.shield(work), timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:  # a thread cannot be killed: abandon its answer, plan without it
            log.warning("planner_missed_deadline", request=request.request_id, kind=request.kind)
            return fallback_plan(request, estimator, "the planner thread missed the round's deadline")

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _act(self, commands: list[Command]) -> tuple[int, int]:
        """Hand the plan's records to the writer; its node commands go out once they are committed."""
        ctl = self.ctl
        records = [r for c in commands if isinstance(c, Persist) for r in c.records]
        created = [r for r in records if isinstance(r, AttemptRow) and r.id not in ctl.stored_attempts]
        stops = sum(1 for c in commands if isinstance(c, CheckpointAndStop))
        faults.point("launch.before_store" if created or stops else "")  # test-only crash hooks
        written = ctl.persist(commands)

        def stored() -> None:
            faults.point("launch.after_store" if created else "")
            faults.point("stop.after_store" if stops else "")

        ctl.then(written, stored)
        ctl.dispatch(commands, after=written)
        return len(created), stops

    def _record(
        self, request: PlanRequest, ready: PlanReady, launches: int, stops: int, elapsed: float
    ) -> None:
        ctl = self.ctl
        plan = ready.plan
        self.round_s.append(elapsed)
        self.solve_s.append(plan.stats.total_s)
        del self.round_s[:-1000], self.solve_s[:-1000]
        self.rounds += 1
        counts = ctl.machine.state.counts
        record = {
            "time": request.snapshot.now,
            "kind": plan.kind,
            "duration_s": elapsed,
            "solve_s": plan.stats.total_s,
            "method": plan.stats.method,
            "proven": int(plan.stats.proven),
            "launches": launches,
            "stops": stops,
            "queued": counts.get(JobState.QUEUED, 0),
            "running": counts.get(JobState.RUNNING, 0),
            "idle_gpus": plan.idle_gpus,
        }
        self.last = record
        if plan.kind == "first" or launches or stops:
            # The estimator's state (all it learnt) is saved every ESTIMATOR_SAVE_S; profiles are stored
            # as they arrive, so a crash loses at most that long of running observations.
            save = plan.kind == "first" and time.monotonic() - self.estimator_saved >= ESTIMATOR_SAVE_S
            ops: list[Op] = [partial(Store.add_round, row=dict(record))]
            if save:
                state = ctl.estimator.export_state()
                ops.append(partial(Store.save_estimator, state=state, now=request.snapshot.now))
            ctl.store_ops(ops)
            if save:
                self.estimator_saved = time.monotonic()
