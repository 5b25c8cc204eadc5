"""Decisions that change attempts: a plan turned into ordered stops and launches, and an attempt's end.

`plan_actions` compares the plan with what is placed now (hopsmgr.core.reconcile); `apply_actions`
creates the new attempts (they hold their GPUs from this moment), moves stopped jobs to CHECKPOINTING
and sends each launch as soon as the stops whose GPUs it needs have ended, all at once or in slices. `end_attempt` records an attempt's end once
and moves its job on: profiled, requeued (checkpointed, preempted, node lost), completed or failed.
Both work on the machine (hopsmgr.control.machine, seen as hopsmgr.control.context.MachineCore),
through its one door for state changes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from hopsmgr.control import snapshot as views
from hopsmgr.control import usage
from hopsmgr.control.commands import CheckpointAndStop, ProfilingWaits, StopAttempt
from hopsmgr.control.context import MachineCore
from hopsmgr.control.records import Attempt, Job, NodeHealth
from hopsmgr.core.estimator import TimeProfile
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobId
from hopsmgr.core.planner import Plan, ProfilingRun
from hopsmgr.core.reconcile import Action, CheckpointStop, Launch, ReconcileError, reconcile

_PROFILE_KEY = "~profile~"  # desired-placement key of a profiling run inside reconcile (never leaves here)
WANTED = (JobState.QUEUED, JobState.RUNNING, JobState.LAUNCHING)


def exit_text(code: int | None) -> str:
    """How an attempt's process ended: "exited with 3", or for a negative code (a death by signal N is
    reported as -N) "was killed by signal 9 (SIGKILL)"."""
    if code is None or code >= 0:
        return f"exited with {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


def log_excerpt(tail: str, lines: int = 10, limit: int = 1500) -> str:
    """A failure reason from the end of a job's log: its last line first (a traceback's exception),
    then its last `lines` lines (at most `limit` characters), never the log's first lines."""
    kept = [line.rstrip() for line in tail.splitlines() if line.strip()]
    if not kept:
        return ""
    last = kept[-1].strip()
    body = "\n".join(kept[-lines:])
    if len(body) > limit:
        body = "..." + body[-limit:]
    return last if len(kept) == 1 else f"{last}\nlast lines of the log:\n{body}"


@dataclass(slots=True)
class PlanUnderWay:
    """A plan's ordered actions and how far they are applied (a plan applied in slices, between which
    other events are handled, re-checks each later action against the state it finds)."""

    plan: Plan
    actions: list[Action]
    profile_runs: dict[str, ProfilingRun]
    stopping_attempt: dict[JobId, str] = field(default_factory=dict)
    done: int = 0  # actions applied so far
    resumed: bool = False  # a slice after the first: the state may have moved since reconcile


def plan_actions(m: MachineCore, plan: Plan, runs: tuple[ProfilingRun, ...]) -> PlanUnderWay | None:
    """`plan` as ordered actions against what is placed now; None when it no longer fits the state."""
    state = m.state
    current = views.current_placements(state)
    desired: dict[JobId, Config] = {
        j: c
        for j, c in plan.assignments.items()
        if j in state.jobs and state.jobs[j].state in WANTED and not state.jobs[j].profiling
    }
    if plan.kind == "fragment":
        desired = {**current, **{j: c for j, c in desired.items() if j not in current}}
    desired.update(views.pinned_placements(state, current))  # never preempted: they keep what they hold
    profile_runs: dict[str, ProfilingRun] = {}
    for r in runs:
        job = state.jobs.get(r.job_id)
        if job is not None and job.state in (JobState.PENDING, JobState.QUEUED) and r.job_id not in desired:
            key = f"{r.job_id}{_PROFILE_KEY}{r.gpu_type}"
            desired[key] = Config.single(r.server_id, 1)
            profile_runs[key] = r
    capacity = views.usable_capacity(state, m.now, m.settings.exec_error_backoff_s, current)
    resumable = frozenset(j for j in desired if j in state.jobs and state.jobs[j].has_checkpoint)
    try:
        actions = reconcile(current, desired, capacity, resumable)
    except ReconcileError:
        return None  # state moved while planning: the next plan repairs it
    return PlanUnderWay(plan, actions, profile_runs)


