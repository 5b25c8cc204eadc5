"""The master's controller: submissions, cancels, heartbeats, node health and the ends of attempts.

It owns `MasterState` (the only writer) and the estimator; the round loop (hopsmgr.master.rounds) plans
and acts through it. Everything here runs on the event-loop thread; the planner runs off it on an
immutable snapshot, and estimator updates that arrive while it plans are applied once it returns.
The clock is injected (`clock`), so tests can drive time.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from hopsmgr.config import ClusterConfig
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import LIVE, JobState
from hopsmgr.core.model import Calibration, JobSpec, ModelError, RequirementSet
from hopsmgr.core.planner import Plan
from hopsmgr.master import faults
from hopsmgr.master.executor import Executor, ExecutorError, NodeTarget
from hopsmgr.master.state import (
    AttemptRecord,
    JobRecord,
    MasterState,
    NodeHealth,
    NodeRecord,
    calibration_json,
    relative,
    time_profile,
)
from hopsmgr.master.store import Store, StoreError
from hopsmgr.protocol import FinishedAttempt, Heartbeat, HeartbeatReply, Progress

log = structlog.get_logger("hopsmgr.master")
EXIT_CHECKPOINTED = 75


def exit_text(code: int | None) -> str:
    """How an attempt's process ended, for its job's history: "exited with 3", or for a negative code
    (the agent reports a death by signal N as -N) "was killed by signal 9 (SIGKILL)"."""
    if code is None or code >= 0:
        return f"exited with {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


class RequestError(ValueError):
    """A request that cannot be done: HTTP `status`, the `field` at fault (or None), and why."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: str
    admin: bool = False
    agent: bool = False


@dataclass(frozen=True, slots=True)
class Submission:
    command: tuple[str, ...]
    gpus: tuple[int, ...]
    batch_size: int
    iterations: float | None
    samples: float | None
    name: str
    tenant: str | None
    params: float
    workdir: str
    env: dict[str, str]
    launcher: str


