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
from hopsmgr.master.errors import RequestError
from hopsmgr.master.executor import Executor, ExecutorError, NodeTarget
from hopsmgr.master.heartbeats import NodeTracking
from hopsmgr.master.state import (
    AttemptRecord,
    JobRecord,
    MasterState,
    NodeHealth,
    calibration_json,
    time_profile,
)
from hopsmgr.master.store import Store
from hopsmgr.protocol import Progress, Submission

log = structlog.get_logger("hopsmgr.master")


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


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: str
    admin: bool = False
    agent: bool = False


class Controller(NodeTracking):
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