def apply_actions(m: MachineCore, work: PlanUnderWay, limit: int | None = None) -> bool:
    """Apply the next `limit` actions of `work` (all of them without a limit); whether none is left.
    In a later slice a launch onto a node that no longer takes new work is dropped (the next plan
    places its job again), and a launch does not wait for a stop that has ended meanwhile."""
    state = m.state
    end = len(work.actions) if limit is None else min(len(work.actions), work.done + limit)
    for action in work.actions[work.done : end]:
        if isinstance(action, CheckpointStop):
            job = state.jobs.get(action.job_id)
            attempt = state.attempts.get(job.attempt) if job is not None and job.attempt else None
            if job is None or attempt is None or attempt.stopping:
                continue
            if job.state == JobState.LAUNCHING:
                _stop_launching(m, job, attempt, action.reason)
            else:
                _stop(m, job, attempt, action.reason)
            work.stopping_attempt[job.id] = attempt.id
        elif isinstance(action, Launch):
            if work.resumed and not all(_takes_work(m, sid) for sid in action.config.servers):
                continue
            run = work.profile_runs.get(action.job_id)
            attempt = _new_attempt(m, action, run)
            if attempt is None:
                continue
            stops = (work.stopping_attempt.get(j) for j in action.after)
            state.wait(attempt, {a for a in stops if a is not None and a in state.attempts})
            if not attempt.waits_for:
                m.launch_ready(attempt)
    work.done = end
    work.resumed = True
    return work.done >= len(work.actions)


def _takes_work(m: MachineCore, server_id: str) -> bool:
    node = m.state.nodes.get(server_id)
    return (
        node is not None
        and node.health == NodeHealth.HEALTHY
        and not node.drained
        and m.now - node.exec_error_at >= m.settings.exec_error_backoff_s
    )


def _stop(m: MachineCore, job: Job, attempt: Attempt, reason: str) -> None:
    attempt.stopping, attempt.stop_reason, attempt.stop_sent = True, reason, True
    m.record(m.attempt_row(attempt))
    m.set_state(
        job, JobState.CHECKPOINTING, reason, f"checkpoint-and-stop of {attempt.id} on {attempt.placement}"
    )
    m.emit(
        CheckpointAndStop(
            m.stimulus,
            attempt.id,
            job.id,
            attempt.placement,
            "migrated" if reason == "migrated" else "preempted",
        )
    )


def _stop_launching(m: MachineCore, job: Job, attempt: Attempt, reason: str) -> None:
    """A plan takes the GPUs of a job whose attempt has not started yet: there is nothing to
    checkpoint (LAUNCHING -> CHECKPOINTING is no transition), so it is stopped; when it has ended the
    job is QUEUED again and the next plan places it."""
    attempt.stopping, attempt.stop_reason, attempt.stop_sent = True, reason, True
    m.record(m.attempt_row(attempt))
    m.note(job, reason, f"stop of {attempt.id} on {attempt.placement}: not started yet, so no checkpoint")
    m.emit(
        StopAttempt(
            m.stimulus,
            attempt.id,
            job.id,
            attempt.placement,
            "migrated" if reason == "migrated" else "preempted",
        )
    )


def _new_attempt(m: MachineCore, action: Launch, run: ProfilingRun | None) -> Attempt | None:
    state = m.state
    job = state.jobs.get(run.job_id if run is not None else action.job_id)
    if job is None:
        return None
    if run is not None:
        if (
            job.state not in (JobState.PENDING, JobState.PROFILING, JobState.QUEUED)
            or job.attempt is not None
        ):
            return None
    elif job.moving_to is not None or not (
        job.state == JobState.CHECKPOINTING or (job.state == JobState.QUEUED and job.attempt is None)
    ):
        return None
    elif job.spec.one_server and len(action.config.parts) > 1:
        # every planner path keeps a job submitted for one server on one; this keeps it so whatever
        # path proposed otherwise (noted once per placement, not every plan)
        if m.spans_refused.get(job.id) != action.config:
            m.spans_refused[job.id] = action.config
            m.note(job, "not_launched", f"{action.config} spans servers and the job runs on one server")
        return None
    attempt = Attempt(
        id=m.new_attempt_id(),
        job_id=job.id,
        placement=action.config,
        profiling=run is not None,
        created=m.now,
        devices={},
        resume=action.resume if run is None else False,
        gpu_type=run.gpu_type if run is not None else "",
    )
    state.add_attempt(attempt)
    m.record(m.attempt_row(attempt))
    if run is not None:
        job.profiling.add(attempt.id)
        if job.state == JobState.PENDING:
            m.set_state(job, JobState.PROFILING, "profiling", f"{attempt.id} on {action.config}")
        else:
            m.note(job, "profiling", f"{attempt.id} on {action.config}")
    elif job.state == JobState.CHECKPOINTING:
        # a move: the new attempt holds its GPUs now; the job launches once its checkpoint is written
        job.moving_to = attempt.id
        m.note(job, "moving", f"{attempt.id} on {action.config} after its checkpoint")
    else:
        job.attempt = attempt.id
        m.set_state(job, JobState.LAUNCHING, "launching", f"{attempt.id} on {action.config}")
    return attempt


