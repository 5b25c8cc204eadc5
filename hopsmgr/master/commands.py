"""Carrying out the state machine's node commands with the executor (SSH or local), one task each.

A launch starts one wrapper per server of the placement (torchrun per server for torchrun jobs; the
job's latest checkpoint copied to the new nodes first when there is no shared filesystem), then tells
the machine `AttemptStarted`, or `AttemptLaunchFailed` (the job's fault when the wrapper ran and the
command could not start, the node's otherwise). A checkpoint-and-stop or stop asks every part of the
attempt; the primary part's answer ends it (`AttemptEnded`), unless a heartbeat reported the end first.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from functools import partial

import structlog

from hopsmgr import nodecontract as nc
from hopsmgr.control.commands import CheckpointAndStop, Command, LaunchAttempt, StartProfiling, StopAttempt
from hopsmgr.control.events import AttemptEnded, AttemptLaunchFailed, AttemptStarted
from hopsmgr.control.records import Attempt, NodeHealth
from hopsmgr.master import checkpoints, faults
from hopsmgr.master.controller import Controller
from hopsmgr.master.executor import ExecutorError, LaunchOrder
from hopsmgr.master.heartbeats import node_error
from hopsmgr.master.store import Store
from hopsmgr.runtime.balance import format_shares

log = structlog.get_logger("hopsmgr.master")


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


# Node commands started per turn of the event loop. A plan may launch a thousand attempts at once; a
# task each, all started in one turn, would run their first steps before the loop next reads its
# sockets, and hold up every heartbeat and API call behind them as one long callback would.
COMMANDS_PER_TURN = 32


def attach(ctl: Controller) -> None:
    """Let the controller hand every node command to a task of its own, started in order, at most
    COMMANDS_PER_TURN per turn of the event loop."""
    outbox: deque[Command] = deque()
    starting: list[asyncio.Task[None]] = []

    def start(command: Command) -> None:
        if isinstance(command, LaunchAttempt | StartProfiling):
            ctl.spawn(launch(ctl, command))
        elif isinstance(command, CheckpointAndStop):
            ctl.spawn(stop(ctl, command, checkpoint=True))
        elif isinstance(command, StopAttempt):
            ctl.spawn(stop(ctl, command, checkpoint=False))

    async def start_all() -> None:
        try:
            while outbox:
                for _ in range(min(COMMANDS_PER_TURN, len(outbox))):
                    start(outbox.popleft())
                await asyncio.sleep(0)
        finally:
            starting.clear()

    def on_command(command: Command) -> None:
        outbox.append(command)
        if not starting:
            starting.append(ctl.spawn(start_all()))

    ctl.on_command = on_command


async def stop(ctl: Controller, command: CheckpointAndStop | StopAttempt, *, checkpoint: bool) -> None:
    """Checkpoint-and-stop (or stop) every part of an attempt; the primary part's exit ends it."""
    attempt = ctl.machine.state.attempts.get(command.attempt_id)
    if attempt is None:
        return
    info = None
    error: str | None = None
    for index, (node_id, _) in enumerate(attempt.placement.parts):
        node = ctl.nodes[node_id]
        if not node.workdir or node.health == NodeHealth.LOST:
            continue
        try:
            if checkpoint and index == 0:
                grace = ctl.settings.stop_grace_s
                payload = ctl.payloads.get(attempt.job_id)
                signal_name = "SIGUSR1"
                if payload is not None and payload.checkpoint_signal:  # a job without the runtime
                    signal_name = payload.checkpoint_signal
                    grace = payload.grace_s if payload.grace_s is not None else grace
                result = await ctl.executor.checkpoint(
                    ctl.target(node_id), attempt.id, ctl.epoch, grace, 10.0, signal_name
                )
                faults.point("stop.after_command")  # test-only crash hook (hopsmgr.master.faults)
            else:
                result = await ctl.executor.stop(ctl.target(node_id), attempt.id, ctl.epoch, 10.0)
        except ExecutorError as exc:
            error = str(exc)
            result = None
            node_error(ctl, node_id, exc)
        if index == 0:
            info = result
    if attempt.id not in ctl.machine.state.attempts:
        return  # a heartbeat already reported its end
    if info is None and error is not None:
        log.warning("stop_failed", attempt_id=attempt.id, job_id=attempt.job_id, error=error)
    cancelled = isinstance(command, StopAttempt)
    reason = "exited" if info is not None else ("cancelled" if cancelled else "stop_failed")
    ctl.feed(
        AttemptEnded(
            command.stimulus_id,
            attempt.id,
            reason,  # type: ignore[arg-type]
            info.code if info else None,
            bool(info and info.checkpointed),
            log_tail=error or "",
        )
    )


