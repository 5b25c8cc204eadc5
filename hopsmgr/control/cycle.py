"""The machine's plan cycle: a round tick asks for a plan, the plan comes back and is applied.

`on_round_tick` asks for a plan (`request_plan`: charges the tenants, chooses which jobs want
profiling, builds the planner's snapshot) unless one is being prepared, made or applied, in which case a
first plan is asked for as soon as that one is done. `on_plan_ready` turns the plan into ordered
actions (hopsmgr.control.acting) and applies them. Both in one step or in slices
(`ControlSettings.request_slice`, `plan_slice`: a ContinuePlan command, answered with PlanContinue,
between two slices), so that the master serves heartbeats in between at 10,000 jobs. They work on the
machine as a `PlanCycle`: hopsmgr.control.context.MachineCore and the plan cycle's bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from hopsmgr.control import acting, usage
from hopsmgr.control import snapshot as views
from hopsmgr.control.commands import ContinuePlan, PlanRequest, UsageRecord
from hopsmgr.control.context import MachineCore
from hopsmgr.control.events import PlanReady, RoundTick
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ClusterSnapshot, JobSpec, JobView
from hopsmgr.core.plan import Plan
from hopsmgr.core.program import protected


class PlanCycle(MachineCore, Protocol):
    """The machine as the plan cycle sees it: its core and the cycle's bookkeeping, which the machine
    holds (hopsmgr.control.machine documents each)."""

    inflight: int | None
    applying: acting.PlanUnderWay | None
    preparing: RequestUnderWay | None
    first_due: bool
    changed: bool
    protected_until: float
    profiled_on: frozenset[str]
    plan_soon: bool
    request_seq: int


def on_round_tick(m: PlanCycle, event: RoundTick) -> None:
    m.plan_soon = False
    if m.inflight is not None or m.applying is not None or m.preparing is not None:
        m.first_due = m.first_due or event.kind == "first"
        return
    request_plan(m, event.kind)


@dataclass(slots=True)
class RequestUnderWay:
    """A plan request being prepared in steps (ControlSettings.request_slice): the tenants are charged,
    the jobs that want profiling gathered `request_slice` at a time, the waiting jobs' views built
    `request_slice` at a time, then the snapshot (taking those views whose jobs did not change)."""

    kind: str
    charge_over: list[str]  # the open attempts as the request started
    pass_over: list[str]  # state.unprofiled as the request started
    charged: int = 0  # attempts of charge_over charged so far; -1 once all are
    at: int = 0
    to_profile: list[JobSpec] = field(default_factory=list)
    starving: list[str] = field(default_factory=list)
    view_over: list[str] | None = None  # the live jobs as the views' slices began
    views_at: float = 0.0  # when they began: every waiting job's wait is counted to then
    viewed: int = 0  # jobs of view_over whose views were built (or skipped) so far
    prebuilt: dict[str, JobView] = field(default_factory=dict)


def request_plan(m: PlanCycle, kind: str) -> None:
    state = m.state
    if m.profiled_on != state.gpu_types:
        m.profiled_on, state.unprofiled = state.gpu_types, dict.fromkeys(state.jobs)
    pass_over = list(state.unprofiled) if m.settings.profiling else []
    m.preparing = RequestUnderWay(kind, list(state.attempts), pass_over)
    continue_request(m)


# [ours] Charging an attempt costs about as much as ten jobs of the profiling pass.
CHARGES_PER_JOB_SLICE = 0.1


def continue_request(m: PlanCycle) -> None:
    """The next step of the request under way: a slice of the charges, then of the profiling pass,
    then of the waiting jobs' views, then the snapshot and the PlanRequest. Between two steps the
    driver serves other events: an attempt that ended meanwhile was charged at its end, a job gathered
    in an earlier step may have ended (the plan's actions are checked against the state when they are
    applied), and a view built earlier is used only if its job still waits unchanged."""
    work = m.preparing
    if work is None:
        return
    sliced = m.settings.request_slice
    if work.charged >= 0:
        step = max(1, int(sliced * CHARGES_PER_JOB_SLICE)) if sliced else len(work.charge_over)
        chunk = work.charge_over[work.charged : work.charged + step]
        work.charged += len(chunk)
        usage.charge_all(m, m.now, chunk)
        if sliced and work.charged < len(work.charge_over):
            m.emit(ContinuePlan(m.stimulus))
            return
        work.charged = -1  # all charged
        state = m.state
        if work.kind == "first" and state.usage:
            m.record(UsageRecord(tuple((u.tenant, u.used, u.at) for u in state.usage.values())))
    if work.at < len(work.pass_over):
        step = sliced or len(work.pass_over)
        chunk = work.pass_over[work.at : work.at + step]
        work.at += len(chunk)
        _wanting_profiles(m, chunk, work.to_profile, work.starving)
        if sliced and work.at < len(work.pass_over):
            m.emit(ContinuePlan(m.stimulus))
            return
    if sliced and (work.view_over is not None or len(m.state.jobs) > sliced):
        if work.view_over is None:  # more jobs than a slice: their views too are built in slices
            work.view_over, work.views_at = list(m.state.jobs), m.now
        if work.viewed < len(work.view_over):
            chunk = work.view_over[work.viewed : work.viewed + sliced]
            work.viewed += len(chunk)
            views.prebuild_waiting(m.state, work.views_at, chunk, work.prebuilt)
            m.emit(ContinuePlan(m.stimulus))  # the snapshot in a step of its own
            return
    m.preparing = None
    _emit_request(m, work)


def _emit_request(m: PlanCycle, work: RequestUnderWay) -> None:
    s = m.settings
    state = m.state
    snapshot = views.build_snapshot(
        state,
        m.now,
        s.exec_error_backoff_s,
        s.scheduler.fairshare_half_life_h,
        work.prebuilt,
        work.views_at if work.view_over is not None else None,
    )
    if work.kind == "first":
        waiting = bool(state.counts.get(JobState.PENDING) or state.counts.get(JobState.QUEUED))
        # a job kept in place only by its minimum attempt length may be moved once that has passed
        released = m.now >= m.protected_until
        if not (snapshot.jobs or work.to_profile) or not (m.changed or waiting or released):
            return  # level-triggered: nothing waits and nothing changed, the plan would be the same
        m.changed = False
        m.protected_until = _protection_ends(snapshot, s.scheduler.min_attempt_s)
    m.request_seq += 1
    m.inflight = m.request_seq
    m.emit(
        PlanRequest(
            m.stimulus,
            m.request_seq,
            "first" if work.kind == "first" else "fragment",
            snapshot,
            tuple(work.to_profile),
            frozenset(work.starving),
            views.profiling_budget(state, s.profiling_share),
            s.scheduler.min_attempt_s,
            s.scheduler.round_seconds,
        )
    )


def _protection_ends(snapshot: ClusterSnapshot, min_attempt_s: float) -> float:
    """When the first of the placed jobs that a first plan may not move yet (`protected`) becomes
    movable: a plan then may move it even though nothing else changed (inf: none is protected)."""
    ends = [
        snapshot.now + min_attempt_s + 2 * v.spec.restart_s - v.attempt_s
        for v in snapshot.jobs
        if protected(v, min_attempt_s)
    ]
    return min(ends, default=math.inf)


def _wanting_profiles(
    m: PlanCycle, job_ids: list[str], to_profile: list[JobSpec], starving: list[str]
) -> None:
    """Add to `to_profile` the jobs of `job_ids` that want profiling runs (in order), and to `starving`
    those that waited a round with no profile at all. A job profiled on every GPU type leaves
    `state.unprofiled` (at 10,000 queued jobs asking the estimator about each one was most of a plan
    request)."""
    state = m.state
    jobs, unprofiled, gpu_types = state.jobs, state.unprofiled, state.gpu_types
    profiled_types = m.estimator.profiled_types
    now, round_s = m.now, m.settings.scheduler.round_seconds
    pending, queued = JobState.PENDING, JobState.QUEUED
    for job_id in job_ids:
        job = jobs.get(job_id)
        if job is None:  # ended since the pass started
            continue
        spec = job.spec
        if spec.after and state.waits_for(job):  # --after: not profiled before they end
            continue
        if job.state == pending:
            to_profile.append(spec)
            if now - spec.submit_time >= round_s:
                starving.append(job_id)
        elif job.state == queued and not job.profiling:
            types = profiled_types(job_id)
            if gpu_types <= types:
                unprofiled.pop(job_id, None)
                continue
            to_profile.append(spec)
            if not types and now - spec.submit_time >= round_s:
                starving.append(job_id)


def on_plan_ready(m: PlanCycle, event: PlanReady) -> None:
    if event.request_id != m.inflight or m.applying is not None:
        return  # an abandoned request
    m.inflight = None
    work = acting.plan_actions(m, event.plan, event.runs)
    if work is None:
        _applied(m, event.plan)
        return
    if work.actions:
        m.changed = True
    m.applying = work
    apply_next_slice(m)


def apply_next_slice(m: PlanCycle) -> None:
    """Apply the next slice of the plan under way (all of it without `plan_slice`)."""
    work = m.applying
    if work is None:
        return  # nothing under way (a PlanContinue sent twice)
    if not acting.apply_actions(m, work, m.settings.plan_slice):
        m.emit(ContinuePlan(m.stimulus))
        return
    m.applying = None
    _applied(m, work.plan)


def _applied(m: PlanCycle, plan: Plan) -> None:
    if m.first_due:
        m.first_due = False
        request_plan(m, "first")
    elif plan.kind == "first":
        m.fragment_soon()
