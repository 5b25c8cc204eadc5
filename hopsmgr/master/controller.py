"""The master's driver of the scheduler state machine: events in from the API and the agents, its
commands carried out with the store and the executors. It decides nothing of its own.

`Controller.feed(event)` hands one event to `hopsmgr.control.machine.SchedulerMachine`, hands the
records of the `Persist` that comes back to the store writer (hopsmgr.master.writer: on a thread of
its own once the master runs, `start_writer`), then, once they are committed, carries out the node
commands in tasks of their own (hopsmgr.master.commands); it wakes the round loop at once when the
machine asks for a plan. Node commands go out in the order their events came, also those whose event
recorded nothing (they wait for the writes before them). A submission's reply, a cancel's and a
heartbeat's wait for their own writes (`durable`); a job is visible only once its write committed.
Heartbeats and node health live in hopsmgr.master.heartbeats, a submission's checks in
hopsmgr.master.submissions, who asks (`Principal`) in hopsmgr.master.access. The clock is injected
(`clock`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import structlog

from hopsmgr.config import ClusterConfig
from hopsmgr.control.commands import (
    CheckpointAndStop,
    Command,
    LaunchAttempt,
    Persist,
    PlanSoon,
    Reply,
    StartProfiling,
    StopAttempt,
    ThroughputSample,
)
from hopsmgr.control.events import Event, JobCancelled, JobSubmitted, NodeChanged, StateRestored
from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.control.records import Job
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import TERMINAL, JobState
from hopsmgr.core.model import Calibration, JobSpec, ModelError
from hopsmgr.core.planner import Plan
from hopsmgr.core.priority import PriorityContext
from hopsmgr.master import persist, submissions
from hopsmgr.master.access import Principal, StateView
from hopsmgr.master.errors import RequestError
from hopsmgr.master.executor import Executor, NodeTarget
from hopsmgr.master.planner_process import LoggedEstimator
from hopsmgr.master.state import (
    JobPayload,
    NodeRecord,
    drain_reason_key,
    load_attempt,
    load_job,
    relative,
    store_counters,
    time_profile,
)
from hopsmgr.master.store import Row, Store, StoreError, tenant_row
from hopsmgr.master.writer import InlineWriter, Op, ThreadWriter, Writer
from hopsmgr.nodecontract import ARRAY_INDEX
from hopsmgr.protocol import Submission

log = structlog.get_logger("hopsmgr.master")
CALIBRATION_SYNC_S = 0.1
PLAN_SLICE = 64  # a plan's actions applied per turn of the event loop (ControlSettings.plan_slice)
REQUEST_SLICE = 2_000  # jobs of a plan request's profiling pass per turn (ControlSettings.request_slice)
USAGE_SAMPLES = 144  # a day of samples

__all__ = ["Controller", "RequestError", "Submission"]


class Controller:
    def __init__(
        self, config: ClusterConfig, store: Store, executor: Executor, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.settings = config.master
        self.clock = clock
        self.store = store  # the loop's connection: reads (and writes before `start_writer`)
        self.writer: Writer = InlineWriter(store)
        self.executor = executor
        m = config.master
        self.control_settings = ControlSettings(
            scheduler=config.scheduler,
            fragment_plans=config.scheduler.fragment_plans,
            suspect_after_s=m.suspect_after_s,
            lost_after_s=m.lost_after_s,
            heartbeat_interval_s=m.heartbeat_interval_s,
            plan_slice=PLAN_SLICE,
            request_slice=REQUEST_SLICE,
        )
        self.machine = SchedulerMachine(
            config.servers, config.tenants, self.control_settings, LoggedEstimator()
        )
        self.nodes = {s.id: NodeRecord(s, self.machine.state.nodes[s.id]) for s in config.servers}
        self.state = StateView(self.machine.state, self.nodes)
        self.payloads: dict[str, JobPayload] = {}
        self.stored_attempts: set[str] = set()
        self.attempt_meta = self.attempt_high = 0
        self.epoch = 0
        self.started = 0.0
        self.checkpoint_root = ""
        self.plans: dict[str, Plan] = {}
        self.positions: dict[str, int] = {}  # queue position of each queued job in the latest plan
        self.wait_ctx: tuple[float | None, PriorityContext] | None = None  # (plan time, context) for views
        self.forecasts: dict[
            str, Any
        ] = {}  # job id -> hopsmgr.forecast.live.JobForecast (master/forecasts.py)
        self.wake = asyncio.Event()  # the machine asked for a fragment plan
        self.next_round_at: float | None = None  # (clock) when the round loop's next first plan is due
        self.heartbeat_ms: deque[float] = deque(maxlen=20_000)
        self.replies_deferred = 0  # acknowledgements and stops left to a later reply (not yet durable)
        # per node, ended attempts it reported whose ends are not committed yet: attempt -> the write
        self.unacked_ends: dict[str, dict[str, asyncio.Future[None]]] = {}
        self.heartbeats = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.job_seq = 0
        self.last_write: asyncio.Future[None] | None = None  # the newest write not yet committed
        self.throughput: list[ThroughputSample] = []  # buffered history rows, written by flush()
        # Fair share: each tenant's decayed use, sampled every persist.USAGE_SAMPLE_S (newest last).
        self.usage_history: deque[tuple[float, dict[str, float]]] = deque(maxlen=USAGE_SAMPLES)
        self.written: dict[str, float] = {}  # done samples last written per live job
        self.on_command: Callable[[Command], None] | None = None  # node commands go to the executors
        self.types_moved: set[str] = set()  # GPU types whose planning views wait to be re-derived
        self.leader: dict[str, Any] = {}  # who leads (this master): url, since, epoch (for /healthz)

    @property
    def estimator(self) -> Estimator:
        return self.machine.estimator

    @property
    def ended_lr(self) -> list[tuple[float, float]]:
        return self.machine.ended_lr

    # -- start ------------------------------------------------------------------------------------------

    def listening(self) -> None:
        """The API (and so the agents' heartbeats) is served from now on: the nodes' grace period
        (`lost_after_s`, in which no node is counted lost) starts here. A takeover's loads and set-up
        before it may take seconds under load; counted from `open`, they used up the grace, and nodes
        whose first beats came a little late were declared lost, their running jobs restarted."""
        self.started = self.machine.started = self.clock()

    def open(self, checkpoint_root: str) -> None:
        """Load state from the store, take a new epoch, sync tenants (logging what changed since the last
        start); agents get a full grace period (from here, and again from `listening`)."""
        self.checkpoint_root = checkpoint_root
        self.epoch = self.store.next_epoch(self.clock())
        self.listening()
        for name, was, now in self.store.sync_tenants([tenant_row(t) for t in self.config.tenants]):
            log.info("tenant_quota_changed", tenant=name, was=was, now=now)  # None: added or removed
        drained = set()
        for row in self.store.nodes():
            node = self.nodes.get(row["id"])
            if node is None:
                continue
            if row["drained"]:
                drained.add(node.id)
                node.drain_reason = self.store.meta(drain_reason_key(node.id), "")
            node.workdir, node.device_mode = row["workdir"], row["device_mode"]
            if row["calibration"]:
                node.calibration = Calibration(
                    **row["calibration"], source=row["calibration_source"] or "measured"
                )
        self.sync_servers()
        self.job_seq = int(self.store.meta("job", "0"))
        saved = self.store.load_estimator()
        if saved is not None:
            try:
                self.machine.estimator = LoggedEstimator.from_state(saved)
            except ModelError as exc:
                log.warning("estimator_state_unusable", error=str(exc))
        jobs: list[Job] = []
        with self.store.transaction():
            for row in self.store.jobs(
                states=[s.value for s in JobState if s not in TERMINAL], newest_first=False
            ):
                job, payload = load_job(row)
                jobs.append(job)
                self.payloads[job.id] = payload
                self.written[job.id] = job.done_samples
            live = {j.id for j in jobs}
            attempts = []
            for row in self.store.open_attempts():
                if row["job_id"] not in live:  # a terminal job with an attempt left open: close it now
                    self.store.update_attempt(row["id"], ended=row["created"], end_reason="orphaned")
                    continue
                attempts.append(load_attempt(row, self.clock()))
                self.stored_attempts.add(row["id"])
        # profiles newer than the saved estimator, and those an older master read otherwise (before
        # 2026-12-04 a runtime profile was read as pattern 1, its phases overlapping)
        for row in self.store.profiles(sorted(live)):
            known = self.estimator.profile_of(row["job_id"], row["gpu_type"])
            try:
                profile = time_profile(row["profile"])
                if known is None or known[0] != profile:
                    self.estimator.add_profile(
                        row["job_id"], row["gpu_type"], profile, Calibration(**row["calibration"])
                    )
            except (ModelError, TypeError) as exc:
                log.warning("profile_unusable", job_id=row["job_id"], error=str(exc))
        seq = self.attempt_meta = self.attempt_high = int(self.store.meta("attempt", "0"))
        usage = tuple(
            (str(t), float(used), float(at))
            for t, used, at in json.loads(self.store.meta("tenant_usage", "[]"))
        )
        for at, sample in json.loads(self.store.meta("tenant_usage_history", "[]")):
            self.usage_history.append((float(at), {str(t): float(u) for t, u in sample.items()}))
        waits = tuple(float(w) for w in json.loads(self.store.meta("profiling_waits", "[]")))
        self.feed(
            StateRestored("restore", tuple(jobs), tuple(attempts), seq, frozenset(drained), usage, waits)
        )
        log.info("master_opened", epoch=self.epoch, live_jobs=len(jobs), open_attempts=len(attempts))

    def calibration_moved(self, gpu_type: str) -> None:
        """A node of `gpu_type` reported a new calibration: re-derive the type's planning views within
        CALIBRATION_SYNC_S, once for all the nodes that report meanwhile (at a master's start every
        node does, and a pass over the type for each of a thousand first heartbeats took a core)."""
        if gpu_type in self.types_moved:
            return
        self.types_moved.add(gpu_type)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven without a loop (tools, tests): at once
            self._sync_moved()
            return
        loop.call_later(CALIBRATION_SYNC_S, self._sync_moved)

    def _sync_moved(self) -> None:
        types, self.types_moved = self.types_moved, set()
        for gpu_type in sorted(types):
            self.sync_servers(gpu_type)

    def sync_servers(self, gpu_type: str | None = None) -> None:
        """Re-derive the planning view of every node (of one GPU type) into the machine: calibrations
        relative to their type's median (hopsmgr.master.state.relative), usable GPUs."""
        nodes = [n for n in self.nodes.values() if gpu_type is None or n.server.gpu_type == gpu_type]
        relative(nodes)
        for node in nodes:
            control = self.machine.state.nodes[node.id]
            server = node.effective_server()
            if control.server != server or control.usable_gpus != min(server.gpus, node.usable_gpus):
                event = NodeChanged("calibration", node.id, server, node.usable_gpus)
                self.machine.handle(event, self.clock())

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", error=repr(task.exception()))

    # -- the machine ----------------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Command]:
        return self.machine.handle(event, self.clock())

    def feed(self, event: Event, *, written: list[asyncio.Future[None]] | None = None) -> list[Command]:
        """Hand `event` to the machine, hand what it records to the writer, act on its commands once
        that is committed; the commands. The write's future (if any) is added to `written`."""
        commands = self.handle(event)
        future = self.persist(commands)
        if future is not None and written is not None:
            written.append(future)
        self.dispatch(commands, after=future)
        return commands

    def persist(self, commands: Iterable[Command]) -> asyncio.Future[None] | None:
        """Hand the records of the `Persist` commands to the writer (one write); its future, or None
        when there was nothing to write or it is already committed (raises StoreError if it failed)."""
        ops: list[Op] = []
        for c in commands:
            if isinstance(c, Persist):
                self.write(c.records, c.stimulus_id, ops)
        return self.store_ops(ops)

    def store_ops(self, ops: list[Op]) -> asyncio.Future[None] | None:
        """Hand `ops` to the writer as one write (see `persist`)."""
        if not ops:
            return None
        future = self.writer.write(ops)
        if future is not None:
            self.last_write = future
        return future

    def then(self, written: asyncio.Future[None] | None, act: Callable[[], None]) -> None:
        """Run `act` once `written` is committed, after what every earlier write waits for (at once when
        nothing waits); not at all if `written` failed (the writer logged why)."""
        own = written is not None
        if written is None and self.writer.pending():
            written = self.last_write
        if written is None or (written.done() and not own):
            act()
            return

        def done(future: asyncio.Future[None]) -> None:
            if own and (future.cancelled() or future.exception() is not None):
                return
            act()

        written.add_done_callback(done)

    def write(self, records: Sequence[object], stimulus: str, ops: list[Op]) -> None:
        """The store operations for the machine's records, added to `ops` (hopsmgr.master.persist)."""
        persist.record_ops(self, records, stimulus, ops)

    def dispatch(self, commands: Iterable[Command], *, after: asyncio.Future[None] | None = None) -> None:
        """Wake the round loop now if asked; node commands once `after` (their records) is committed."""
        to_nodes: list[Command] = []
        for command in commands:
            if isinstance(command, PlanSoon):
                self.wake.set()
            elif isinstance(command, LaunchAttempt | StartProfiling | CheckpointAndStop | StopAttempt):
                to_nodes.append(command)
        if to_nodes and self.on_command is not None:
            self.then(after, partial(self._send, to_nodes))

    def _send(self, commands: list[Command]) -> None:
        if self.on_command is not None:
            for command in commands:
                self.on_command(command)

    # -- jobs -------------------------------------------------------------------------------------------

    def spec_for(self, who: Principal, sub: Submission) -> JobSpec:
        """The job a submission describes, checked as `submit` checks it (RequestError naming the field);
        its id is "j-new". Nothing is stored: `submit` and the what-if forecasts build on it."""
        spec = submissions.job_spec(
            who,
            sub,
            default_run_s=self.config.scheduler.default_run_s,
            visible=self.visible,
            live=self.machine.state.jobs,
            clock=self.clock,
        )
        refused = self.machine.refusal(spec)
        if refused is not None:
            raise RequestError(refused.status, refused.error_field, refused.error or "refused")
        return spec

    async def submit(self, who: Principal, sub: Submission, run_as: str = "") -> dict[str, Any]:
        """Validate, hand to the machine and store; the job's row once committed.
        `run_as`: the Unix account its attempts run as (checked by hopsmgr.master.identity)."""
        spec = self.spec_for(who, sub)
        self.job_seq += 1
        seq = self.job_seq
        job_id = f"j-{seq:06d}"
        spec = replace(spec, id=job_id)
        payload = JobPayload(
            seq,
            sub.name,
            tuple(sub.command),
            dict(sub.env) if sub.array_index is None else {**sub.env, ARRAY_INDEX: str(sub.array_index)},
            sub.workdir,
            sub.launcher,
            run_as,
            sub.mem_mb,
            sub.cpus,
            sub.checkpoint_signal,
            sub.grace_s,
        )
        self.payloads[job_id] = payload
        commands = self.handle(JobSubmitted(f"submit-{job_id}", spec, f"by {who.user} ({spec.tenant})"))
        reply = next(c for c in commands if isinstance(c, Reply))
        if reply.error is not None:
            self.payloads.pop(job_id, None)
            raise RequestError(reply.status, reply.error_field, reply.error)
        ops: list[Op] = []
        for c in commands:
            if isinstance(c, Persist):
                self.write(c.records, c.stimulus_id, ops)
        ops.append(partial(Store.set_meta, key="job", value=str(seq)))
        try:
            written = self.store_ops(ops)
            self.dispatch(commands, after=written)
            if written is not None:
                await written  # the job is stored (and visible) only once its write committed
        except StoreError:
            self.machine.forget(job_id)
            self.payloads.pop(job_id, None)
            raise
        row = self.store.job(job_id)
        assert row is not None
        return row

    def visible(self, who: Principal, job_id: str, *, full: bool = True) -> Row:
        """The job's row if `who` may see it (in `full`: its command, env, logs, and cancel it)."""
        row = self.store.job(job_id)
        if row is None or (not who.admin and row["tenant"] != who.tenant):
            raise RequestError(404, "id", f"no job {job_id!r}")
        if full and not who.acts_for(row):
            raise RequestError(
                403,
                "id",
                f"job {job_id} is {row['user']}'s: user {who.user!r} sees only its queue position "
                "(hopsmgr queue); its owner or a tenant admin can show, cancel or read it",
            )
        return row

    async def cancel(self, who: Principal, job_id: str) -> None:
        """Cancel the job; returns once that is stored."""
        self.visible(who, job_id)
        commands = self.handle(JobCancelled(f"cancel-{job_id}", job_id, by=who.user))
        reply = next((c for c in commands if isinstance(c, Reply)), None)
        if reply is not None and reply.error is not None:
            row = self.store.job(job_id)
            raise RequestError(409, "id", f"job {job_id} already ended ({row['state'] if row else '?'})")
        written = self.persist(commands)
        self.dispatch(commands, after=written)
        await self.durable([written] if written is not None else [])

    def target(self, node_id: str) -> NodeTarget:
        return NodeTarget(node_id, self.nodes[node_id].workdir)

    def profile_of(self, raw: dict[str, float] | None) -> tuple[Any, str]:
        """A finished profiling run's profile.json as the estimator's TimeProfile (None, why when unusable)."""
        if not raw:
            return None, ""
        try:
            return time_profile(raw), ""
        except ModelError as exc:
            return None, f"profile.json is not usable: {exc}"

    def flush(self) -> None:
        """Write buffered throughput history and progress counters in one transaction (about every second)."""
        rows, self.throughput = self.throughput, []
        # Progress changes only while an attempt is open; a job's state change when it ends writes its
        # counters (_write_change), so the jobs of open attempts are all that can be dirty here.
        state = self.machine.state
        placed = {a.job_id for a in state.attempts.values() if not a.profiling}
        dirty = [
            job
            for job in (state.jobs.get(j) for j in placed)
            if job is not None and self.written.get(job.id) != job.done_samples
        ]
        if not rows and not dirty:
            return
        ops: list[Op] = [
            partial(
                Store.add_throughput,
                job_id=t.job_id,
                time=t.at,
                placement=t.placement.as_dict(),
                rate=t.samples_per_s,
                estimate=t.estimated_per_s,
            )
            for t in rows
        ]
        for job in dirty:
            values = store_counters(job.counters())
            ops.append(partial(persist.store_job_counters, job_id=job.id, values=values))
            self.written[job.id] = job.done_samples
        self.store_ops(ops)

    # -- durability -------------------------------------------------------------------------------------

    def start_writer(self) -> None:
        """From now on the records are written on a thread of their own, with a connection of its own
        (hopsmgr.master.writer), so that statements and fsyncs do not hold up the event loop."""
        self.writer = ThreadWriter(self.store.sibling(), asyncio.get_running_loop())

    def close_writer(self) -> None:
        """Commit what waits and stop the writer's thread (writes go on the loop's connection again)."""
        writer, self.writer = self.writer, InlineWriter(self.store)
        writer.close()

    async def durable(self, written: Iterable[asyncio.Future[None]]) -> None:
        """Wait until the writes `written` are committed (StoreError if one could not be)."""
        for future in written:
            await future

    async def settled(self) -> None:
        """Wait until everything handed to the writer so far is committed (or failed)."""
        await self.writer.settled()