class Controller:
    def __init__(
        self, config: ClusterConfig, store: Store, executor: Executor, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self.settings = config.master
        self.clock = clock
        self.store = store
        self.executor = executor
        self.state = MasterState(store, config.servers, config.tenants)
        self.estimator = Estimator()
        self.epoch = 0
        self.started = 0.0
        self.checkpoint_root = ""
        self.plans: dict[str, Plan] = {}
        self.positions: dict[str, int] = {}
        self.wait_ctx: tuple[float | None, Any] | None = (
            None  # (plan time, PriorityContext) for views  # queue position of each queued job in the latest plan
        )
        self.deferred: list[Callable[[], None]] | None = None  # estimator updates held while planning
        self.wake = asyncio.Event()  # something changed: a fragment plan may place work
        self.stop_done: dict[str, asyncio.Event] = {}
        self.ended_lr: deque[tuple[float, float]] = deque(maxlen=10_000)
        self.heartbeat_ms: deque[float] = deque(maxlen=20_000)
        self.heartbeats = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.job_seq = 0
        self.submissions: list[tuple[JobRecord, str, asyncio.Future[None]]] = []
        self.durable_waiters: list[asyncio.Future[None]] = []
        self.commit_scheduled = False
        self.throughput: list[tuple[str, float, dict[str, int], float]] = []  # buffered history rows

    # -- start ------------------------------------------------------------------------------------------

    def open(self, checkpoint_root: str) -> None:
        """Load state from the store, take a new epoch, sync tenants; agents get a full grace period."""
        self.checkpoint_root = checkpoint_root
        self.epoch = self.store.next_epoch(self.clock())
        self.started = self.clock()
        self.store.sync_tenants(
            [
                {
                    "name": t.name,
                    "guaranteed_gpus": t.guaranteed_gpus,
                    "cap_gpus": t.cap_gpus,
                    "weight": t.weight,
                }
                for t in self.config.tenants
            ]
        )
        self.state.load()
        self.job_seq = int(self.store.meta("job", "0"))
        saved = self.store.load_estimator()
        if saved is not None:
            try:
                self.estimator = Estimator.from_state(saved)
            except ModelError as exc:
                log.warning("estimator_state_unusable", error=str(exc))
        for row in self.store.profiles(list(self.state.jobs)):  # profiles newer than the saved estimator
            if not self.estimator.has_profile(row["job_id"], row["gpu_type"]):
                try:
                    self.estimator.add_profile(
                        row["job_id"],
                        row["gpu_type"],
                        time_profile(row["profile"]),
                        Calibration(**row["calibration"]),
                    )
                except (ModelError, TypeError) as exc:
                    log.warning("profile_unusable", job_id=row["job_id"], error=str(exc))
        for job in self.state.jobs.values():
            if job.state == JobState.PROFILING and not job.profiling:
                self._set(
                    job,
                    JobState.QUEUED if self.estimator.profiled_types(job.id) else JobState.FAILED,
                    "recovered",
                    "profiling run lost while the master was down",
                )
        log.info(
            "master_opened",
            epoch=self.epoch,
            live_jobs=len(self.state.jobs),
            open_attempts=len(self.state.attempts),
        )

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", error=repr(task.exception()))

    def with_estimator(self, update: Callable[[], None]) -> None:
        if self.deferred is not None:
            self.deferred.append(update)
        else:
            update()

    # -- jobs -------------------------------------------------------------------------------------------

    def _set(self, job: JobRecord, new: JobState, kind: str, message: str = "") -> None:
        now = self.clock()
        self.state.set_job_state(job, new, now, kind, message)
        log.info("job_state", job_id=job.id, state=new.value, kind=kind, message=message)
        if new not in LIVE:
            expected = self._expected_run_s(job)
            if expected:  # for RAQLR: the latency ratio of every job that ended
                self.ended_lr.append((now, (now - job.submitted) / expected))

    def _expected_run_s(self, job: JobRecord) -> float | None:
        rates = [
            r
            for n in self.state.nodes.values()
            if (
                r := self.estimator.per_gpu_rate(
                    job.spec, n.effective_server(), job.spec.requirements.minimum
                )
            )
        ]
        if not rates:
            return None
        return job.spec.total_samples / (max(rates) * job.spec.requirements.minimum)

    async def submit(self, who: Principal, sub: Submission) -> JobRecord:
        tenant = sub.tenant or who.tenant
        if not who.admin and tenant != who.tenant:
            raise RequestError(
                403, "tenant", f"user {who.user!r} of tenant {who.tenant!r} cannot submit to {tenant!r}"
            )
        quota = self.state.tenants.get(tenant)
        if quota is None:
            raise RequestError(
                422, "tenant", f"unknown tenant {tenant!r} (known: {', '.join(sorted(self.state.tenants))})"
            )
        try:
            requirements = RequirementSet.of(sub.gpus)
        except ModelError as exc:
            raise RequestError(400, "gpus", str(exc)) from exc
        total = self.state.total_gpus
        limit = min(total, quota.cap_gpus) if quota.cap_gpus is not None else total
        if requirements.minimum > limit:
            where = f"tenant {tenant!r} cap of {quota.cap_gpus}" if limit < total else f"cluster's {total}"
            raise RequestError(
                422,
                "gpus",
                f"the smallest GPU count asked for ({requirements.minimum}) exceeds the {where} GPUs",
            )
        if sub.samples is not None:
            samples = sub.samples
        else:
            assert sub.iterations is not None
            samples = JobSpec.samples_from_iterations(sub.iterations, sub.batch_size, requirements)
        now = self.clock()
        seq = self.job_seq + 1
        job_id = f"j-{seq:06d}"
        try:
            spec = JobSpec(
                id=job_id,
                requirements=requirements,
                total_samples=samples,
                batch_size=sub.batch_size,
                tenant=tenant,
                user=who.user,
                name=sub.name,
                params_bytes=sub.params * 4.0,
                submit_time=now,
                restart_s=10.0 + sub.params * 4.0 * 2 / 200e6,  # start-up + checkpoint write and read
            )
        except ModelError as exc:
            raise RequestError(400, None, str(exc)) from exc
        self.job_seq = seq
        job = JobRecord(
            spec=spec,
            seq=seq,
            name=sub.name,
            command=list(sub.command),
            env=dict(sub.env),
            workdir=sub.workdir,
            launcher=sub.launcher,
            state=JobState.PENDING,
            submitted=now,
            state_since=now,
        )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.submissions:
            asyncio.get_running_loop().call_later(0.002, self._store_submissions)
        self.submissions.append((job, f"by {who.user} ({tenant})", future))
        await future  # the job is stored (and visible) only once its transaction committed
        return job

    def _store_submissions(self) -> None:
        """Group commit: every submission of the last ~2 ms in one transaction (one fsync)."""
        batch, self.submissions = self.submissions, []
        try:
            with self.store.transaction():
                for job, message, _ in batch:
                    self.store.insert_job(job.to_row())
                    self.store.add_event(job.id, job.submitted, "submitted", JobState.PENDING.value, message)
                self.store.set_meta("job", str(max(job.seq for job, _, _ in batch)))
        except Exception as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for job, _, future in batch:
            self.state.jobs[job.id] = job
            log.info("job_submitted", job_id=job.id, tenant=job.tenant, user=job.spec.user)
            if not future.done():
                future.set_result(None)
        self.wake.set()

    def visible(self, who: Principal, job_id: str) -> dict[str, Any]:
        row = self.store.job(job_id)
        if row is None or (not who.admin and row["tenant"] != who.tenant):
            raise RequestError(404, "id", f"no job {job_id!r}")
        return row

    def cancel(self, who: Principal, job_id: str) -> None:
        self.visible(who, job_id)
        job = self.state.jobs.get(job_id)
        if job is None:
            row = self.store.job(job_id)
            raise RequestError(409, "id", f"job {job_id} already ended ({row['state'] if row else '?'})")
        attempts = [a for a in self.state.attempts.values() if a.job_id == job_id]
        with self.store.transaction():
            for a in attempts:
                a.stopping = True
                self.store.update_attempt(a.id, stopping=1)
            self._set(job, JobState.CANCELLED, "cancelled", f"by {who.user}")
        for a in attempts:
            self.spawn(self._stop_attempt(a, checkpoint=False, reason="cancelled"))

    # -- attempts ---------------------------------------------------------------------------------------

    def target(self, node_id: str) -> NodeTarget:
        node = self.state.nodes[node_id]
        return NodeTarget(node_id, node.workdir)

    async def _stop_attempt(self, attempt: AttemptRecord, *, checkpoint: bool, reason: str) -> None:
        """Checkpoint-and-stop (or stop) every part of an attempt; the primary part's exit ends it."""
        info = None
        error: str | None = None
        for index, (node_id, _) in enumerate(attempt.placement.parts):
            node = self.state.nodes[node_id]
            if not node.workdir or node.health == NodeHealth.LOST:
                continue
            try:
                if checkpoint and index == 0:
                    grace = self.settings.stop_grace_s
                    result = await self.executor.checkpoint(
                        self.target(node_id), attempt.id, self.epoch, grace, 10.0
                    )
                    faults.point("stop.after_command")  # test-only crash hook (hopsmgr.master.faults)
                else:
                    result = await self.executor.stop(self.target(node_id), attempt.id, self.epoch, 10.0)
            except ExecutorError as exc:
                error = str(exc)
                result = None
                self.node_error(node_id, exc)
            if index == 0:
                info = result
        if attempt.id not in self.state.attempts:
            return  # a heartbeat already reported its end
        if info is None and error is not None:
            log.warning("stop_failed", attempt_id=attempt.id, job_id=attempt.job_id, error=error)
        code = info.code if info else None
        self.end_attempt(
            attempt,
            reason=reason if info is not None or reason == "cancelled" else "stop_failed",
            code=code,
            checkpointed=bool(info and info.checkpointed),
            message=error or "",
        )

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
    ) -> None:
        """Record the end of an attempt once (later reports of it are ignored) and move its job on."""
        if self.state.remove_attempt(attempt.id) is None:
            return
        now = self.clock()
        job = self.state.jobs.get(attempt.job_id)
        if progress is not None:
            self._progress(attempt, progress)
        with self.store.transaction():
            self.store.update_attempt(
                attempt.id, ended=now, end_reason=reason, exit_code=code, log_tail=log_tail or message or None
            )
            if job is not None:
                self._account(job, attempt, now)
                if attempt.profiling:
                    self._end_profiling(job, attempt, reason, code, profile, log_tail or message)
                else:
                    self._end_run(job, attempt, reason, code, checkpointed, log_tail or message)
        log.info("attempt_ended", attempt_id=attempt.id, job_id=attempt.job_id, reason=reason, code=code)
        done = self.stop_done.pop(attempt.job_id, None)
        if done is not None:
            done.set()
        self.wake.set()

    def _account(self, job: JobRecord, attempt: AttemptRecord, now: float) -> None:
        if attempt.started is None or attempt.profiling:
            return
        ran = max(0.0, now - attempt.started)
        job.running_s += ran
        job.attained_gpu_s += ran * attempt.placement.gpus

    def _end_profiling(
        self,
        job: JobRecord,
        attempt: AttemptRecord,
        reason: str,
        code: int | None,
        profile: dict[str, float] | None,
        tail: str,
    ) -> None:
        job.profiling.discard(attempt.id)
        node = self.state.nodes[attempt.primary]
        failed = False
        if code == 0 and profile:
            try:
                tp = time_profile(profile)
            except ModelError as exc:
                failed, tail = True, f"profile.json is not usable: {exc}"
            else:
                server = node.effective_server()
                self.with_estimator(
                    lambda: self.estimator.add_profile(job.id, server.gpu_type, tp, server.calibration)
                )
                cal = {**calibration_json(server.calibration), "source": server.calibration.source}
                self.store.add_profile(job.id, server.gpu_type, profile, cal, self.clock())
                self.state.event(
                    job,
                    self.clock(),
                    "profiled",
                    f"on {node.id} ({node.server.gpu_type}): {profile.get('samples_per_s', 0):.2f} samples/s",
                )
        elif reason in ("exited", "launch_error"):
            failed = True
            if code == 0:
                tail = "it exited 0 without writing a profile: the command must use hopsmgr.runtime"
        if failed and job.state in (JobState.PENDING, JobState.PROFILING):
            how = "could not start" if reason == "launch_error" else f"failed (exit {code})"
            message = f"profiling run on {node.id} {how}: {tail[-1500:]}".strip()
            for other in list(job.profiling):
                self.state.attempts[other].stopping = True
            job.failures += 1
            self._set(job, JobState.FAILED, "failed", message)
            return
        if not job.profiling and job.state == JobState.PROFILING:
            profiled = self.estimator.profiled_types(job.id)
            why = (
                "profiled" if profiled else f"profiling run {attempt.id} on {node.id} {reason}: {tail[-300:]}"
            )
            self._set(job, JobState.QUEUED, "queued", why.strip())

    def _end_run(
        self,
        job: JobRecord,
        attempt: AttemptRecord,
        reason: str,
        code: int | None,
        checkpointed: bool,
        tail: str,
    ) -> None:
        if job.attempt != attempt.id:
            return  # not the job's current attempt (the unused half of a move): nothing to decide
        job.attempt = None
        if job.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED):
            return
        lost = reason in ("node_lost", "vanished", "launch_failed")
        if code == 0 and not lost:
            if job.state == JobState.LAUNCHING:
                self._set(job, JobState.RUNNING, "started", "finished before its launch was confirmed")
            job.done_samples = job.spec.total_samples
            self._set(job, JobState.COMPLETED, "completed", f"attempt {attempt.id} exited 0")
        elif checkpointed or attempt.stopping or lost or reason == "stop_failed":
            if checkpointed:
                job.has_checkpoint = True
            job.restarts += 1 if attempt.started is not None else 0
            if attempt.stopping:
                job.preemptions += 1
            if reason == "node_lost":
                job.node_losses += 1
            how = "checkpointed" if checkpointed else f"{reason} (exit {code})"
            if tail and not checkpointed:
                how += f": {tail[-300:]}"
            resume = "from its checkpoint" if job.has_checkpoint else "from the start"
            self._set(job, JobState.QUEUED, "requeued", f"attempt {attempt.id} {how}; resumes {resume}")
        else:
            job.failures += 1
            how = "could not start" if reason == "launch_error" else exit_text(code)
            tail = tail[-1500:].strip()
            message = f"attempt {attempt.id} {how}"
            self._set(job, JobState.FAILED, "failed", f"{message}: {tail}" if tail else message)

    def _progress(self, attempt: AttemptRecord, progress: Progress) -> None:
        job = self.state.jobs.get(attempt.job_id)
        attempt.progress = progress
        if job is None or attempt.profiling:
            return
        done = min(
            job.spec.total_samples, progress.iteration * job.spec.batch_size * job.spec.requirements.minimum
        )
        if done != job.done_samples:
            job.done_samples = done
            job.dirty = True
        now = self.clock()
        if progress.samples_per_s > 0 and progress.mode == "run" and now - attempt.last_observed >= 10.0:
            attempt.last_observed = now
            servers = {sid: self.state.nodes[sid].effective_server() for sid in attempt.placement.servers}
            placement, rate, spec = attempt.placement, progress.samples_per_s, job.spec
            self.with_estimator(lambda: self.estimator.observe(spec.id, placement, servers, rate, job=spec))
            self.throughput.append((job.id, now, placement.as_dict(), rate))  # written by flush()
            if progress.td_s > 0:
                gpu_type = self.state.nodes[attempt.primary].server.gpu_type
                td, tw = progress.td_s, progress.tw_s
                self.with_estimator(lambda: self.estimator.observe_data_time(spec.id, gpu_type, td, tw))

    # -- heartbeats and node health ------------------------------------------------------------------------

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

    def flush(self) -> None:
        """Write buffered progress and throughput history in one transaction (called about every second)."""
        rows, self.throughput = self.throughput, []
        dirty = [j for j in self.state.jobs.values() if j.dirty]
        if not rows and not dirty:
            return
        with self.store.transaction():
            for job_id, time_, placement, rate in rows:
                self.store.add_throughput(job_id, time_, placement, rate)
            self.state.flush_progress()

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