async def launch(ctl: Controller, command: LaunchAttempt | StartProfiling) -> None:
    attempt = ctl.machine.state.attempts.get(command.attempt_id)
    job = ctl.machine.state.jobs.get(command.job_id)
    payload = ctl.payloads.get(command.job_id)
    if attempt is None or job is None or payload is None:
        return
    parts = attempt.placement.parts
    shared = ctl.config.master.checkpoint_shared
    profiling = isinstance(command, StartProfiling)
    try:
        if not shared and attempt.resume and not profiling:
            await bring_checkpoint(ctl, attempt)
        for rank, (node_id, gpus) in enumerate(parts):
            node = ctl.nodes[node_id]
            if not node.workdir:
                raise ExecutorError("unreachable", f"node {node_id} has not reported a work directory yet")
            rendezvous = f"{ctl.config.node_access(parts[0][0]).address}:{rendezvous_port(attempt.id)}"
            env = {
                **payload.env,
                nc.NODE_RANK: str(rank),
                nc.NNODES: str(len(parts)),
                nc.WORLD_GPUS: str(attempt.placement.gpus),
                nc.BASE_GPUS: str(job.spec.requirements.minimum),
                # linear learning-rate scaling for elastic jobs: GPUs given over the smallest count
                nc.LR_SCALE: repr(attempt.placement.gpus / job.spec.requirements.minimum),
                nc.RESUME: "1" if attempt.resume else "0",
                nc.RDZV_ENDPOINT: rendezvous,
            }
            # a node whose slots are not GPUs (devices "cpu" or "emulated") grants none: CUDA is asked
            # to show none, so a job there does not take a real GPU of the machine (slot 0 as GPU 0)
            slots_only = node.device_mode in ("cpu", "emulated")
            if slots_only:
                env[nc.VISIBLE_DEVICES] = ""
            if isinstance(command, LaunchAttempt) and command.shares:
                env[nc.RANK_SHARES] = format_shares(command.shares)
                env[nc.FIRST_RANK] = str(sum(g for _, g in parts[:rank]))
            argv = list(payload.command)
            if payload.launcher == "torchrun" and not profiling:
                argv = torchrun_argv(argv, len(parts), rank, gpus, rendezvous, attempt.id)
            cal = node.calibration
            order = LaunchOrder(
                attempt=attempt.id,
                job=job.id,
                epoch=ctl.epoch,
                argv=argv,
                mode="profile" if profiling else "run",
                gpus=gpus,
                visible_devices=[] if slots_only else list(attempt.devices.get(node_id, ())),
                env=env,
                cwd=payload.workdir,
                # shared: one directory on the shared filesystem; else the node's own (the default)
                checkpoint_dir=f"{ctl.checkpoint_root}/{job.id}" if shared and ctl.checkpoint_root else "",
                profile_iters=ctl.config.scheduler.profiling_iterations,
                emulated_speed=cal.compute_factor
                if cal is not None and node.device_mode == "emulated"
                else None,
                run_as=payload.run_as,
                mem_mb=payload.mem_mb,
                cpus=payload.cpus,
                block_sigusr1=payload.checkpoint_signal != "SIGUSR1",
            )
            await ctl.executor.launch(ctl.target(node_id), order)
            faults.point("launch.after_command" if rank == 0 else "")  # test-only crash hook
    except ExecutorError as exc:
        log.warning("launch_failed", attempt_id=attempt.id, job_id=attempt.job_id, error=str(exc))
        for node_id in attempt.placement.servers:
            if node_id in str(exc) or len(attempt.placement.parts) == 1:
                node_error(ctl, node_id, exc)
        # "failed": the node ran the wrapper and it could not start the command (the job's fault);
        # anything else is the node's (unreachable, refused): the job goes back to the queue.
        ctl.feed(AttemptLaunchFailed(command.stimulus_id, attempt.id, exc.kind == "failed", str(exc)))
        return
    # a record of what happened: a crash before it is written is repaired by adoption
    ctl.feed(AttemptStarted(command.stimulus_id, attempt.id))


async def bring_checkpoint(ctl: Controller, attempt: Attempt) -> None:
    """Without a shared filesystem: copy the job's latest verified checkpoint from the node of its
    last run to every node of the new placement (each rank resumes from its own node's copy)."""
    job_id = attempt.job_id
    previous = [
        a
        for a in ctl.store.attempts(job_id)
        if not a["profiling"] and a["started"] is not None and a["id"] != attempt.id
    ]
    if not previous:
        return
    source = next(iter(previous[-1]["placement"]))

    def note(kind: str, message: str) -> None:
        job = ctl.machine.state.jobs.get(job_id)
        state = job.state.value if job else None
        ctl.store_ops(
            [
                partial(
                    Store.add_event, job_id=job_id, time=ctl.clock(), kind=kind, state=state, message=message
                )
            ]
        )

    if source not in ctl.nodes or ctl.nodes[source].health == NodeHealth.LOST:
        note("checkpoint_not_moved", f"{source} is gone: resumes from what the new nodes hold")
        return
    for node_id in attempt.placement.servers:
        if node_id == source:
            continue
        try:
            moved = await checkpoints.move_latest(
                ctl.executor,
                ctl.target(source),
                ctl.target(node_id),
                job_id,
                spool_dir=ctl.checkpoint_root or None,
            )
        except ExecutorError as exc:
            if exc.kind != "failed":
                raise  # the launch fails and the job is requeued: the checkpoint's node may come back
            note("checkpoint_not_moved", f"{source} -> {node_id}: {exc.message}")
            continue
        note(
            "checkpoint_moved",
            f"{moved.file} {source} -> {node_id}: {moved.bytes} B in {moved.seconds:.1f} s",
        )
