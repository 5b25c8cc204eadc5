"""A master that takes over (a restart, or a standby taking the lease) gives the nodes their whole grace
period from when it serves heartbeats, not from when it opened the store: the loads and set-up in
between may take seconds on a loaded machine, and counted against the nodes they had a job running at
the takeover declared lost and restarted (seen once in CI, tests/faults/test_failover.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiohttp import web

from hopsmgr.config import ClusterConfig, parse_cluster_config
from hopsmgr.control.commands import LaunchAttempt, PlanRequest, StartProfiling
from hopsmgr.control.events import RoundTick
from hopsmgr.control.planning import compute_plan
from hopsmgr.control.records import NodeHealth
from hopsmgr.core.model import Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master import heartbeats
from hopsmgr.master.access import Principal
from hopsmgr.master.controller import Controller
from hopsmgr.master.executor import LocalExecutor
from hopsmgr.master.server import MasterProcess
from hopsmgr.master.store import Store
from hopsmgr.master_settings import MasterSettings
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.protocol import FinishedAttempt, Heartbeat, RunningAttempt, parse_submission
from tests.control.test_drivers import NoExecutor

PROFILE = {"tf_s": 0.01, "tb_s": 0.02, "tu_s": 0.005, "td_s": 0.004, "samples_per_s": 100.0, "iterations": 20}
CONFIG = ClusterConfig(
    "grace",
    (Server("n1", "v100", 2),),
    SchedulerSettings(),
    (),
    master=MasterSettings(heartbeat_interval_s=0.3, suspect_after_s=1.5, lost_after_s=6.0),
)


def beat(running: tuple[RunningAttempt, ...] = (), finished: tuple[FinishedAttempt, ...] = ()) -> Heartbeat:
    return Heartbeat("n1", "v100", 2, "emulated", "/tmp/hopsmgr-test", running=running, finished=finished)


def plan(ctl: Controller) -> list[object]:
    requests = [c for c in ctl.feed(RoundTick(f"tick-{ctl.clock()}", "first")) if isinstance(c, PlanRequest)]
    ready = compute_plan(requests[0], HopsPolicy(CONFIG.scheduler), ctl.estimator, lambda: 0.0)
    return list(ctl.feed(ready))


def running_job(path: Path, clock: list[float]) -> tuple[str, str]:
    """A first master that profiles a job and starts its run; the (job, run attempt) left running."""
    store = Store(path)
    ctl = Controller(CONFIG, store, NoExecutor(), clock=lambda: clock[0])  # type: ignore[arg-type]
    ctl.open(str(path.parent / "checkpoints"))
    sub = parse_submission(
        {"command": ["python", "train.py"], "gpus": [1], "batch_size": 8, "iterations": 10**6}
    )

    async def scenario() -> tuple[str, str]:
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, beat())
        job = (await ctl.submit(Principal("admin", "default", admin=True), sub))["id"]
        profiling = [c for c in plan(ctl) if isinstance(c, StartProfiling)]
        clock[0] += 1
        ended = FinishedAttempt(profiling[0].attempt_id, job, 0, profile=dict(PROFILE))
        heartbeats.answer(ctl, beat(finished=(ended,)))
        clock[0] += 1
        runs = [c for c in plan(ctl) if isinstance(c, LaunchAttempt)]
        assert len(runs) == 1, runs
        heartbeats.answer(ctl, beat(running=(RunningAttempt(runs[0].attempt_id, job),)))
        return job, runs[0].attempt_id

    job, attempt = asyncio.run(scenario())
    assert ctl.state.jobs[job].state == "RUNNING"
    store.close()
    return job, attempt


def test_a_slow_takeover_leaves_the_nodes_their_whole_grace_period(tmp_path: Path) -> None:
    clock = [1000.0]
    job, attempt = running_job(tmp_path / "state.db", clock)

    clock[0] += 5
    store = Store(tmp_path / "state.db")
    ctl = Controller(CONFIG, store, NoExecutor(), clock=lambda: clock[0])  # type: ignore[arg-type]
    ctl.open(str(tmp_path / "checkpoints"))
    clock[0] += 10  # the takeover's loads and set-up, slow on a loaded machine (over lost_after_s)
    ctl.listening()
    clock[0] += 2  # the node's first beat is late
    heartbeats.check_health(ctl)
    assert ctl.nodes["n1"].health != NodeHealth.LOST
    assert attempt in ctl.machine.state.attempts

    async def adopt() -> None:
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, beat(running=(RunningAttempt(attempt, job),)))

    asyncio.run(adopt())
    assert ctl.state.jobs[job].state == "RUNNING" and ctl.state.jobs[job].attempt == attempt
    assert [e["kind"] for e in store.events(job)][-1] != "requeued"

    # the grace is not endless: a node silent for lost_after_s is lost, and its job's run ends
    clock[0] += 6.5
    heartbeats.check_health(ctl)
    assert ctl.nodes["n1"].health == NodeHealth.LOST
    assert attempt not in ctl.machine.state.attempts
    assert [a["end_reason"] for a in store.attempts(job) if a["id"] == attempt] == ["node_lost"]
    store.close()


def test_a_starting_master_counts_the_grace_from_when_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real start path (MasterProcess on SQLite): `started` is set once the API is served, after a
    set-up made slow here, not when the store was opened."""
    config = parse_cluster_config(
        {"cluster": {"name": "grace"}, "servers": [{"id": "n1", "gpu_type": "v100", "gpus": 1}]}
    )
    master = MasterProcess(config, tmp_path / "state", listen="127.0.0.1:0", executor=LocalExecutor())
    serve = MasterProcess._serve
    serving: list[float] = []

    async def slow_serve(self: MasterProcess, app: web.Application) -> None:
        await asyncio.sleep(0.5)  # the set-up between opening the store and serving, slow
        serving.append(time.time())
        await serve(self, app)

    monkeypatch.setattr(MasterProcess, "_serve", slow_serve)

    async def scenario() -> None:
        await master.start()
        try:
            assert master.ctl is not None and serving
            assert master.ctl.started >= serving[-1]
            assert master.ctl.machine.started == master.ctl.started
        finally:
            await master.stop()

    asyncio.run(scenario())
