"""The round loop: snapshot -> plan (off the event loop) -> persist intended attempts -> act.

Every `round_seconds` a first plan re-plans the whole usable cluster; between rounds, when GPUs free up
or jobs arrive, a fragment plan places queued work on idle GPUs only (HOPS.md 6). Profiling runs for new
jobs are chosen first, on idle GPUs (and, for a job that has waited a whole round, on GPUs the plan
then takes back). Each action is written to the store before any command goes to a node: attempts are
inserted with their ids and the jobs move to LAUNCHING / CHECKPOINTING in the same transaction. Stops run
first; a launch waits for the stops that free its GPUs.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import structlog

from hopsmgr import nodecontract
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ClusterSnapshot, Config, JobSpec
from hopsmgr.core.planner import Plan, PlanKind, ProfilingRun, profiling_runs
from hopsmgr.core.reconcile import Action, CheckpointStop, Launch, ReconcileError, reconcile
from hopsmgr.master import checkpoints, faults
from hopsmgr.master.controller import Controller
from hopsmgr.master.executor import ExecutorError, LaunchOrder
from hopsmgr.master.state import AttemptRecord, JobRecord, NodeHealth, build_snapshot
from hopsmgr.policies.base import HopsPolicy, Policy

log = structlog.get_logger("hopsmgr.master")
_PROFILE_KEY = "~profile~"
ACTION_CHUNK = 200


def rendezvous_port(attempt_id: str) -> int:
    """A port for the attempt's torchrun rendezvous on its first server (stable per attempt)."""
    return 29400 + int(hashlib.sha256(attempt_id.encode()).hexdigest(), 16) % 2000


def torchrun_argv(
    command: list[str], nnodes: int, rank: int, gpus: int, endpoint: str, run_id: str
) -> list[str]:
    """One torchrun per server: the job's command becomes its training script and arguments (a leading
    python interpreter is dropped: torchrun starts the script with its own)."""
    if command and command[0].rsplit("/", 1)[-1].startswith("python") and len(command) > 1:
        command = command[1:]
    return [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--node_rank={rank}",
        f"--nproc_per_node={gpus}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={run_id}",
        *command,
    ]


def _within_budget(runs: list[ProfilingRun], budget: int, at_least_one: bool = False) -> list[ProfilingRun]:
    """The runs of whole jobs, in order, while they fit `budget` GPUs (one GPU a run); with
    `at_least_one`, the first job's runs even when they do not fit."""
    per_job = Counter(r.job_id for r in runs)
    kept: list[ProfilingRun] = []
    started: set[str] = set()
    for r in runs:
        if r.job_id not in started:
            if len(kept) + per_job[r.job_id] > budget and not (at_least_one and not kept):
                break
            started.add(r.job_id)
        kept.append(r)
    return kept


