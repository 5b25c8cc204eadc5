"""Heartbeats and node health: what the agents report, turned into the state machine's events.

A heartbeat updates the node's own record (work directory, calibration, device mode), then hands the
machine a `NodeBeat`, an `AttemptEnded` for every attempt the agent reports finished, and a
`NodeReported` with what still runs (the machine adopts, follows, resends stops, and ends attempts the
node no longer runs, and names what the agent must stop). `answer` gives the reply: it acknowledges an
ended attempt only once its end is committed and names attempts to stop only once every write made
before the beat is, without waiting for the store writer: what is not yet durable is left to a later reply (the
agent reports an ended attempt until it is acknowledged, and the machine names a stop in every reply
while the node still runs the attempt), so a heartbeat never waits behind a write, nor yields the loop
to other work while it is being answered. An end whose write failed is never acknowledged.
`check_health` is the machine's HealthTick; commands that could not reach a node become
NodeCommandFailed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import partial

import structlog

from hopsmgr.control.commands import NodeReply, Reply
from hopsmgr.control.events import (
    AttemptEnded,
    HealthTick,
    NodeBeat,
    NodeCommandFailed,
    NodeDrained,
    NodeReported,
    RunReport,
)
from hopsmgr.control.records import NodeHealth
from hopsmgr.core.model import Calibration, ModelError
from hopsmgr.master.controller import Controller
from hopsmgr.master.errors import RequestError
from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.state import NodeRecord, calibration_json, drain_reason_key
from hopsmgr.master.store import Store
from hopsmgr.protocol import FinishedAttempt, Heartbeat, HeartbeatReply, Progress

log = structlog.get_logger("hopsmgr.master")


Written = list[asyncio.Future[None]]


def answer(ctl: Controller, beat: Heartbeat) -> HeartbeatReply:
    """Handle `beat`; the reply, with the acknowledgements and stops already durable (see the module)."""
    reply, ends, stops_after = heartbeat(ctl, beat)
    ack = tuple(a for a in reply.ack if _durable(ends.get(a)))
    stop = reply.stop if _durable(stops_after) else ()
    ctl.replies_deferred += len(reply.ack) - len(ack) + len(reply.stop) - len(stop)
    if ack == reply.ack and stop == reply.stop:
        return reply
    return replace(reply, ack=ack, stop=stop)


def _durable(future: asyncio.Future[None] | None) -> bool:
    """Committed: a write still queued is not, nor one that failed (the writer logs it); an end whose
    write failed is never acknowledged, so the node reports it to the next master that can keep it."""
    return future is None or (future.done() and not future.cancelled() and future.exception() is None)


def heartbeat(
    ctl: Controller, beat: Heartbeat
) -> tuple[HeartbeatReply, dict[str, asyncio.Future[None] | None], asyncio.Future[None] | None]:
    """The reply with every acknowledgement and stop, each ended attempt's write its acknowledgement
    waits for, and the write the stops wait for (None: nothing to wait for)."""
    t0 = time.perf_counter()
    node = ctl.nodes.get(beat.node)
    if node is None:
        raise RequestError(404, "node", f"node {beat.node!r} is not in this cluster's configuration")
    if beat.gpu_type != node.server.gpu_type:
        raise RequestError(
            409,
            "gpu_type",
            f"node {beat.node!r} reports GPU type {beat.gpu_type!r}, configured {node.server.gpu_type!r}",
        )
    changed, moved = _update_node(node, beat)
    if moved:
        ctl.calibration_moved(node.server.gpu_type)
    first = not node.seen
    node.seen = True
    stim = f"beat-{beat.node}-{ctl.heartbeats + 1}"
    # the stops this beat names were decided before it (an attempt the machine no longer has, or one of
    # a job that has ended): they wait for the writes made until now, not for this beat's own
    written_before = ctl.last_write
    written: Written = []
    stop, ack, ends = _handle(ctl, stim, node, beat, changed, first, written)
    for future in written:
        future.add_done_callback(_retrieved)
    stops_after = written_before if stop else None
    ctl.heartbeats += 1
    ctl.heartbeat_ms.append((time.perf_counter() - t0) * 1000)
    calibrate, node.calibrate_requested = node.calibrate_requested, False
    reply = HeartbeatReply(
        ctl.epoch, ctl.settings.heartbeat_interval_s, tuple(ack), stop, calibrate=calibrate
    )
    return reply, ends, stops_after


def _retrieved(future: asyncio.Future[None]) -> None:
    """A write no reply waited for: its failure is the writer's to log (no 'never retrieved' noise)."""
    if not future.cancelled():
        future.exception()


