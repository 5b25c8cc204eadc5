"""A heartbeat's reply acknowledges an ended attempt only once its end is committed, and does not wait
behind a busy store writer for it (hopsmgr.master.heartbeats.answer): the acknowledgement comes in a
later reply, and the end reported again meanwhile is not handled twice."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

from hopsmgr.config import ClusterConfig
from hopsmgr.control.commands import PlanRequest, StartProfiling
from hopsmgr.control.events import RoundTick
from hopsmgr.control.planning import compute_plan
from hopsmgr.core.model import Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master import heartbeats
from hopsmgr.master.access import Principal
from hopsmgr.master.controller import Controller
from hopsmgr.master.store import Store, StoreError
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.protocol import FinishedAttempt, Heartbeat, RunningAttempt, parse_submission
from tests.control.test_drivers import NoExecutor

PROFILE = {"tf_s": 0.01, "tb_s": 0.02, "tu_s": 0.005, "td_s": 0.004, "samples_per_s": 100.0, "iterations": 20}


def controller(tmp_path: Path) -> tuple[Controller, Store]:
    """A controller of one 2-GPU node over a real store (its writer is started by each scenario)."""
    config = ClusterConfig("acks", (Server("n1", "v100", 2),), SchedulerSettings(), ())
    store = Store(tmp_path / "state.db")
    ctl = Controller(config, store, NoExecutor(), clock=time.time)  # type: ignore[arg-type]
    ctl.open(str(tmp_path / "checkpoints"))
    return ctl, store


def beat(finished: tuple[FinishedAttempt, ...] = ()) -> Heartbeat:
    return Heartbeat("n1", "v100", 2, "emulated", "/tmp/hopsmgr-test", finished=finished)


def test_an_end_is_acknowledged_once_committed_without_the_reply_waiting_for_a_busy_writer(
    tmp_path: Path,
) -> None:
    ctl, store = controller(tmp_path)
    sub = parse_submission(
        {"command": ["python", "train.py"], "gpus": [1], "batch_size": 8, "iterations": 10}
    )

    async def scenario() -> None:
        ctl.start_writer()
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, beat())
        job = (await ctl.submit(Principal("admin", "default", admin=True), sub))["id"]
        requests = [c for c in ctl.feed(RoundTick("tick", "first")) if isinstance(c, PlanRequest)]
        ready = compute_plan(requests[0], HopsPolicy(SchedulerSettings()), ctl.estimator, time.perf_counter)
        runs = [c for c in ctl.feed(ready) if isinstance(c, StartProfiling)]
        await ctl.settled()
        assert len(runs) == 1
        ended = FinishedAttempt(runs[0].attempt_id, job, 0, profile=dict(PROFILE))

        gate = threading.Event()
        ctl.store_ops([lambda _: gate.wait(10)])  # the writer is busy with an earlier, long write
        t0 = time.perf_counter()
        first = heartbeats.answer(ctl, beat((ended,)))
        assert time.perf_counter() - t0 < 1.0  # the reply did not wait for the writer
        assert first.ack == ()  # not committed yet: not acknowledged
        again = heartbeats.answer(ctl, beat((ended,)))  # the agent reports it again
        assert again.ack == ()
        assert ctl.replies_deferred == 2
        gate.set()
        await ctl.settled()
        last = heartbeats.answer(ctl, beat((ended,)))
        assert last.ack == (runs[0].attempt_id,)
        assert ctl.unacked_ends == {}  # nothing kept once acknowledged
        ctl.close_writer()

        row = store.attempts(job)[0]
        assert row["ended"] is not None and row["exit_code"] == 0
        assert len(store.profiles([job])) == 1  # the end (and its profile) handled once
        assert [e["kind"] for e in store.events(job)].count("queued") == 1, store.events(job)

    asyncio.run(scenario())
    store.close()


def test_a_stop_waits_for_the_writes_before_its_beat_and_not_for_the_beats_own(tmp_path: Path) -> None:
    ctl, store = controller(tmp_path)
    stray = Heartbeat(
        "n1", "v100", 2, "emulated", "/tmp/hopsmgr-test", running=(RunningAttempt("a-stray", "j-gone"),)
    )

    async def scenario() -> None:
        ctl.start_writer()
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, beat())
        await ctl.settled()
        gate = threading.Event()
        ctl.store_ops([lambda _: gate.wait(10)])  # a write made before the beat is not committed yet
        held = heartbeats.answer(ctl, stray)
        assert held.stop == ()
        gate.set()
        await ctl.settled()
        named = heartbeats.answer(ctl, stray)  # the next beat names it
        assert named.stop == ("a-stray",)
        # a beat that writes records of its own (here the node's new work directory) still names the
        # stop at once: its own writes are not what the stop was decided on
        moved = replace(stray, workdir="/tmp/hopsmgr-elsewhere")
        assert heartbeats.answer(ctl, moved).stop == ("a-stray",)
        assert ctl.last_write is not None and not ctl.last_write.done()  # it did write, not committed yet
        await ctl.settled()
        ctl.close_writer()

    asyncio.run(scenario())
    store.close()


def test_an_end_whose_write_failed_is_never_acknowledged(tmp_path: Path) -> None:
    ctl, store = controller(tmp_path)
    ended = FinishedAttempt("a-lost", "j-lost", 0)

    async def scenario() -> None:
        ctl.start_writer()
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, beat())
        await ctl.settled()
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(StoreError("disk full"))
        ctl.unacked_ends["n1"] = {"a-lost": failed}  # its end was handled; the write of it failed
        for _ in range(3):  # reported again and again: never acknowledged, nor handled twice
            reply = heartbeats.answer(ctl, beat((ended,)))
            assert reply.ack == ()
            assert ctl.unacked_ends["n1"] == {"a-lost": failed}
        assert heartbeats.answer(ctl, beat()).ack == ()  # no longer reported: forgotten
        assert "n1" not in ctl.unacked_ends
        await ctl.settled()
        ctl.close_writer()

    asyncio.run(scenario())
    store.close()


def test_a_beat_with_the_same_calibration_keeps_the_nodes_server_view(tmp_path: Path) -> None:
    # a new but equal calibration each beat would make a new planning view of the server each beat: a
    # thousand objects every heartbeat interval for the garbage collector to walk at 1,000 nodes
    ctl, store = controller(tmp_path)

    def calibrated(factor: float) -> Heartbeat:
        cal = {"compute_factor": factor, "memory_factor": 0.9}
        return replace(beat(), calibration=cal, calibration_source="measured")

    async def scenario() -> None:
        ctl.start_writer()
        ctl.on_command = lambda c: None
        heartbeats.answer(ctl, calibrated(1.1))
        node = ctl.nodes["n1"]
        first = node.effective_server()
        heartbeats.answer(ctl, calibrated(1.1))
        assert node.effective_server() is first  # nothing new to walk
        heartbeats.answer(ctl, calibrated(1.2))
        changed = node.effective_server()
        assert changed is not first and changed.calibration.compute_factor == 1.2
        await ctl.settled()
        ctl.close_writer()

    asyncio.run(scenario())
    store.close()