class RoundLoop:
    def __init__(self, ctl: Controller, policy: Policy | None = None) -> None:
        self.ctl = ctl
        self.policy: Policy = policy or HopsPolicy(ctl.config.scheduler)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="planner")
        self.lock = asyncio.Lock()
        self.round_s: list[float] = []
        self.solve_s: list[float] = []
        self.rounds = 0
        self.last: dict[str, Any] = {}

    async def run(self) -> None:
        """First plans every round_seconds; fragment plans when woken in between."""
        interval = self.ctl.config.scheduler.round_seconds
        next_first = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_first:
                next_first = now + interval
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
            await self._safe_round("fragment" if self.policy.fragment_plans else "first")

    async def _safe_round(self, kind: PlanKind) -> None:
        """A round that fails (a bug) is logged and skipped; the next one starts from fresh state."""
        try:
            await self.round(kind)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("round_failed", kind=kind, error=repr(exc))
            await asyncio.sleep(1.0)

    async def health(self) -> None:
        while True:
            self.ctl.check_health()
            self.ctl.flush()
            await asyncio.sleep(min(1.0, self.ctl.settings.heartbeat_interval_s / 2))

    async def round(self, kind: PlanKind) -> Plan:
        async with self.lock:
            return await self._round(kind)

    async def _round(self, kind: PlanKind) -> Plan:
        ctl = self.ctl
        t0 = time.perf_counter()
        ctl.wake.clear()  # events from here on wake the next plan (none is lost while this one runs)
        now = ctl.clock()
        snapshot, to_profile, _ = build_snapshot(ctl.state, now)
        # A new job that found no idle GPU for a whole round may take one from running work.
        round_s = ctl.config.scheduler.round_seconds
        waited = {
            j.id
            for j in to_profile
            if now - j.submit_time >= round_s
            and (ctl.state.jobs[j.id].state == JobState.PENDING or not ctl.estimator.profiled_types(j.id))
        }
        ctl.deferred = []
        try:
            plan, runs = await asyncio.get_running_loop().run_in_executor(
                self.pool, self._plan, snapshot, to_profile, waited, kind, self._profiling_budget()
            )
        finally:
            deferred, ctl.deferred = ctl.deferred, None
            for update in deferred:
                update()
        ctl.plans[kind] = plan
        if kind == "first":
            ctl.plans["fragment"] = plan
        launches, stops = await self._act(plan, runs, snapshot, kind)
        queued = [j for j in plan.order if j in ctl.state.jobs and ctl.state.jobs[j].state == JobState.QUEUED]
        ctl.positions = {j: i + 1 for i, j in enumerate(queued)}
        elapsed = time.perf_counter() - t0
        self.round_s.append(elapsed)
        self.solve_s.append(plan.stats.total_s)
        del self.round_s[:-1000], self.solve_s[:-1000]
        self.rounds += 1
        record = {
            "time": now,
            "kind": kind,
            "duration_s": elapsed,
            "solve_s": plan.stats.total_s,
            "method": plan.stats.method,
            "proven": int(plan.stats.proven),
            "launches": launches,
            "stops": stops,
            "queued": sum(1 for j in ctl.state.jobs.values() if j.state == JobState.QUEUED),
            "running": sum(1 for j in ctl.state.jobs.values() if j.state == JobState.RUNNING),
            "idle_gpus": plan.idle_gpus,
        }
        self.last = record
        if kind == "first" or launches or stops:
            with ctl.store.transaction():
                ctl.store.add_round(record)
                if kind == "first":
                    ctl.store.save_estimator(ctl.estimator.export_state(), now)
        return plan

    def _plan(
        self,
        snapshot: ClusterSnapshot,
        to_profile: list[JobSpec],
        waited: set[str],
        kind: PlanKind,
        budget: int,
    ) -> tuple[Plan, list[ProfilingRun]]:
        """Runs in the planner thread on an immutable snapshot (estimator updates are held meanwhile)."""
        est = self.ctl.estimator
        held: dict[str, int] = {}
        for view in snapshot.jobs:
            for sid, g in view.current.parts if view.current else ():
                held[sid] = held.get(sid, 0) + g
        runs = _within_budget(profiling_runs(to_profile, snapshot, est, held), budget)
        if kind == "first":
            have = {r.job_id for r in runs}
            starving = [j for j in to_profile if j.id in waited and j.id not in have]
            taken: dict[str, int] = {}
            for r in runs:
                taken[r.server_id] = taken.get(r.server_id, 0) + 1
            if starving:  # at least one job a round, whatever the budget: new work always gets profiled
                extra = profiling_runs(starving, snapshot, est, taken)
                runs += _within_budget(extra, budget - len(runs), at_least_one=True)
        profiled = {r.job_id for r in runs}
        capacity = dict(snapshot.capacity)
        for r in runs:
            capacity[r.server_id] -= 1
        views = tuple(v for v in snapshot.jobs if v.id not in profiled or v.current is not None)
        reduced = replace(snapshot, capacity=capacity, jobs=views)
        if not views:
            return Plan(kind, snapshot.now, {}), runs
        return self.policy.plan(reduced, est, kind, time.perf_counter), runs

    async def _act(
        self, plan: Plan, runs: list[ProfilingRun], snapshot: ClusterSnapshot, kind: PlanKind
    ) -> tuple[int, int]:
        ctl = self.ctl
        state = ctl.state
        current: dict[str, Config] = {}
        for job in state.jobs.values():
            if job.attempt is not None and job.state in (JobState.RUNNING, JobState.LAUNCHING):
                attempt = state.attempts[job.attempt]
                if not attempt.stopping:
                    current[job.id] = attempt.placement
        wanted = (JobState.QUEUED, JobState.RUNNING, JobState.LAUNCHING)
        desired = {
            j: c
            for j, c in plan.assignments.items()
            if j in state.jobs and state.jobs[j].state in wanted and not state.jobs[j].profiling
        }
        if kind == "fragment":
            desired = {**current, **{j: c for j, c in desired.items() if j not in current}}
        for r in runs:
            pending = state.jobs.get(r.job_id)
            if (
                pending is not None
                and pending.state in (JobState.PENDING, JobState.QUEUED)
                and r.job_id not in desired
            ):
                desired[f"{r.job_id}{_PROFILE_KEY}{r.gpu_type}"] = Config.single(r.server_id, 1)
        capacity = dict(snapshot.capacity)
        try:
            actions = reconcile(
                current, desired, capacity, frozenset(j.id for j in state.jobs.values() if j.has_checkpoint)
            )
        except ReconcileError as exc:  # state moved while planning: skip this plan, the next one repairs
            log.warning("plan_skipped", error=str(exc))
            return 0, 0
        launches = stops = 0
        # Persist then act, a chunk at a time, yielding in between: thousands of launches must not hold
        # the event loop (heartbeats and API calls keep being served while a big plan is applied).
        for start in range(0, len(actions), ACTION_CHUNK):
            chunk_stops, chunk_launches = self._persist(actions[start : start + ACTION_CHUNK])
            faults.point("launch.after_store" if chunk_launches else "")  # test-only crash hooks
            faults.point("stop.after_store" if chunk_stops else "")
            for attempt in chunk_stops:
                ctl.spawn(ctl._stop_attempt(attempt, checkpoint=True, reason="preempted"))
            for action, attempt in chunk_launches:
                ctl.spawn(self._launch(action, attempt))
            stops += len(chunk_stops)
            launches += len(chunk_launches)
            await asyncio.sleep(0)
        return launches, stops

    def _persist(
        self, actions: list[Action]
    ) -> tuple[list[AttemptRecord], list[tuple[Launch, AttemptRecord]]]:
        """One transaction for a chunk of actions; actions that state changes made moot are skipped."""
        ctl = self.ctl
        state = ctl.state
        stops: list[AttemptRecord] = []
        launches: list[tuple[Launch, AttemptRecord]] = []
        now = ctl.clock()
        faults.point("launch.before_store")  # test-only crash hook (hopsmgr.master.faults)
        with ctl.store.transaction():
            for action in actions:
                if isinstance(action, CheckpointStop):
                    job = state.jobs.get(action.job_id)
                    attempt = state.attempts.get(job.attempt or "") if job is not None else None
                    if job is None or attempt is None or attempt.stopping:
                        continue
                    attempt.stopping = True
                    ctl.store.update_attempt(attempt.id, stopping=1)
                    ctl.stop_done[job.id] = asyncio.Event()
                    ctl.state.set_job_state(
                        job,
                        JobState.CHECKPOINTING,
                        now,
                        action.reason,
                        f"checkpoint-and-stop of {attempt.id} on {attempt.placement}",
                    )
                    stops.append(attempt)
                elif self._still_wanted(action):
                    launches.append((action, self._new_attempt(action, now)))
        return stops, launches

    def _still_wanted(self, action: Launch) -> bool:
        job = self.ctl.state.jobs.get(action.job_id.split(_PROFILE_KEY)[0])
        if job is None:
            return False
        if _PROFILE_KEY in action.job_id:
            # PROFILING too: the job's other runs of this plan (one per GPU type) made it so
            return (
                job.state in (JobState.PENDING, JobState.PROFILING, JobState.QUEUED) and job.attempt is None
            )
        return job.state == JobState.CHECKPOINTING or (job.state == JobState.QUEUED and job.attempt is None)

    def _new_attempt(self, action: Launch, now: float) -> AttemptRecord:
        ctl = self.ctl
        profiling = _PROFILE_KEY in action.job_id
        job_id = action.job_id.split(_PROFILE_KEY)[0]
        job = ctl.state.jobs[job_id]
        seq = ctl.store.next_seq("attempt")
        devices: dict[str, list[int]] = {}
        for sid, g in action.config.parts:
            used = ctl.state.devices_used.get(sid, set())
            devices[sid] = [d for d in range(ctl.state.nodes[sid].server.gpus) if d not in used][:g]
        attempt = AttemptRecord(
            id=f"a-{seq:06d}",
            seq=seq,
            job_id=job_id,
            placement=action.config,
            profiling=profiling,
            epoch=ctl.epoch,
            created=now,
            devices=devices,
            resume=action.resume,
            base_samples=job.done_samples,
        )
        ctl.store.insert_attempt(attempt.to_row())
        ctl.state.add_attempt(attempt)
        if profiling:
            job.profiling.add(attempt.id)
            if job.state == JobState.PENDING:
                ctl.state.set_job_state(
                    job, JobState.PROFILING, now, "profiling", f"{attempt.id} on {action.config}"
                )
            else:
                ctl.state.event(job, now, "profiling", f"{attempt.id} on {action.config}")
        elif job.state == JobState.CHECKPOINTING:
            # a move: the new attempt holds its GPUs now; the job launches once its checkpoint is written
            ctl.state.event(job, now, "moving", f"{attempt.id} on {action.config} after its checkpoint")
        else:
            job.attempt = attempt.id
            ctl.state.set_job_state(
                job, JobState.LAUNCHING, now, "launching", f"{attempt.id} on {action.config}"
            )
        return attempt

    async def _bring_checkpoint(self, job: JobRecord, attempt: AttemptRecord) -> None:
        """Without a shared filesystem: copy the job's latest verified checkpoint from the node of its
        last run to every node of the new placement (each rank resumes from its own node's copy)."""
        ctl = self.ctl
        previous = [
            a
            for a in ctl.store.attempts(job.id)
            if not a["profiling"] and a["started"] is not None and a["id"] != attempt.id
        ]
        if not previous:
            return
        source = next(iter(previous[-1]["placement"]))
        if source not in ctl.state.nodes or ctl.state.nodes[source].health == NodeHealth.LOST:
            ctl.state.event(
                job,
                ctl.clock(),
                "checkpoint_not_moved",
                f"{source} is gone: resumes from what the new nodes hold",
            )
            return
        for node_id in attempt.placement.servers:
            if node_id == source:
                continue
            try:
                moved = await checkpoints.move_latest(
                    ctl.executor,
                    ctl.target(source),
                    ctl.target(node_id),
                    job.id,
                    spool_dir=ctl.checkpoint_root or None,
                )
            except ExecutorError as exc:
                if exc.kind != "failed":
                    raise  # the launch fails and the job is requeued: the checkpoint's node may come back
                ctl.state.event(
                    job, ctl.clock(), "checkpoint_not_moved", f"{source} -> {node_id}: {exc.message}"
                )
                continue
            ctl.state.event(
                job,
                ctl.clock(),
                "checkpoint_moved",
                f"{moved.file} {source} -> {node_id}: {moved.bytes} B in {moved.seconds:.1f} s",
            )

    def _profiling_budget(self) -> int:
        """[ours] GPUs profiling runs may take now: a quarter of the cluster (and at least one job's runs,
        one per GPU type), so a burst of new jobs cannot keep queued work off the GPUs."""
        state = self.ctl.state
        running = sum(a.placement.gpus for a in state.attempts.values() if a.profiling)
        types = len({n.server.gpu_type for n in state.nodes.values()})
        return max(0, max(types, state.total_gpus // 4) - running)

    async def _launch(self, action: Launch, attempt: AttemptRecord) -> None:
        ctl = self.ctl
        for dep in action.after:
            done = ctl.stop_done.get(dep)
            if done is not None:
                await done.wait()
        job = ctl.state.jobs.get(attempt.job_id)
        if job is None or attempt.id not in ctl.state.attempts:
            if attempt.id in ctl.state.attempts:
                ctl.end_attempt(attempt, reason="cancelled")
            return
        if not attempt.profiling and job.attempt != attempt.id:  # the second half of a move
            if job.state != JobState.QUEUED or job.attempt is not None:
                ctl.end_attempt(attempt, reason="not_needed", message=f"job is {job.state.value}")
                return
            job.attempt = attempt.id
            ctl.state.set_job_state(
                job, JobState.LAUNCHING, ctl.clock(), "launching", f"{attempt.id} on {attempt.placement}"
            )
        parts = attempt.placement.parts
        shared = ctl.config.master.checkpoint_shared
        try:
            if not shared and attempt.resume and not attempt.profiling:
                await self._bring_checkpoint(job, attempt)
            for rank, (node_id, gpus) in enumerate(parts):
                node = ctl.state.nodes[node_id]
                if not node.workdir:
                    raise ExecutorError(
                        "unreachable", f"node {node_id} has not reported a work directory yet"
                    )
                rendezvous = f"{ctl.config.node_access(parts[0][0]).address}:{rendezvous_port(attempt.id)}"
                env = {
                    **job.env,
                    nodecontract.NODE_RANK: str(rank),
                    nodecontract.NNODES: str(len(parts)),
                    nodecontract.WORLD_GPUS: str(attempt.placement.gpus),
                    nodecontract.BASE_GPUS: str(job.spec.requirements.minimum),
                    # linear learning-rate scaling for elastic jobs: GPUs given over the smallest count
                    nodecontract.LR_SCALE: repr(attempt.placement.gpus / job.spec.requirements.minimum),
                    nodecontract.RESUME: "1" if attempt.resume else "0",
                    nodecontract.RDZV_ENDPOINT: rendezvous,
                }
                argv = list(job.command)
                if job.launcher == "torchrun" and not attempt.profiling:
                    argv = torchrun_argv(argv, len(parts), rank, gpus, rendezvous, attempt.id)
                cal = node.calibration
                order = LaunchOrder(
                    attempt=attempt.id,
                    job=job.id,
                    epoch=ctl.epoch,
                    argv=argv,
                    mode="profile" if attempt.profiling else "run",
                    gpus=gpus,
                    visible_devices=attempt.devices.get(node_id, []),
                    env=env,
                    cwd=job.workdir,
                    # shared: one directory on the shared filesystem; else the node's own (the default)
                    checkpoint_dir=f"{ctl.checkpoint_root}/{job.id}"
                    if shared and ctl.checkpoint_root
                    else "",
                    profile_iters=ctl.config.scheduler.profiling_iterations,
                    emulated_speed=cal.compute_factor
                    if cal is not None and node.device_mode == "emulated"
                    else None,
                )
                await ctl.executor.launch(ctl.target(node_id), order)
                faults.point("launch.after_command" if rank == 0 else "")  # test-only crash hook
        except ExecutorError as exc:
            log.warning("launch_failed", attempt_id=attempt.id, job_id=attempt.job_id, error=str(exc))
            for node_id in attempt.placement.servers:
                if node_id in str(exc) or len(attempt.placement.parts) == 1:
                    ctl.node_error(node_id, exc)
            # "failed": the node ran the wrapper and it could not start the command (the job's fault);
            # anything else is the node's (unreachable, refused): the job goes back to the queue.
            reason = "launch_error" if exc.kind == "failed" else "launch_failed"
            ctl.end_attempt(attempt, reason=reason, message=str(exc))
            return
        if attempt.id not in ctl.state.attempts:
            return  # it already ended (a very short job, reported by a heartbeat)
        now = ctl.clock()
        attempt.launched = True
        attempt.started = attempt.started or now
        ctl.commit_soon()
        with (
            ctl.store.grouped()
        ):  # a record of what happened: a crash before the commit is repaired by adoption
            ctl.store.update_attempt(attempt.id, started=attempt.started)
            job = ctl.state.jobs.get(attempt.job_id)
            if job is not None and not attempt.profiling and job.state == JobState.LAUNCHING:
                ctl.state.set_job_state(
                    job, JobState.RUNNING, now, "started", f"{attempt.id} on {attempt.placement}"
                )