def _handle(
    ctl: Controller,
    stim: str,
    node: NodeRecord,
    beat: Heartbeat,
    changed: bool,
    first: bool,
    written: Written,
) -> tuple[tuple[str, ...], list[str], dict[str, asyncio.Future[None] | None]]:
    was = node.health
    beat_event = NodeBeat(stim, node.id, beat.healthy, node.effective_server(), node.usable_gpus)
    ctl.feed(beat_event, written=written)
    if was != node.health and node.health == NodeHealth.HEALTHY:
        log.info("node_healthy", node=node.id, was=was)
    if changed:
        _store(ctl, written, partial(Store.upsert_node, row=node.to_row()))
    ack = []
    # Ends this node reported before and that are not acknowledged yet: not handled twice, acknowledged
    # once their write is committed. What the node no longer reports is forgotten.
    earlier = ctl.unacked_ends.pop(node.id, {})
    ends: dict[str, asyncio.Future[None] | None] = {}
    for fin in beat.finished:
        ack.append(fin.attempt)
        if fin.attempt in earlier:
            ends[fin.attempt] = earlier[fin.attempt]
            continue
        before = len(written)
        ctl.feed(_ended(ctl, stim, node.id, fin, written), written=written)
        ends[fin.attempt] = ctl.last_write if len(written) > before else None
    running = tuple(_run_report(run.attempt, run.progress) for run in beat.running)
    commands = ctl.feed(
        NodeReported(stim, node.id, running, tuple(f.attempt for f in beat.finished), first), written=written
    )
    stop: tuple[str, ...] = ()
    for command in commands:
        if isinstance(command, NodeReply):
            stop = command.stop
    # not committed yet, or failed (never acknowledged: see _durable)
    pending = {a: f for a, f in ends.items() if f is not None and not _durable(f)}
    if pending:
        ctl.unacked_ends[node.id] = pending
    return stop, ack, ends


def _store(ctl: Controller, written: Written, *ops: partial[None]) -> None:
    future = ctl.store_ops(list(ops))
    if future is not None:
        written.append(future)


def _run_report(attempt_id: str, progress: Progress | None) -> RunReport:
    if progress is None:
        return RunReport(attempt_id)
    return RunReport(
        attempt_id,
        work_done(progress),
        progress.samples_per_s,
        progress.td_s,
        progress.tw_s,
        measuring=progress.mode == "run",
        iteration_s=progress.iteration_s,
        work_counted=progress.work is not None,
    )


def work_done(progress: Progress) -> float:
    """The job's work a progress record says is done, in iterations at its smallest GPU count (an older
    runtime's plain iteration count when it reports no work)."""
    return float(progress.iteration) if progress.work is None else progress.work


def _ended(ctl: Controller, stim: str, node_id: str, fin: FinishedAttempt, written: Written) -> AttemptEnded:
    attempt = ctl.machine.state.attempts.get(fin.attempt)
    job = ctl.machine.state.jobs.get(attempt.job_id) if attempt is not None else None
    done = None
    if fin.progress is not None and job is not None:
        done = work_done(fin.progress) * job.spec.batch_size * job.spec.requirements.minimum
    profile, problem = ctl.profile_of(fin.profile)
    if profile is not None and attempt is not None and job is not None and attempt.profiling:
        server = ctl.nodes[attempt.primary].effective_server()
        cal = {**calibration_json(server.calibration), "source": server.calibration.source}
        add = partial(
            Store.add_profile,
            job_id=job.id,
            gpu_type=server.gpu_type,
            profile=fin.profile or {},
            calibration=cal,
            time=ctl.clock(),
        )
        _store(ctl, written, add)
    code = fin.code if fin.code is not None else (-fin.signal if fin.signal else None)
    vanished = fin.code is None and fin.signal is None and not fin.checkpointed
    return AttemptEnded(
        stim,
        fin.attempt,
        "vanished" if vanished else "exited",
        code,
        fin.checkpointed,
        profile,
        done,
        problem or fin.log_tail,
        node_id=node_id,
    )