def end_attempt(
    m: MachineCore,
    attempt: Attempt,
    reason: str,
    code: int | None,
    checkpointed: bool,
    profile: TimeProfile | None,
    tail: str,
) -> None:
    """Record the end of an attempt once and move its job on; then launch what waited for it."""
    state = m.state
    if attempt.id in state.attempts:
        usage.charge_attempt(m, attempt, m.now)
    if state.remove_attempt(attempt.id) is None:
        return
    m.record(m.attempt_row(attempt, ended=m.now, end_reason=reason, exit_code=code, log_tail=tail or None))
    job = state.jobs.get(attempt.job_id)
    if job is not None:
        if attempt.started is not None and not attempt.profiling:
            ran = max(0.0, m.now - attempt.started)
            job.running_s += ran
            job.attained_gpu_s += ran * attempt.placement.gpus
        if attempt.profiling:
            _end_profiling(m, job, attempt, reason, code, profile, tail)
        else:
            _end_run(m, job, attempt, reason, code, checkpointed, tail)
    for other_id in sorted(state.waiting_on.pop(attempt.id, ())):
        other = state.attempts.get(other_id)
        if other is not None:
            other.waits_for.discard(attempt.id)
            if not other.waits_for and not other.launched:
                m.launch_ready(other)
    m.fragment_soon()


def _end_profiling(
    m: MachineCore,
    job: Job,
    attempt: Attempt,
    reason: str,
    code: int | None,
    profile: TimeProfile | None,
    tail: str,
) -> None:
    job.profiling.discard(attempt.id)
    node = m.state.nodes[attempt.primary]
    failed = False
    if code == 0 and profile is not None:
        m.estimator.add_profile(job.id, node.server.gpu_type, profile, node.server.calibration)
        m.note(job, "profiled", f"on {node.server.id} ({node.server.gpu_type})")
    elif reason in ("exited", "launch_error"):
        failed = True
        if code == 0:
            tail = "it exited 0 without writing a profile: the command must use hopsmgr.runtime"
    if failed and job.state in (JobState.PENDING, JobState.PROFILING):
        how = "could not start" if reason == "launch_error" else f"failed (exit {code})"
        message = f"profiling run on {node.server.id} {how}: {log_excerpt(tail)}".strip()
        job.failures += 1
        others = [a for a in m.state.attempts.values() if a.id in job.profiling]
        m.set_state(job, JobState.FAILED, "failed", message)
        for other in others:
            other.stop_reason = "job_ended"
            m.emit_stop(other)
        return
    if not job.profiling and job.state == JobState.PROFILING:
        profiled = m.estimator.profiled_types(job.id)
        why = (
            "profiled"
            if profiled
            else f"profiling run {attempt.id} on {node.server.id} {reason}: {log_excerpt(tail, 3, 300)}"
        )
        if profiled:  # from when its profiling began (an --after job waits for its dependencies first)
            m.profiling_waits.append(max(0.0, m.now - job.state_since))
            m.record(ProfilingWaits(tuple(m.profiling_waits)))
        m.set_state(job, JobState.QUEUED, "queued", why.strip())


def _end_run(
    m: MachineCore,
    job: Job,
    attempt: Attempt,
    reason: str,
    code: int | None,
    checkpointed: bool,
    tail: str,
) -> None:
    if job.moving_to == attempt.id:
        job.moving_to = None  # the unused half of a move
    if job.attempt != attempt.id:
        return
    job.attempt = None
    lost = reason in ("node_lost", "vanished", "launch_failed")
    # a command without the runtime has no exit code that says "checkpointed": after its checkpoint
    # signal, exit 0 means it saved its own checkpoint and stopped
    if code == 0 and attempt.stopping and not job.spec.runtime:
        checkpointed = True
    if code == 0 and not lost and not checkpointed:
        if job.state == JobState.LAUNCHING:
            m.set_state(job, JobState.RUNNING, "started", "finished before its launch was confirmed")
        job.done_samples = job.spec.total_samples
        m.set_state(job, JobState.COMPLETED, "completed", f"attempt {attempt.id} exited 0")
    elif checkpointed or attempt.stopping or lost or reason == "stop_failed":
        if checkpointed:
            job.has_checkpoint = True
        job.restarts += 1 if attempt.started is not None else 0
        if attempt.stopping:
            if attempt.stop_reason == "migrated":
                job.migrations += 1
            else:
                job.preemptions += 1
        if reason == "node_lost":
            job.node_losses += 1
        how = "checkpointed" if checkpointed else f"{reason} (exit {code})"
        if tail and not checkpointed:
            how += f": {log_excerpt(tail, 3, 300)}"
        resume = "from its checkpoint" if job.has_checkpoint else "from the start"
        m.set_state(job, JobState.QUEUED, "requeued", f"attempt {attempt.id} {how}; resumes {resume}")
    else:
        job.failures += 1
        how = "could not start" if reason == "launch_error" else exit_text(code)
        tail = log_excerpt(tail)
        message = f"attempt {attempt.id} {how}"
        m.set_state(job, JobState.FAILED, "failed", f"{message}: {tail}" if tail else message)
