"""Node decisions of the scheduler state machine: heartbeats, health by heartbeat age, drains, what a
node reports running (adoption, stops to resend, vanished attempts), and state restored at start.

Functions of the machine (hopsmgr.control.machine dispatches node events to them), which they see as
a `MachineCore` (hopsmgr.control.context).
"""

from __future__ import annotations

import math

from hopsmgr.control import limits
from hopsmgr.control.commands import CheckpointAndStop, NodeReply, Reply
from hopsmgr.control.context import MachineCore
from hopsmgr.control.events import (
    AttemptProgressed,
    HealthTick,
    NodeBeat,
    NodeChanged,
    NodeCommandFailed,
    NodeDrained,
    NodeReported,
    StateRestored,
)
from hopsmgr.control.records import Attempt, Job, NodeHealth
from hopsmgr.core.fairshare import TenantUsage
from hopsmgr.core.lifecycle import JobState


def on_beat(m: MachineCore, event: NodeBeat) -> None:
    node = m.state.nodes.get(event.node_id)
    if node is None:
        m.emit(Reply(m.stimulus, None, "node", f"node {event.node_id!r} is not in this cluster", 404))
        return
    woke = node.health != NodeHealth.HEALTHY and event.healthy
    node.health = NodeHealth.HEALTHY if event.healthy else NodeHealth.SUSPECT
    node.last_beat = m.now
    if event.server is not None:
        node.server = event.server
    if event.usable_gpus is not None:
        node.usable_gpus = min(node.server.gpus, event.usable_gpus)
    if woke:
        m.fragment_soon()


def on_command_failed(m: MachineCore, event: NodeCommandFailed) -> None:
    node = m.state.nodes.get(event.node_id)
    if node is not None:
        node.exec_error_at = m.now


def on_drained(m: MachineCore, event: NodeDrained) -> None:
    node = m.state.nodes.get(event.node_id)
    if node is None:
        m.emit(Reply(m.stimulus, None, "node", f"no node {event.node_id!r}", 404))
        return
    node.drained = event.drained
    m.emit(Reply(m.stimulus))
    if not event.drained:
        m.fragment_soon()


def on_health(m: MachineCore, event: HealthTick) -> None:
    """HEALTHY -> SUSPECT -> LOST by heartbeat age; a LOST node's attempts end and their jobs requeue."""
    s = m.settings
    grace_over = m.now - m.started > s.lost_after_s
    for node in m.state.nodes.values():
        since = m.now - (node.last_beat if node.last_beat is not None else m.started)
        if since > s.lost_after_s and grace_over:
            node.health = NodeHealth.LOST
            for attempt in m.state.attempts_on(node.server.id):
                m.end_attempt(attempt, reason="node_lost", message=f"node {node.server.id} lost")
        elif since > s.suspect_after_s and node.health == NodeHealth.HEALTHY:
            node.health = NodeHealth.SUSPECT
    limits.enforce_limits(m)


def on_node_changed(m: MachineCore, event: NodeChanged) -> None:
    node = m.state.nodes.get(event.node_id)
    if node is not None:
        node.server = event.server
        if event.usable_gpus is not None:
            node.usable_gpus = min(node.server.gpus, event.usable_gpus)


