"""The machine's plan cycle: a round tick asks for a plan, the plan comes back and is applied.

`on_round_tick` asks for a plan (`request_plan`: charges the tenants, builds the planner's snapshot,
chooses which jobs want profiling) unless one is being made or applied, in which case a first plan is
asked for as soon as that one is done. `on_plan_ready` turns the plan into ordered actions
(hopsmgr.control.acting) and applies them, at once or in slices (`ControlSettings.plan_slice`: a
ContinuePlan command, answered with PlanContinue, between two slices).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hopsmgr.control import acting, usage
from hopsmgr.control import snapshot as views
from hopsmgr.control.commands import ContinuePlan, PlanRequest, UsageRecord
from hopsmgr.control.events import PlanReady, RoundTick
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.plan import Plan

if TYPE_CHECKING:
    from hopsmgr.control.machine import SchedulerMachine


def on_round_tick(m: SchedulerMachine, event: RoundTick) -> None:
    m.plan_soon = False
    if m.inflight is not None or m.applying is not None:
        m.first_due = m.first_due or event.kind == "first"
        return
    request_plan(m, event.kind)


def request_plan(m: SchedulerMachine, kind: str) -> None:
    s = m.settings
    state = m.state
    now = m.now
    usage.charge_all(m, now)
    if kind == "first" and state.usage:
        m.record(UsageRecord(tuple((u.tenant, u.used, u.at) for u in state.usage.values())))
    snapshot = views.build_snapshot(state, now, s.exec_error_backoff_s, s.scheduler.fairshare_half_life_h)
    to_profile = []
    starving = set()
    if s.profiling:
        if m.profiled_on != state.gpu_types:
            m.profiled_on, state.unprofiled = state.gpu_types, dict.fromkeys(state.jobs)
        # at 10,000 queued jobs asking the estimator about each one was most of a plan request:
        # a job profiled on every GPU type leaves `unprofiled` (profiles are kept for its life)
        for job_id in list(state.unprofiled):
            job = state.jobs[job_id]
            if job.spec.after and state.waits_for(job):  # --after: not profiled before they end
                continue
            if job.state == JobState.PENDING or (job.state == JobState.QUEUED and not job.profiling):
                if job.state == JobState.QUEUED and state.gpu_types <= m.estimator.profiled_types(job.id):
                    del state.unprofiled[job_id]
                    continue
                to_profile.append(job.spec)
                waited = now - job.spec.submit_time >= s.scheduler.round_seconds
                if waited and (job.state == JobState.PENDING or not m.estimator.profiled_types(job.id)):
                    starving.add(job.id)
    if kind == "first":
        waiting = bool(state.counts.get(JobState.PENDING) or state.counts.get(JobState.QUEUED))
        if not (snapshot.jobs or to_profile) or not (m.changed or waiting):
            return  # level-triggered: nothing waits and nothing changed, the plan would be the same
        m.changed = False
    m.request_seq += 1
    m.inflight = m.request_seq
    m.emit(
        PlanRequest(
            m.stimulus,
            m.request_seq,
            "first" if kind == "first" else "fragment",
            snapshot,
            tuple(to_profile),
            frozenset(starving),
            views.profiling_budget(state, s.profiling_share),
            s.scheduler.min_attempt_s,
            s.scheduler.round_seconds,
        )
    )


def on_plan_ready(m: SchedulerMachine, event: PlanReady) -> None:
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


def apply_next_slice(m: SchedulerMachine) -> None:
    """Apply the next slice of the plan under way (all of it without `plan_slice`)."""
    work = m.applying
    if work is None:
        return  # nothing under way (a PlanContinue sent twice)
    if not acting.apply_actions(m, work, m.settings.plan_slice):
        m.emit(ContinuePlan(m.stimulus))
        return
    m.applying = None
    _applied(m, work.plan)


def _applied(m: SchedulerMachine, plan: Plan) -> None:
    if m.first_due:
        m.first_due = False
        request_plan(m, "first")
    elif plan.kind == "first":
        m.fragment_soon()
