"""Heartbeats, node health and durability: the part of the controller that listens to agents.

`NodeTracking` is mixed into `hopsmgr.master.controller.Controller`: a heartbeat updates the node,
adopts, follows and ends attempts (all in one group commit that `durable()` makes durable before the
reply), tells the agent what to stop, and spots attempts that vanished; `check_health` moves silent
nodes to SUSPECT and LOST; nodes the master cannot reach over SSH take no new work for a while.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Calibration, ModelError
from hopsmgr.master.errors import RequestError
from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.settings import MasterSettings
from hopsmgr.master.state import (
    AttemptRecord,
    JobRecord,
    MasterState,
    NodeHealth,
    NodeRecord,
    calibration_json,
    relative,
)
from hopsmgr.master.store import Store, StoreError
from hopsmgr.protocol import FinishedAttempt, Heartbeat, HeartbeatReply, Progress

log = structlog.get_logger("hopsmgr.master")


class NodeTracking:
    if TYPE_CHECKING:  # provided by Controller
        state: MasterState
        store: Store
        settings: MasterSettings
        clock: Callable[[], float]
        epoch: int
        started: float
        wake: asyncio.Event
        heartbeats: int
        heartbeat_ms: deque[float]
        durable_waiters: list[asyncio.Future[None]]
        commit_scheduled: bool

        stop_done: dict[str, asyncio.Event]

        def end_attempt(
            self,
            attempt: AttemptRecord,
            *,
            reason: str,
            code: int | None = None,
            checkpointed: bool = False,
            profile: dict[str, float] | None = None,
            progress: Progress | None = None,
            log_tail: str = "",
            message: str = "",
        ) -> None: ...
        def _progress(self, attempt: AttemptRecord, progress: Progress) -> None: ...
        def _set(self, job: JobRecord, new: JobState, kind: str, message: str = "") -> None: ...
        def spawn(self, coro: Any) -> asyncio.Task[Any]: ...
        async def _stop_attempt(self, attempt: AttemptRecord, *, checkpoint: bool, reason: str) -> None: ...

    def heartbeat(self, beat: Heartbeat) -> HeartbeatReply:
        t0 = time.perf_counter()
        node = self.state.nodes.get(beat.node)
        if node is None:
            raise RequestError(404, "node", f"node {beat.node!r} is not in this cluster's configuration")
        if beat.gpu_type != node.server.gpu_type:
            raise RequestError(
                409,
                "gpu_type",
                f"node {beat.node!r} reports GPU type {beat.gpu_type!r}, configured {node.server.gpu_type!r}",
            )
        now = self.clock()
        changed = self._update_node(node, beat, now)
        first = not node.seen
        node.seen = True
        stop: list[str] = []
        ack: list[str] = []
        reported: set[str] = set()
        with self.store.grouped():  # made durable by `durable()` before the reply
            if changed:
                self.store.upsert_node(node.to_row())
            for run in beat.running:
                reported.add(run.attempt)
                attempt = self.state.attempts.get(run.attempt)
                if attempt is None or (attempt.stopping and attempt.job_id not in self.state.jobs):
                    stop.append(run.attempt)
                    continue
                if not attempt.launched:
                    self._adopt(attempt, now)
                if attempt.stopping and attempt.job_id not in self.stop_done and node.id == attempt.primary:
                    # a checkpoint-and-stop stored before a master restart and never carried out
                    self.stop_done[attempt.job_id] = asyncio.Event()
                    self.spawn(self._stop_attempt(attempt, checkpoint=True, reason="preempted"))
                attempt.unseen_beats = 0
                if run.progress is not None and node.id == attempt.primary:
                    self._progress(attempt, run.progress)
            for fin in beat.finished:
                reported.add(fin.attempt)
                ack.append(fin.attempt)
                attempt = self.state.attempts.get(fin.attempt)
                if attempt is not None and node.id == attempt.primary:
                    self._finished(attempt, fin)
            self._vanished(node, reported, first, now)
        self.heartbeats += 1
        self.heartbeat_ms.append((time.perf_counter() - t0) * 1000)
        calibrate, node.calibrate_requested = node.calibrate_requested, False
        return HeartbeatReply(
            self.epoch, self.settings.heartbeat_interval_s, tuple(ack), tuple(stop), calibrate=calibrate
        )

    async def durable(self) -> None:
        """Wait until the open group commit is on disk: one commit every ~3 ms for all heartbeats."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.durable_waiters.append(future)
        self.commit_soon()
        await future

    def commit_soon(self) -> None:
        """Commit the open group within ~3 ms (for records of what already happened)."""
        if not self.commit_scheduled:
            self.commit_scheduled = True
            asyncio.get_running_loop().call_later(0.003, self._commit_group)

    def _commit_group(self) -> None:
        self.commit_scheduled = False
        waiters, self.durable_waiters = self.durable_waiters, []
        try:
            self.store.commit_group()
        except StoreError as exc:
            log.critical("state_not_written", error=str(exc))
            for future in waiters:
                if not future.done():
                    future.set_exception(exc)
            return
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _update_node(self, node: NodeRecord, beat: Heartbeat, now: float) -> bool:
        if node.health != NodeHealth.HEALTHY and beat.healthy:
            log.info("node_healthy", node=node.id, was=node.health)
            self.wake.set()  # its GPUs can take work now
        node.health = NodeHealth.HEALTHY if beat.healthy else NodeHealth.SUSPECT
        node.last_beat = now
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
        if calibration != node.calibration:
            node.calibration = calibration
            relative(list(self.state.nodes.values()))
        node.workdir, node.device_mode = beat.workdir, beat.device_mode
        node.reported_gpus, node.agent_version = beat.gpus, beat.agent_version
        return changed

    def _adopt(self, attempt: AttemptRecord, now: float) -> None:
        """A node reports an attempt the master stored but had not seen start (e.g. after a restart)."""
        attempt.launched = True
        attempt.started = attempt.started or now
        self.store.update_attempt(attempt.id, started=attempt.started)
        job = self.state.jobs.get(attempt.job_id)
        if job is not None and job.state == JobState.LAUNCHING and not attempt.profiling:
            kind = "adopted" if attempt.created < self.started else "started"
            self._set(job, JobState.RUNNING, kind, f"{attempt.id} reported running by {attempt.primary}")

    def _finished(self, attempt: AttemptRecord, fin: FinishedAttempt) -> None:
        if fin.code is None and fin.signal is None and not fin.checkpointed:
            reason = "vanished"
        else:
            reason = "cancelled" if attempt.job_id not in self.state.jobs else "exited"
        self.end_attempt(
            attempt,
            reason=reason,
            code=fin.code if fin.code is not None else (-fin.signal if fin.signal else None),
            checkpointed=fin.checkpointed,
            profile=fin.profile,
            progress=fin.progress,
            log_tail=fin.log_tail,
        )

    def _vanished(self, node: NodeRecord, reported: set[str], first: bool, now: float) -> None:
        """Open attempts on this node that its agent no longer reports: requeued after three beats (at once
        on the first beat after a master restart, for attempts whose launch was never confirmed)."""
        for attempt in self.state.attempts_on(node.id):
            if attempt.primary != node.id or attempt.id in reported:
                continue
            if not attempt.launched:
                if first and attempt.created < self.started:
                    self.end_attempt(
                        attempt,
                        reason="vanished",
                        message="launch never confirmed before the master restarted",
                    )
                continue
            attempt.unseen_beats += 1
            # A beat may have been written before the launch and handled after it: only beats well after
            # the launch count, and it takes three of them.
            settled = now - (attempt.started or now) > 3 * self.settings.heartbeat_interval_s + 10.0
            if (attempt.unseen_beats >= 3 and settled) or (first and attempt.created < self.started):
                self.end_attempt(attempt, reason="vanished", message=f"{node.id} no longer reports it")

    def check_health(self) -> None:
        """HEALTHY -> SUSPECT -> LOST by heartbeat age; a LOST node's attempts end and their jobs requeue."""
        now = self.clock()
        grace_over = now - self.started > self.settings.lost_after_s
        for node in self.state.nodes.values():
            since = now - (node.last_beat if node.last_beat is not None else self.started)
            if since > self.settings.lost_after_s and grace_over:
                if node.health != NodeHealth.LOST:
                    node.health = NodeHealth.LOST
                    log.warning("node_lost", node=node.id, since_s=round(since, 1))
                for attempt in self.state.attempts_on(node.id):
                    self.end_attempt(attempt, reason="node_lost", message=f"node {node.id} lost")
            elif since > self.settings.suspect_after_s and node.health == NodeHealth.HEALTHY:
                node.health = NodeHealth.SUSPECT
                log.warning("node_suspect", node=node.id, since_s=round(since, 1))

    def node_error(self, node_id: str, exc: ExecutorError) -> None:
        """A command could not reach or act on a node: no new placements there for a while."""
        node = self.state.nodes.get(node_id)
        if node is None or exc.kind not in ("unreachable", "auth", "hostkey"):
            return
        node.exec_error = str(exc)
        node.exec_error_at = self.clock()
        log.warning("node_command_failed", node=node_id, kind=exc.kind, error=exc.message)

    def request_calibration(self, node_id: str) -> NodeRecord:
        node = self.state.nodes.get(node_id)
        if node is None:
            raise RequestError(404, "node", f"no node {node_id!r}")
        node.calibrate_requested = True
        log.info("calibration_requested", node=node_id)
        return node

    def set_drained(self, node_id: str, drained: bool) -> NodeRecord:
        node = self.state.nodes.get(node_id)
        if node is None:
            raise RequestError(404, "node", f"no node {node_id!r}")
        node.drained = drained
        with self.store.transaction():
            self.store.upsert_node(node.to_row())
        log.info("node_drained" if drained else "node_undrained", node=node_id)
        self.wake.set()
        return node
