"""A plan applied in slices (ControlSettings.plan_slice, as the master applies it so that a plan of a
thousand launches does not hold up its heartbeats): with nothing in between it makes exactly the
decisions of a plan applied at once; what happens between two slices is respected (a cancelled job
is not launched, a lost node gets no new work, a stop that ended is not waited for, a waiting job's
view built in an earlier slice is not used once the job changed), and no other plan starts before
the last slice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hopsmgr.control import snapshot as views
from hopsmgr.control.commands import (
    CheckpointAndStop,
    Command,
    ContinuePlan,
    LaunchAttempt,
    Persist,
    PlanRequest,
    StartProfiling,
)
from hopsmgr.control.events import (
    AttemptEnded,
    AttemptStarted,
    HealthTick,
    JobCancelled,
    JobSubmitted,
    NodeBeat,
    PlanContinue,
    PlanReady,
    RoundTick,
)
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, JobView
from hopsmgr.core.plan import Plan
from tests.control.harness import PROFILE, SERVERS, Harness, spec


def busy(h: Harness, jobs: int = 8) -> list[Command]:
    """Submit `jobs` jobs, profile them, then a first round that places them: the commands."""
    out: list[Command] = []
    for k in range(jobs):
        out += h.feed(JobSubmitted(h.stimulus(), spec(f"j{k}", (1, 2), samples=1e8, at=h.now)))
    for _ in range(jobs):
        out += h.feed(RoundTick(h.stimulus(), "first"))
        for run in h.of(StartProfiling, out):
            if run.attempt_id in h.machine.state.attempts:
                out += h.feed(AttemptStarted(h.stimulus(), run.attempt_id))
                out += h.feed(AttemptEnded(h.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    out += h.feed(RoundTick(h.stimulus(), "first"))
    return out


def decisions(commands: list[Command]) -> tuple[list[object], list[Command]]:
    """The records in order, and the other commands in order without their stimulus ids (a plan at
    once stores all its records before its first command, one in slices each slice's before its
    commands: the orders within each list are what must agree)."""
    records = [r for c in commands if isinstance(c, Persist) for r in c.records]
    others = [replace(c, stimulus_id="") for c in commands if not isinstance(c, Persist | ContinuePlan)]
    return records, others


def test_a_plan_in_slices_makes_the_same_decisions_as_at_once() -> None:
    whole, sliced = Harness(), Harness(settings=ControlSettings(plan_slice=2))
    at_once, in_slices = busy(whole), busy(sliced)
    assert sliced.of(ContinuePlan, in_slices)  # it was sliced
    assert decisions(at_once) == decisions(in_slices)
    assert whole.machine.state.held() == sliced.machine.state.held()
    whole.close()
    sliced.close()


def first_slice(jobs: int = 8) -> tuple[Harness, list[Command]]:
    """Profiled jobs, then a first round whose plan is applied one action at a time: the first slice's
    commands (a ContinuePlan among them)."""
    h = Harness(settings=ControlSettings(plan_slice=1))
    for k in range(jobs):  # profiled before they are submitted: they queue at once
        h.machine.estimator.add_profile(f"j{k}", "v100", PROFILE, SERVERS[0].calibration)
        h.machine.estimator.add_profile(f"j{k}", "p100", PROFILE, SERVERS[2].calibration)
        h.feed(JobSubmitted(h.stimulus(), spec(f"j{k}", (1,), samples=1e8, at=h.now)))
    h.auto_continue = False
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert h.of(ContinuePlan, out) and h.machine.applying is not None
    return h, out


def finish(h: Harness) -> list[Command]:
    out: list[Command] = []
    while h.machine.applying is not None:
        out += h.feed(PlanContinue(h.stimulus()))
    return out


def test_a_job_cancelled_between_slices_is_not_launched() -> None:
    h, out = first_slice()
    launched = {c.job_id for c in h.of(LaunchAttempt, out)}
    waiting = [j for j in (f"j{k}" for k in range(8)) if j not in launched]
    h.feed(JobCancelled(h.stimulus(), waiting[-1]))
    rest = finish(h)
    assert waiting[-1] not in {c.job_id for c in h.of(LaunchAttempt, rest)}
    assert {c.job_id for c in h.of(LaunchAttempt, out + rest)} == set(waiting[:-1]) | launched
    h.close()


def test_a_node_lost_between_slices_gets_no_launch_of_the_plan() -> None:
    h, out = first_slice()
    planned = {sid for a in h.machine.applying.actions for sid in getattr(a, "config", None).servers}  # type: ignore[union-attr]
    lost = sorted(planned - {sid for c in h.of(LaunchAttempt, out) for sid in c.placement.servers})[0]
    h.now = 200.0
    for s in SERVERS:
        if s.id != lost:
            h.feed(NodeBeat(h.stimulus(), s.id, True))
    h.feed(HealthTick(h.stimulus()))
    assert h.machine.state.nodes[lost].health != "HEALTHY"
    rest = finish(h)
    assert all(lost not in c.placement.servers for c in h.of(LaunchAttempt, rest))
    h.close()


def test_no_other_plan_starts_before_the_last_slice() -> None:
    h, _ = first_slice()
    (request,) = [c for c in h.commands if isinstance(c, PlanRequest)][-1:]
    assert not h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # deferred, not lost
    rest = finish(h)
    (again,) = h.of(PlanRequest, rest)  # asked for as soon as the plan was applied
    assert again.request_id == request.request_id + 1 and again.kind == "first"
    h.close()


def test_a_launch_does_not_wait_for_a_stop_that_ended_between_slices() -> None:
    h = Harness(servers=SERVERS[:1], settings=ControlSettings(plan_slice=1))
    for job_id in ("small", "big"):
        h.machine.estimator.add_profile(job_id, "v100", PROFILE, SERVERS[0].calibration)
    h.feed(JobSubmitted(h.stimulus(), spec("small", (4,), samples=1e9)))
    (launch,) = h.of(LaunchAttempt, h.feed(RoundTick(h.stimulus(), "first")))
    h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    h.feed(JobSubmitted(h.stimulus(), spec("big", (4,), samples=1e9)))
    h.auto_plan, h.auto_continue = False, False
    (request,) = h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))
    plan = Plan("first", h.now, {"big": Config.single(SERVERS[0].id, 4)})  # the small job gives way
    out = h.feed(PlanReady(h.stimulus(), request.request_id, plan, (), 0.0))
    (stop,) = h.of(CheckpointAndStop, out)
    assert h.of(ContinuePlan, out) and not h.of(LaunchAttempt, out)  # big's launch: the next slice
    h.feed(AttemptEnded(h.stimulus(), stop.attempt_id, "exited", 75, checkpointed=True))
    rest = finish(h)
    (big,) = h.of(LaunchAttempt, rest)  # launched at once: not waiting for the stop that ended
    assert big.job_id == "big" and h.machine.state.jobs["big"].state == JobState.LAUNCHING
    assert h.machine.state.jobs["small"].state == JobState.QUEUED
    h.close()


def test_a_request_prepared_in_steps_makes_the_same_decisions_as_in_one() -> None:
    whole = Harness(settings=ControlSettings(plan_slice=2))
    stepped = Harness(settings=ControlSettings(plan_slice=2, request_slice=1))
    prepared: list[bool] = []
    handle = stepped.machine.handle

    def noting(event, now):  # type: ignore[no-untyped-def]
        out = handle(event, now)
        prepared.append(isinstance(event, RoundTick) and stepped.machine.preparing is not None)
        return out

    stepped.machine.handle = noting  # type: ignore[method-assign]
    at_once, in_steps = busy(whole), busy(stepped)
    assert any(prepared)  # a round's request was prepared in steps
    assert decisions(at_once) == decisions(in_steps)
    assert whole.machine.state.held() == stepped.machine.state.held()
    whole.close()
    stepped.close()


def test_what_happens_while_a_request_is_prepared_is_respected() -> None:
    """A job cancelled between two steps of the profiling pass is neither offered for profiling nor
    planned; a round tick meanwhile is deferred (a first plan right after), not a second request."""
    h = Harness(settings=ControlSettings(request_slice=1))
    h.auto_plan, h.auto_continue = False, False
    for k in range(4):
        h.feed(JobSubmitted(h.stimulus(), spec(f"j{k}", (1,), samples=1e8, at=h.now)))
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert h.of(ContinuePlan, out) and not h.of(PlanRequest, out)
    assert h.machine.preparing is not None
    h.feed(JobCancelled(h.stimulus(), "j2"))
    assert not h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # deferred, not lost
    rest: list[Command] = []
    while h.machine.preparing is not None:
        rest += h.feed(PlanContinue(h.stimulus()))
    (request,) = h.of(PlanRequest, rest)
    assert [j.id for j in request.to_profile] == ["j0", "j1", "j3"]
    assert "j2" not in {v.id for v in request.snapshot.jobs}
    assert h.machine.first_due
    h.close()


def test_a_request_dropped_half_way_does_not_block_the_next_round() -> None:
    """The master drops the plan cycle when a round fails (a bug): the next tick asks afresh."""
    h = Harness(settings=ControlSettings(request_slice=1))
    h.auto_plan, h.auto_continue = False, False
    for k in range(3):
        h.feed(JobSubmitted(h.stimulus(), spec(f"j{k}", (1,), samples=1e8, at=h.now)))
    assert h.of(ContinuePlan, h.feed(RoundTick(h.stimulus(), "first")))
    assert not h.of(ContinuePlan, h.feed(RoundTick(h.stimulus(), "first")))  # one under way
    h.machine.drop_plan_cycle()
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert h.of(ContinuePlan, out) and h.machine.preparing is not None
    h.close()


def test_a_first_plan_is_asked_for_when_a_protected_job_becomes_movable() -> None:
    """Level-triggered first plans skip a round in which nothing waits and nothing changed, but the end
    of a running job's minimum attempt length counts as a change: the plan may then move it (a job
    left on slow GPUs beside idle fast ones, found on the 64-GPU paper world at light load)."""
    h = Harness()
    h.machine.estimator.add_profile("j0", "v100", PROFILE, SERVERS[0].calibration)
    h.machine.estimator.add_profile("j0", "p100", PROFILE, SERVERS[2].calibration)
    h.feed(JobSubmitted(h.stimulus(), spec("j0", (1,), samples=1e9, at=h.now)))
    (launch,) = h.of(LaunchAttempt, h.feed(RoundTick(h.stimulus(), "first")))
    h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    started = h.now
    h.now += 10.0
    assert h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # the start was a change
    protected_for = h.machine.settings.scheduler.min_attempt_s + 2 * 20.0  # spec(): restart_s 20
    h.now += 60.0
    assert protected_for > 70.0
    assert not h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # nothing to do yet
    h.now = started + protected_for + 1.0
    assert h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # movable now
    h.now += 60.0
    assert not h.of(PlanRequest, h.feed(RoundTick(h.stimulus(), "first")))  # and once is enough
    h.close()


def test_views_built_between_slices_are_used_only_while_their_jobs_wait_unchanged() -> None:
    """A request in steps builds the waiting jobs' views a slice at a time; the snapshot takes each
    one whose job still waits as it was, and builds afresh the view of a job that changed meanwhile
    (here: an attempt began and ended, so it ran and restarted) or started."""
    h = Harness()
    busy(h, jobs=16)  # 10 GPUs: some jobs run, the rest wait
    state = h.machine.state
    waiting = [j.id for j in state.jobs.values() if j.state == JobState.QUEUED and j.attempt is None]
    running = next(j for j in state.jobs.values() if j.attempt is not None)
    assert len(waiting) >= 3
    prebuilt: dict[str, JobView] = {}
    views.prebuild_waiting(state, h.now, [*waiting, running.id], prebuilt)
    assert sorted(prebuilt) == sorted(waiting)  # a running job's view is not built ahead
    changed = state.jobs[waiting[0]]
    changed.running_s, changed.restarts = changed.running_s + 60.0, changed.restarts + 1
    later = h.now + 5.0
    snap = views.build_snapshot(state, later, 0.0, prebuilt=prebuilt)
    fresh = views.build_snapshot(state, later, 0.0)
    by_id = {v.id: v for v in snap.jobs}
    assert [v.id for v in snap.jobs] == [v.id for v in fresh.jobs]  # the same jobs, in the same order
    assert by_id[changed.id] == {v.id: v for v in fresh.jobs}[changed.id]  # built afresh
    assert by_id[changed.id].restarts == changed.restarts
    for job_id in waiting[1:]:
        assert by_id[job_id] is prebuilt[job_id]
        assert by_id[job_id].waited_s == pytest.approx({v.id: v for v in fresh.jobs}[job_id].waited_s - 5.0)
    assert by_id[running.id].current is not None
    h.close()


def test_a_snapshot_from_view_slices_is_the_state_at_its_end() -> None:
    """With more jobs than a slice, the waiting jobs' views are built a slice at a time; what happens
    between the slices (a job cancelled, one submitted, one whose attempt began and ended) is in the
    request's snapshot exactly as in a snapshot built at once at the end, and the waits of all waiting
    jobs count to the instant the slices began."""
    h = Harness(settings=ControlSettings(request_slice=2))
    busy(h, jobs=16)  # 10 GPUs: some jobs run, the rest wait
    h.auto_plan, h.auto_continue = False, False
    state = h.machine.state
    h.now += 100.0
    began = h.now
    out = h.feed(RoundTick(h.stimulus(), "first"))
    while h.machine.preparing is not None and not h.machine.preparing.prebuilt:
        out += h.feed(PlanContinue(h.stimulus()))
    work = h.machine.preparing
    assert work is not None and work.view_over is not None and work.viewed < len(work.view_over)
    waiting = [j.id for j in state.jobs.values() if j.state == JobState.QUEUED and j.attempt is None]
    h.now += 7.0
    out += h.feed(JobCancelled(h.stimulus(), waiting[-1]))
    out += h.feed(JobSubmitted(h.stimulus(), spec("late", (1,), samples=1e8, at=h.now)))
    changed = state.jobs[next(iter(work.prebuilt))]  # as an attempt that began and ended since leaves it
    changed.running_s, changed.restarts = changed.running_s + 3.0, changed.restarts + 1
    h.now += 5.0
    while h.machine.preparing is not None:
        out += h.feed(PlanContinue(h.stimulus()))
    (request,) = h.of(PlanRequest, out)
    s = h.machine.settings
    at_once = views.build_snapshot(
        state, h.now, s.exec_error_backoff_s, s.scheduler.fairshare_half_life_h, waits_at=began
    )
    assert request.snapshot.jobs == at_once.jobs
    ids = [v.id for v in request.snapshot.jobs]
    assert waiting[-1] not in ids
    assert {v.id: v for v in request.snapshot.jobs}[changed.id].restarts == changed.restarts
    h.close()
