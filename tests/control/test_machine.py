"""The scheduler state machine driven event by event: commands out for events in, no I/O, no clock."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from hopsmgr.control.commands import (
    AttemptRow,
    CheckpointAndStop,
    JobChange,
    LaunchAttempt,
    Persist,
    PlanRequest,
    PlanSoon,
    ProfilingWaits,
    Reply,
    StartProfiling,
    StopAttempt,
    ThroughputSample,
)
from hopsmgr.control.events import (
    AttemptEnded,
    AttemptLaunchFailed,
    AttemptProgressed,
    AttemptStarted,
    HealthTick,
    JobCancelled,
    JobSubmitted,
    NodeBeat,
    NodeDrained,
    NodeReported,
    RoundTick,
    RunReport,
    StateRestored,
)
from hopsmgr.control.planning import STARVED_ROUNDS
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Config, TenantQuota
from hopsmgr.core.plan import Plan
from hopsmgr.policies.registry import make_policy
from tests.control.harness import PROFILE, SERVERS, Harness, PlanReady, spec


def profiled(
    h: Harness,
    job_id: str,
    gpus: tuple[int, ...] = (1,),
    samples: float = 1e6,
    *,
    one_server: bool = False,
    tenant: str = "default",
) -> list[LaunchAttempt]:
    """Submit a job, run its profiling runs to their end; the launches that followed."""
    submitted = replace(spec(job_id, gpus, samples, tenant=tenant, at=h.now), one_server=one_server)
    out = h.feed(JobSubmitted(h.stimulus(), submitted))
    out += h.feed(RoundTick(h.stimulus(), "first"))
    for run in h.of(StartProfiling, out):
        out += h.feed(AttemptStarted(h.stimulus(), run.attempt_id))
        out += h.feed(AttemptEnded(h.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    out += h.feed(RoundTick(h.stimulus(), "fragment"))
    return h.of(LaunchAttempt, out)


def test_submission_is_persisted_before_the_reply_and_asks_for_a_plan(harness: Harness) -> None:
    out = harness.feed(JobSubmitted("sub-1", spec("j1")))
    assert isinstance(out[0], Persist)
    (change,) = out[0].records
    assert isinstance(change, JobChange) and change.new == JobState.PENDING and change.old is None
    assert [type(c) for c in out[1:]] == [Reply, PlanSoon]
    assert all(c.stimulus_id == "sub-1" for c in out)
    assert harness.machine.state.jobs["j1"].state == JobState.PENDING


def test_the_machine_keeps_how_long_profiling_took_each_job_for_the_forecasts(harness: Harness) -> None:
    # from submission to queued: what a forecast holds a job not yet profiled back by
    harness.now = 100.0
    submitted = spec("j1", (1,), 1e6, at=harness.now)
    out = harness.feed(JobSubmitted(harness.stimulus(), submitted))
    out += harness.feed(RoundTick(harness.stimulus(), "first"))
    runs = harness.of(StartProfiling, out)
    assert runs
    harness.now = 130.0
    for run in runs:
        harness.feed(AttemptStarted(harness.stimulus(), run.attempt_id))
        assert not harness.machine.profiling_waits  # not queued before its last profiling run ends
        out = harness.feed(AttemptEnded(harness.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    assert harness.machine.state.jobs["j1"].state == JobState.QUEUED
    assert list(harness.machine.profiling_waits) == [30.0]
    # recorded for the store, so a master that restarts holds new jobs by them too
    records = [r for c in out if isinstance(c, Persist) for r in c.records]
    assert [r for r in records if isinstance(r, ProfilingWaits)] == [ProfilingWaits((30.0,))]
    restarted = Harness()
    restarted.feed(StateRestored("restore", profiling_waits=(30.0, 45.0)))
    assert list(restarted.machine.profiling_waits) == [30.0, 45.0]


def test_submission_limits_are_decided_by_the_machine() -> None:
    h = Harness(tenants=(TenantQuota("a", cap_gpus=2), TenantQuota("b")))
    (reply,) = h.feed(JobSubmitted(h.stimulus(), spec("j1", (4,), tenant="a")))
    assert isinstance(reply, Reply) and reply.error_field == "gpus" and "cap of 2" in (reply.error or "")
    (reply,) = h.feed(JobSubmitted(h.stimulus(), spec("j2", tenant="nobody")))
    assert isinstance(reply, Reply) and reply.error_field == "tenant" and reply.status == 422
    (reply,) = h.feed(JobSubmitted(h.stimulus(), spec("j3", (11,), tenant="b")))
    assert reply.error_field == "gpus" and "cluster's 10" in (reply.error or "")
    assert h.machine.state.jobs == {}
    h.close()


def test_profiling_runs_take_one_gpu_per_type_then_the_job_queues_and_launches(harness: Harness) -> None:
    launches = profiled(harness, "j1", (2,))
    runs = harness.of(StartProfiling)
    assert sorted(r.gpu_type for r in runs) == ["p100", "v100"]
    assert all(sum(len(d) for d in r.devices.values()) == 1 for r in runs)
    (launch,) = launches
    assert launch.placement.gpus == 2 and not launch.resume
    assert sum(len(d) for d in launch.devices.values()) == 2
    job = harness.machine.state.jobs["j1"]
    assert job.state == JobState.LAUNCHING
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    assert job.state == JobState.RUNNING and job.first_start == 0.0


def test_profiling_budget_is_a_quarter_of_the_cluster() -> None:
    h = Harness()
    for k in range(6):
        h.feed(JobSubmitted(h.stimulus(), spec(f"j{k}")))
    h.feed(RoundTick(h.stimulus(), "first"))
    running = [a for a in h.machine.state.attempts.values() if a.profiling]
    # 10 GPUs: a quarter is 2, at least one job's runs (two types): one job profiles at a time
    assert len(running) == 2 and len({a.job_id for a in running}) == 1
    h.close()


def test_completion_frees_the_gpus_and_records_the_run(harness: Harness) -> None:
    (launch,) = profiled(harness, "j1", (4,))
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    harness.now = 500.0
    out = harness.feed(AttemptEnded(harness.stimulus(), launch.attempt_id, "exited", 0))
    changes = [r for r in harness.records(out) if isinstance(r, JobChange)]
    assert [c.new for c in changes] == [JobState.COMPLETED]
    assert changes[0].counters["running_s"] == 500.0 and changes[0].counters["attained_gpu_s"] == 2000.0
    ended = [r for r in harness.records(out) if isinstance(r, AttemptRow) and r.ended is not None]
    assert [r.id for r in ended] == [launch.attempt_id] and ended[0].end_reason == "exited"
    assert "j1" not in harness.machine.state.jobs and not harness.machine.state.attempts
    assert harness.machine.ended_lr and harness.machine.ended_lr[-1][0] == 500.0


def test_a_preemption_holds_the_gpus_until_the_checkpoint_is_written() -> None:
    # One 4-GPU server fully used: a new job that found no idle GPU for STARVED_ROUNDS rounds takes one
    # for its profiling run from running work, which must checkpoint first. Sooner, it waits.
    h = Harness(servers=SERVERS[:1])
    (first,) = profiled(h, "small", (4,), samples=1e9)
    h.feed(AttemptStarted(h.stimulus(), first.attempt_id))
    h.now = 4 * 3600.0
    h.feed(JobSubmitted(h.stimulus(), spec("big", (4,), 1e5, at=h.now)))
    assert h.of(StartProfiling, h.feed(RoundTick(h.stimulus(), "first"))) == []  # no idle GPU yet
    for _ in range(STARVED_ROUNDS - 1):
        h.now += 120.0
        out = h.feed(RoundTick(h.stimulus(), "first"))
        assert h.of(CheckpointAndStop, out) == [] and h.of(StartProfiling, out) == []
    h.now += 120.0
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert [s.job_id for s in h.of(CheckpointAndStop, out)] == ["small"]
    assert h.of(StartProfiling, out) == [] and h.of(LaunchAttempt, out) == [], "nothing may start yet"
    assert h.machine.state.jobs["small"].state == JobState.CHECKPOINTING
    (waiting,) = [a for a in h.machine.state.attempts.values() if a.job_id == "big"]
    assert not waiting.launched and waiting.devices == {} and waiting.waits_for == {first.attempt_id}
    h.now += 10.0
    out = h.feed(AttemptEnded(h.stimulus(), first.attempt_id, "exited", 75, checkpointed=True))
    (run,) = h.of(StartProfiling, out)
    assert run.job_id == "big" and run.devices == {"v100-1": (0,)}
    small = h.machine.state.jobs["small"]
    assert small.state == JobState.QUEUED and small.has_checkpoint and small.preemptions == 1
    assert small.running_s == pytest.approx(4 * 3600.0 + STARVED_ROUNDS * 120.0 + 10.0)
    h.close()


def _starved_round(
    guarantee: tuple[tuple[str, int], ...], work: list[tuple[str, tuple[int, ...], str]], new_gpus: int = 1
) -> tuple[list[str], Harness]:
    """v100-1 (4 GPUs) and p100-1 (2): `work` (job, GPU counts, tenant) runs (old attempts), then
    vision, guaranteed `guarantee` per type, submits a job of `new_gpus` GPUs that finds no idle GPU; the
    jobs checkpointed once it has starved one round (too soon for the STARVED_ROUNDS rule)."""
    tenants = (TenantQuota("vision", type_guarantees=guarantee), TenantQuota("default"))
    h = Harness(servers=(SERVERS[0], SERVERS[2]), tenants=tenants)
    for job_id, gpus, tenant in work:
        for launch in profiled(h, job_id, gpus, 1e9, tenant=tenant):
            h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    assert sum(a.launched for a in h.machine.state.attempts.values()) == len(work), "the work must run"
    on_v100 = {a.job_id for a in h.machine.state.attempts.values() if "v100-1" in a.devices}
    if any(job_id == "mine" for job_id, _, _ in work):
        assert "mine" in on_v100  # vision holds v100s
    h.now = 4 * 3600.0
    h.feed(JobSubmitted(h.stimulus(), spec("own", (new_gpus,), 1e5, tenant="vision", at=h.now)))
    assert h.of(CheckpointAndStop, h.feed(RoundTick(h.stimulus(), "first"))) == []
    h.now += 120.0  # a round without a profile: the job starves
    out = h.feed(RoundTick(h.stimulus(), "first"))
    return sorted(c.job_id for c in h.of(CheckpointAndStop, out)), h


def test_a_job_owed_gpus_under_a_guarantee_per_type_is_profiled_at_once_on_that_type() -> None:
    # The cluster is full of another tenant's old attempts. vision is owed v100s: its new job, once it
    # has starved a round, is profiled on the v100 GPUs of that work (checkpointed), not on the p100
    # ones, instead of waiting STARVED_ROUNDS rounds and being placed on the transfer estimate alone.
    work = [("borrow", (4,), "default"), ("other", (2,), "default")]
    stopped, h = _starved_round((("v100", 2),), work)
    assert stopped == ["borrow"]
    h.close()
    stopped, h = _starved_round((), work)  # no guarantee: the job waits its STARVED_ROUNDS
    assert stopped == []
    h.close()


@pytest.mark.parametrize(
    ("guarantee", "work", "new_gpus"),
    [
        # vision already holds its 2 v100s
        (
            (("v100", 2),),
            [("mine", (2,), "vision"), ("borrow", (2,), "default"), ("other", (2,), "default")],
            1,
        ),
        # a 2-GPU job is more than a guarantee of one v100 covers
        ((("v100", 1),), [("borrow", (4,), "default"), ("other", (2,), "default")], 2),
    ],
)
def test_a_job_the_guarantee_per_type_does_not_owe_gpus_waits_its_starved_rounds(
    guarantee: tuple[tuple[str, int], ...], work: list[tuple[str, tuple[int, ...], str]], new_gpus: int
) -> None:
    stopped, h = _starved_round(guarantee, work, new_gpus)
    assert stopped == []
    h.close()


def test_cancel_stops_every_attempt_and_ends_the_job(harness: Harness) -> None:
    (launch,) = profiled(harness, "j1", (2,))
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    out = harness.feed(JobCancelled("cancel-1", "j1", by="alice"))
    (stop,) = harness.of(StopAttempt, out)
    assert (
        stop.attempt_id == launch.attempt_id and stop.reason == "cancelled" and stop.stimulus_id == "cancel-1"
    )
    assert "j1" not in harness.machine.state.jobs
    assert launch.attempt_id in harness.machine.state.attempts  # GPUs held until it has stopped
    harness.feed(AttemptEnded(harness.stimulus(), launch.attempt_id, "exited", -15))
    assert not harness.machine.state.attempts
    (reply,) = harness.of(Reply, harness.feed(JobCancelled(harness.stimulus(), "j1")))
    assert reply.status == 409


def test_a_lost_node_requeues_its_jobs_and_takes_no_new_work() -> None:
    h = Harness(settings=ControlSettings(suspect_after_s=15, lost_after_s=60))
    (launch,) = profiled(h, "j1", (4,))
    h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    node = launch.placement.servers[0]
    h.now = 165.0
    for s in SERVERS:
        if s.id != node:
            h.feed(NodeBeat(h.stimulus(), s.id, True))
    h.now = 170.0
    h.feed(HealthTick(h.stimulus()))
    job = h.machine.state.jobs["j1"]
    assert job.state == JobState.QUEUED and job.node_losses == 1 and job.restarts == 1
    out = h.feed(RoundTick(h.stimulus(), "first"))
    (again,) = h.of(LaunchAttempt, out)
    assert node not in again.placement.servers
    h.close()


def test_a_failed_launch_requeues_on_the_nodes_fault_and_fails_on_the_jobs(harness: Harness) -> None:
    (launch,) = profiled(harness, "j1")
    harness.feed(
        AttemptLaunchFailed(harness.stimulus(), launch.attempt_id, job_fault=False, message="unreachable")
    )
    assert harness.machine.state.jobs["j1"].state == JobState.QUEUED
    (again,) = harness.of(LaunchAttempt, harness.feed(RoundTick(harness.stimulus(), "first")))
    out = harness.feed(
        AttemptLaunchFailed(harness.stimulus(), again.attempt_id, job_fault=True, message="no such file")
    )
    (change,) = [r for r in harness.records(out) if isinstance(r, JobChange)]
    assert change.new == JobState.FAILED and "could not start" in change.message


def test_progress_feeds_the_estimator_and_the_job(harness: Harness) -> None:
    (launch,) = profiled(harness, "j1", samples=1e6)
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    harness.now = 100.0
    harness.feed(AttemptProgressed(harness.stimulus(), launch.attempt_id, 5000.0, 50.0))
    assert harness.machine.state.jobs["j1"].done_samples == 5000.0
    servers = {s.id: s for s in SERVERS}
    rate = harness.machine.estimator.config_rate(spec("j1"), launch.placement, servers)
    assert rate is not None and 30.0 < rate <= 60.0  # pulled towards the measured 50 samples/s
    # the attempt's progress is as of this report (a forecast goes on from here), until it grows again:
    # a report that repeats it (a step longer than a heartbeat) leaves the time where the progress was
    attempt = harness.machine.state.attempts[launch.attempt_id]
    assert attempt.progressed_at == 100.0
    harness.now = 105.0
    harness.feed(AttemptProgressed(harness.stimulus(), launch.attempt_id, 5000.0, 50.0))
    assert attempt.progressed_at == 100.0
    harness.now = 110.0
    harness.feed(AttemptProgressed(harness.stimulus(), launch.attempt_id, 5500.0, 50.0))
    assert attempt.progressed_at == 110.0


@pytest.mark.parametrize(("iteration_s", "measured"), [(0.5, 32 * 2 / 0.5), (0.0, 40.0), (1e-320, None)])
def test_a_reported_rate_is_measured_in_the_unit_progress_is_counted_in(
    harness: Harness, iteration_s: float, measured: float | None
) -> None:
    # A rigid 2-GPU job (batch 32): an iteration is 32 x 2 samples of progress. The runtime of its
    # primary rank counts its own rank's samples (40/s reported): the machine measures 64 samples per
    # iteration time instead; a runtime that reports no iteration time is taken at its word; an
    # iteration time that makes no finite rate (the job writes its own progress file) is no measurement.
    (launch,) = profiled(harness, "j1", (2,), samples=1e7)
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    harness.now = 400.0
    run = RunReport(launch.attempt_id, 10.0, 40.0, measuring=True, iteration_s=iteration_s)
    primary = launch.placement.parts[0][0]
    out = harness.feed(NodeReported(harness.stimulus(), primary, (run,), (), False))
    assert harness.machine.state.jobs["j1"].done_samples == 10 * 32 * 2
    samples = [r.samples_per_s for r in harness.records(out) if isinstance(r, ThroughputSample)]
    assert samples == ([] if measured is None else [pytest.approx(measured)])


def test_a_drained_node_gets_no_new_work(harness: Harness) -> None:
    for s in SERVERS[:2]:
        harness.feed(NodeDrained(harness.stimulus(), s.id))
    (launch,) = profiled(harness, "j1", (1, 2))
    assert launch.placement.servers == ("p100-1",)


def test_quiet_rounds_request_no_plan(harness: Harness) -> None:
    (launch,) = profiled(harness, "j1")
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    harness.feed(RoundTick(harness.stimulus(), "first"))
    out = harness.feed(RoundTick(harness.stimulus(), "first"))
    assert harness.of(PlanRequest, out) == []


def test_a_plan_answered_late_is_ignored_when_another_was_asked_for(harness: Harness) -> None:
    harness.auto_plan = False
    harness.feed(JobSubmitted(harness.stimulus(), spec("j1")))
    (first,) = harness.of(PlanRequest, harness.feed(RoundTick(harness.stimulus(), "first")))
    assert harness.of(PlanRequest, harness.feed(RoundTick(harness.stimulus(), "first"))) == []
    assert harness.machine.first_due
    assert first.snapshot.now == harness.now


def test_commands_and_records_are_plain_data() -> None:
    h = Harness()
    profiled(h, "j1", (2,))
    for command in h.commands:
        if isinstance(command, PlanRequest):
            continue
        json.dumps(asdict(command), default=str)  # no live objects inside
    h.close()


@pytest.mark.parametrize("gpus", [(1,), (2,), (1, 2, 4)])
def test_every_launch_gets_distinct_devices(gpus: tuple[int, ...]) -> None:
    h = Harness()
    for k in range(5):
        profiled(h, f"j{k}", gpus)
        for launch in h.of(LaunchAttempt):
            h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    h.close()


def test_a_plan_that_takes_a_launching_jobs_gpus_stops_it_without_a_checkpoint() -> None:
    # A job whose attempt has not started cannot write a checkpoint (LAUNCHING -> CHECKPOINTING is no
    # transition): a plan that moves it elsewhere stops it, and it is queued again once stopped.
    h = Harness(servers=SERVERS[:2])
    (launch,) = profiled(h, "a", (4,), samples=1e9)
    job = h.machine.state.jobs["a"]
    assert job.state == JobState.LAUNCHING
    elsewhere = next(s.id for s in SERVERS[:2] if s.id not in launch.placement.servers)
    h.auto_plan = False
    request = next(c for c in h.feed(RoundTick(h.stimulus(), "first")) if isinstance(c, PlanRequest))
    plan = Plan("first", h.now, {"a": Config.single(elsewhere, 4)})
    out = h.feed(PlanReady(h.stimulus(), request.request_id, plan, (), 0.0))
    (stop,) = h.of(StopAttempt, out)
    assert stop.attempt_id == launch.attempt_id and stop.reason == "migrated"
    assert h.of(CheckpointAndStop, out) == [] and job.state == JobState.LAUNCHING
    h.feed(AttemptEnded(h.stimulus(), launch.attempt_id, "exited", -15))
    assert job.state == JobState.QUEUED and job.migrations == 1 and not job.has_checkpoint
    h.close()


def test_submissions_to_a_full_cluster_ask_for_no_plan_until_a_gpu_is_freed() -> None:
    h = Harness(servers=SERVERS[:1])
    (first,) = profiled(h, "big", (4,), samples=1e9)
    h.feed(AttemptStarted(h.stimulus(), first.attempt_id))
    h.now += 10.0
    # the one server is full: the waiting job fits nowhere, and one submission after another within
    # IDLE_RECHECK_S is taken as finding it still full
    for k in range(3):
        out = h.feed(JobSubmitted(h.stimulus(), spec(f"w{k}", at=h.now)))
        assert not h.of(PlanSoon, out)
        h.now += 0.1
    # the GPUs are freed: the next submission, within the same second, asks for a fragment plan
    out = h.feed(AttemptEnded(h.stimulus(), first.attempt_id, "exited", 0))
    out += h.feed(JobSubmitted(h.stimulus(), spec("w3", at=h.now)))
    assert len(h.of(PlanSoon, out)) == 1
    h.close()


def profiled_on_v100_only(h: Harness, job_id: str, gpus: tuple[int, ...]) -> None:
    """Submit a job while the p100 server is drained: profiled on v100 alone, it queues."""
    h.feed(NodeDrained(h.stimulus(), "p100-1", True))
    h.feed(JobSubmitted(h.stimulus(), spec(job_id, gpus, samples=1e9, at=h.now)))
    out = h.feed(RoundTick(h.stimulus(), "first"))
    runs = [r for r in h.of(StartProfiling, out) if r.job_id == job_id]
    assert [r.gpu_type for r in runs] == ["v100"], runs
    for run in runs:
        h.feed(AttemptStarted(h.stimulus(), run.attempt_id))
        h.feed(AttemptEnded(h.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    assert h.machine.state.jobs[job_id].state == JobState.QUEUED
    h.feed(NodeDrained(h.stimulus(), "p100-1", False))


def test_a_queued_job_missing_a_types_profile_is_placed_before_it_is_profiled_there(
    harness: Harness,
) -> None:
    """A queued job profiled on one GPU type only is planned first: placed on idle GPUs at once, it
    gets no profiling run on the other type (a run taken before the plan kept it out of plans for the
    run's length, GPUs idle meanwhile). One the plan leaves waiting is profiled on the GPUs it leaves
    idle."""
    h = harness
    profiled_on_v100_only(h, "j1", (1,))
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert h.of(StartProfiling, out) == []
    assert [c.job_id for c in h.of(LaunchAttempt, out)] == ["j1"]
    # all ten GPUs at once: it waits while j1 runs, and the plan leaves nine idle for its p100 run
    profiled_on_v100_only(h, "j2", (10,))
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert [(r.job_id, r.gpu_type) for r in h.of(StartProfiling, out)] == [("j2", "p100")]
    assert h.of(LaunchAttempt, out) == []


@pytest.mark.parametrize("baseline", ["sia-lr", "gavel-lr", "fifo"])
def test_the_baselines_profile_a_queued_job_before_they_plan_it(baseline: str) -> None:
    """Sia profiles a job on every GPU type before it schedules it: the baselines keep that order."""
    settings = ControlSettings()
    h = Harness(policy=make_policy(baseline, settings.scheduler))
    profiled_on_v100_only(h, "j1", (1,))
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert [(r.job_id, r.gpu_type) for r in h.of(StartProfiling, out)] == [("j1", "p100")]
    assert h.of(LaunchAttempt, out) == []
    h.close()


def test_an_attempt_on_more_gpus_than_the_smallest_count_is_measured_by_the_work_it_does(
    harness: Harness,
) -> None:
    # An elastic job (1 or 2 GPUs, batch 32) given 2 GPUs: a runtime of protocol 3 reports its work in
    # iterations at 1 GPU (each step does 2 of them) and the machine measures 32 x 2 samples per
    # iteration time, the unit the estimator predicts in; done is that work x 32 x 1.
    (launch,) = profiled(harness, "j1", (1, 2), samples=1e7)
    assert launch.placement.gpus == 2
    harness.feed(AttemptStarted(harness.stimulus(), launch.attempt_id))
    harness.now = 400.0
    run = RunReport(launch.attempt_id, 20.0, 40.0, measuring=True, iteration_s=0.5, work_counted=True)
    out = harness.feed(NodeReported(harness.stimulus(), launch.placement.parts[0][0], (run,), (), False))
    assert harness.machine.state.jobs["j1"].done_samples == 20 * 32
    samples = [r.samples_per_s for r in harness.records(out) if isinstance(r, ThroughputSample)]
    assert samples == [pytest.approx(32 * 2 / 0.5)]


def test_a_job_for_one_server_is_placed_on_one_and_refused_when_none_can_hold_it(harness: Harness) -> None:
    # 8 GPUs only across the two 4-GPU v100 servers: a job that may span gets them, one for one
    # server gets 4 on one of them; one that needs 8 on one server is refused, naming the field
    (wide,) = profiled(harness, "j1", (4, 8), samples=1e9)
    assert wide.placement.gpus == 8 and len(wide.placement.parts) == 2
    h = Harness()
    (launch,) = profiled(h, "j2", (4, 8), samples=1e9, one_server=True)
    assert launch.placement.gpus == 4 and len(launch.placement.parts) == 1
    (reply,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), replace(spec("j3", (8,)), one_server=True))))
    assert (
        reply.status == 422 and reply.error_field == "one_server" and "largest has 4" in (reply.error or "")
    )
    assert "j3" not in h.machine.state.jobs
    h.close()


def test_no_planner_path_launches_a_job_for_one_server_over_two(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a planner that ignores the flag (a baseline, a fallback) stands in: the machine does not launch
    # its placement over two servers, and says why
    from hopsmgr.core import configs

    generate = configs.generate
    monkeypatch.setattr(configs, "may_span", lambda *args: True)
    monkeypatch.setattr(
        configs, "generate", lambda job, *a, **k: generate(replace(job, one_server=False), *a, **k)
    )
    out = harness.feed(JobSubmitted(harness.stimulus(), replace(spec("j1", (4, 8), 1e9), one_server=True)))
    out += harness.feed(RoundTick(harness.stimulus(), "first"))
    for run in harness.of(StartProfiling, out):
        out += harness.feed(AttemptStarted(harness.stimulus(), run.attempt_id))
        out += harness.feed(AttemptEnded(harness.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    out += harness.feed(RoundTick(harness.stimulus(), "fragment"))
    assert harness.of(LaunchAttempt, out) == []
    notes = [r for r in harness.records(out) if getattr(r, "kind", "") == "not_launched"]
    assert notes and "spans servers" in notes[0].message


def test_a_reservation_for_a_job_for_one_server_holds_one_server() -> None:
    # reservations on: a wide job's reservation gathers whole servers; for one submitted for one
    # server it holds one, and the job launches there (over two, the machine would refuse it forever)
    from hopsmgr.core.settings import SchedulerSettings

    scheduler = SchedulerSettings(reservations=True, reserve_min_gpus=4, reserve_after_lr=0.0)
    h = Harness(settings=ControlSettings(scheduler=scheduler))
    (launch,) = profiled(h, "j1", (4, 8), samples=1e9, one_server=True)
    assert launch.placement.parts in ((("v100-1", 4),), (("v100-2", 4),))
    h.close()