def _update_node(node: NodeRecord, beat: Heartbeat) -> tuple[bool, bool]:
    """Take the agent's view of its node; (the stored row changed, the calibration changed)."""
    calibration = node.calibration
    if beat.calibration is not None:
        try:
            # keys a run did not measure keep the operator's hints (or defaults), not silent 1.0s
            merged = {**calibration_json(node.server.calibration), **beat.calibration}
            calibration = Calibration(**merged, source=beat.calibration_source or "measured")
        except (ModelError, TypeError) as exc:
            raise RequestError(400, "calibration", str(exc)) from exc
    changed = (
        node.workdir != beat.workdir
        or node.device_mode != beat.device_mode
        or node.calibration != calibration
        or node.reported_gpus != beat.gpus
        or node.agent_version != beat.agent_version
    )
    moved = calibration != node.calibration or node.reported_gpus != beat.gpus
    if calibration != node.calibration:  # an equal one is not kept: the node's server view stays cached
        node.calibration = calibration
    node.workdir, node.device_mode = beat.workdir, beat.device_mode
    node.reported_gpus, node.agent_version = beat.gpus, beat.agent_version
    return changed, moved


def check_health(ctl: Controller) -> None:
    """HEALTHY -> SUSPECT -> LOST by heartbeat age (decided by the machine)."""
    before = {n.id: n.health for n in ctl.nodes.values()}
    ctl.feed(HealthTick(f"health-{ctl.clock():.0f}"))
    for node in ctl.nodes.values():
        if node.health != before[node.id]:
            log.warning(f"node_{node.health.lower()}", node=node.id, was=before[node.id])


def node_error(ctl: Controller, node_id: str, exc: ExecutorError) -> None:
    """A command could not reach or act on a node: no new placements there for a while."""
    node = ctl.nodes.get(node_id)
    if node is None or exc.kind not in ("unreachable", "auth", "hostkey"):
        return
    node.exec_error = str(exc)
    ctl.feed(NodeCommandFailed(f"exec-{node_id}", node_id, exc.message))
    log.warning("node_command_failed", node=node_id, kind=exc.kind, error=exc.message)


def request_calibration(ctl: Controller, node_id: str) -> NodeRecord:
    node = ctl.nodes.get(node_id)
    if node is None:
        raise RequestError(404, "node", f"no node {node_id!r}")
    node.calibrate_requested = True
    log.info("calibration_requested", node=node_id)
    return node


async def set_drained(ctl: Controller, node_id: str, drained: bool, reason: str = "") -> NodeRecord:
    """Drain or undrain the node; returns once that is stored. Draining a drained node again without
    a reason keeps the reason it was drained for."""
    node = ctl.nodes.get(node_id)
    if node is None:
        raise RequestError(404, "node", f"no node {node_id!r}")
    known = ctl.machine.state.nodes.get(node_id)
    if drained and not reason and known is not None and known.drained:
        reason = node.drain_reason
    written: Written = []
    commands = ctl.feed(NodeDrained(f"drain-{node_id}", node_id, drained), written=written)
    for command in commands:
        if isinstance(command, Reply) and command.error is not None:
            raise RequestError(command.status, command.error_field, command.error)
    node.drain_reason = reason if drained else ""
    _store(
        ctl,
        written,
        partial(Store.upsert_node, row=node.to_row()),
        partial(Store.set_meta, key=drain_reason_key(node_id), value=node.drain_reason),
    )
    await ctl.durable(written)
    log.info("node_drained" if drained else "node_undrained", node=node_id, reason=node.drain_reason)
    return node