def on_reported(m: MachineCore, event: NodeReported) -> None:
    """A heartbeat's list of running attempts: adopt what this machine had not seen start, resend
    stops stored before a restart and never carried out, follow progress, and end attempts the
    node no longer runs (after three beats, or at once after a restart for unconfirmed launches)."""
    state = m.state
    stop: list[str] = []
    reported = set(event.finished)
    for run in event.running:
        reported.add(run.attempt_id)
        attempt = state.attempts.get(run.attempt_id)
        if attempt is None or (attempt.stopping and attempt.job_id not in state.jobs):
            stop.append(run.attempt_id)
            continue
        if attempt.started is None:
            adopt(m, attempt)
        if attempt.stopping and not attempt.stop_sent and event.node_id == attempt.primary:
            attempt.stop_sent = True
            job = state.jobs.get(attempt.job_id)
            if job is not None:
                m.emit(CheckpointAndStop(m.stimulus, attempt.id, job.id, attempt.placement, "preempted"))
        attempt.unseen_beats = 0
        job = state.jobs.get(attempt.job_id)
        if run.iteration is not None and event.node_id == attempt.primary and job is not None:
            spec = job.spec
            done = run.iteration * spec.batch_size * spec.requirements.minimum
            # [ours] the rate in samples of the job's work, from the iteration time: an iteration on G
            # GPUs processes batch x G samples (the per-GPU batch stays fixed, HOPS.md section 1), as
            # the estimator predicts; an older runtime counted each iteration as batch x R1. The
            # samples a script passes to rt.step are its own rank's (G times fewer); a runtime that
            # reports no iteration time is taken at its word.
            gpus = attempt.placement.gpus if run.work_counted else spec.requirements.minimum
            per_iteration = spec.batch_size * gpus
            rate = 0.0
            if run.measuring:
                rate = per_iteration / run.iteration_s if run.iteration_s > 0 else run.samples_per_s
                if not math.isfinite(rate):  # a job's own progress file: 1e-320 s an iteration is no rate
                    rate = 0.0
            m.progressed(AttemptProgressed(m.stimulus, attempt.id, done, rate, run.td_s, run.tw_s))
    vanished(m, event.node_id, reported, event.first)
    m.emit(NodeReply(m.stimulus, event.node_id, tuple(stop)))


def adopt(m: MachineCore, attempt: Attempt) -> None:
    """A node reports an attempt this machine stored but had not seen start (e.g. after a restart)."""
    attempt.launched = True
    attempt.started = m.now
    m.record(m.attempt_row(attempt))
    job = m.state.jobs.get(attempt.job_id)
    if (
        job is not None
        and job.state == JobState.LAUNCHING
        and not attempt.profiling
        and job.attempt == attempt.id
    ):
        kind = "adopted" if attempt.created < m.started else "started"
        m.set_state(job, JobState.RUNNING, kind, f"{attempt.id} reported running by {attempt.primary}")


def vanished(m: MachineCore, node_id: str, reported: set[str], first: bool) -> None:
    hb = m.settings.heartbeat_interval_s
    for attempt in m.state.attempts_on(node_id):
        if attempt.primary != node_id or attempt.id in reported:
            continue
        restarted = first and attempt.created < m.started
        if attempt.started is None:
            if restarted:
                m.end_attempt(
                    attempt,
                    reason="vanished",
                    message="launch never confirmed before the master restarted",
                )
            continue
        attempt.unseen_beats += 1
        # A beat may have been written before the launch and handled after it: only beats well after
        # the launch count, and it takes three of them.
        settled = m.now - attempt.started > 3 * hb + 10.0
        if (attempt.unseen_beats >= 3 and settled) or restarted:
            m.end_attempt(attempt, reason="vanished", message=f"{node_id} no longer reports it")


def on_restored(m: MachineCore, event: StateRestored) -> None:
    state = m.state
    for job in event.jobs:
        assert isinstance(job, Job)
        state.add_job(job)
        if not job.spec.runtime:
            m.seed_run_time(job.spec)
    for attempt in event.attempts:
        assert isinstance(attempt, Attempt)
        if attempt.job_id not in state.jobs:
            continue
        state.add_attempt(attempt)
        for sid, devices in attempt.devices.items():
            state.devices_used.setdefault(sid, set()).update(devices)
        job = state.jobs[attempt.job_id]
        if attempt.profiling:
            job.profiling.add(attempt.id)
        elif job.attempt is None:
            job.attempt = attempt.id
        else:
            job.moving_to = attempt.id
    for node_id in event.drained:
        if node_id in state.nodes:
            state.nodes[node_id].drained = True
    m.attempt_seq = max(m.attempt_seq, event.attempt_seq)
    for tenant, used, at in event.usage:
        state.usage[tenant] = TenantUsage(tenant, used, at)
    m.profiling_waits.extend(event.profiling_waits)
    for job in list(state.jobs.values()):
        if job.state == JobState.PROFILING and not job.profiling:
            new = JobState.QUEUED if m.estimator.profiled_types(job.id) else JobState.FAILED
            m.set_state(job, new, "recovered", "profiling run lost while the master was down")
