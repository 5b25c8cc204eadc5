"""Jobs whose command does not use hopsmgr.runtime, time limits and impossible submissions, driven
through the scheduler state machine event by event.

A job without the runtime (`JobSpec.runtime` False, `hopsmgr submit --no-runtime`) gets no profiling
run: it is queued at once, placed from the servers' calibration and its expected run time, and a
plan never stops it unless it is preemptible (it has a checkpoint signal); then an exit 0 after the
signal means it saved its own checkpoint. `--time` limits the run; a profiling run that never writes
a profile is cut off; a job no placement can ever hold is refused at submission.
"""

from __future__ import annotations

from dataclasses import replace

from hopsmgr.control.commands import CheckpointAndStop, LaunchAttempt, Reply, StartProfiling, StopAttempt
from hopsmgr.control.events import AttemptEnded, AttemptStarted, HealthTick, JobSubmitted, NodeBeat, RoundTick
from hopsmgr.control.settings import ControlSettings
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Calibration, JobSpec, RequirementSet, Server
from hopsmgr.core.settings import SchedulerSettings
from tests.control.harness import PROFILE, Harness, spec

ONE_SERVER = (Server("s1", "v100", 2, order=1),)


def no_runtime(job_id: str, gpus: int = 2, run_s: float = 36_000.0, *, preemptible: bool = False) -> JobSpec:
    return JobSpec(
        id=job_id,
        requirements=RequirementSet.rigid(gpus),
        total_samples=run_s * gpus,  # what the master makes of --time: seconds at nominal speed
        batch_size=1,
        runtime=False,
        preemptible=preemptible,
    )


def start(h: Harness, job: JobSpec) -> LaunchAttempt:
    """Submit (a runtime job with its profiles known), plan, and confirm the launch."""
    types = {s.gpu_type for s in h.servers}
    profiles = {t: (PROFILE, Calibration()) for t in types} if job.runtime else {}
    out = h.feed(JobSubmitted(h.stimulus(), job, profiles=profiles))
    out += h.feed(RoundTick(h.stimulus(), "first"))
    (launch,) = [c for c in h.of(LaunchAttempt, out) if c.job_id == job.id]
    h.feed(AttemptStarted(h.stimulus(), launch.attempt_id))
    return launch


def tick(h: Harness) -> list[object]:
    """Every node beats, then the health tick (where the time limits are checked)."""
    for server in h.servers:
        h.feed(NodeBeat(h.stimulus(), server.id, True, server, server.gpus))
    return h.feed(HealthTick(h.stimulus()))


def contend(h: Harness) -> list[object]:
    """A short, profiled job waits behind the running one for hours: rounds the while."""
    out = h.feed(JobSubmitted(h.stimulus(), replace(spec("short", (2,), samples=2e4), submit_time=h.now)))
    out += h.feed(RoundTick(h.stimulus(), "first"))
    for run in h.of(StartProfiling, out):
        out += h.feed(AttemptStarted(h.stimulus(), run.attempt_id))
        out += h.feed(AttemptEnded(h.stimulus(), run.attempt_id, "exited", 0, profile=PROFILE))
    for _ in range(12):
        h.now += 1800.0
        out += h.feed(RoundTick(h.stimulus(), "first"))
    return out


def test_a_job_without_the_runtime_is_queued_without_profiling_and_placed_from_calibration() -> None:
    servers = (
        Server("slow", "v100", 2, Calibration(compute_factor=0.5), order=1),
        Server("fast", "v100", 2, Calibration(compute_factor=1.5), order=2),
    )
    h = Harness(servers=servers)
    out = h.feed(JobSubmitted(h.stimulus(), no_runtime("j1")))
    job = h.machine.state.jobs["j1"]
    assert job.state == JobState.QUEUED
    changes = [r for r in h.records(out) if getattr(r, "new", None) == JobState.QUEUED]
    assert "no profiling run" in changes[0].message and "never preempted" in changes[0].message
    out = h.feed(RoundTick(h.stimulus(), "first"))
    assert h.of(StartProfiling, out) == []
    (launch,) = h.of(LaunchAttempt, out)
    assert launch.placement.servers == ("fast",)
    # its expected run time at nominal speed is its work: 36000 s on a server 1.5x nominal
    assert h.machine.estimator.config_rate(job.spec, launch.placement, {s.id: s for s in servers}) == 3.0
    h.close()


def test_a_job_without_the_runtime_is_never_preempted_but_a_runtime_job_is() -> None:
    h = Harness(servers=ONE_SERVER)
    start(h, spec("long", (2,), samples=1e12))
    out = contend(h)
    assert [c.job_id for c in h.of(CheckpointAndStop, out)] == ["long"]  # the control case
    h.close()

    h = Harness(servers=ONE_SERVER)
    start(h, no_runtime("pinned"))
    out = contend(h)
    assert h.of(CheckpointAndStop, out) == [] and h.of(StopAttempt, out) == []
    assert h.machine.state.jobs["pinned"].state == JobState.RUNNING
    assert h.machine.state.jobs["short"].state in (JobState.PENDING, JobState.QUEUED)  # it waits
    h.close()


def test_with_a_checkpoint_signal_it_is_preempted_and_exit_0_after_it_means_checkpointed() -> None:
    h = Harness(servers=ONE_SERVER)
    launch = start(h, no_runtime("own", preemptible=True))
    out = contend(h)
    (stop,) = h.of(CheckpointAndStop, out)
    assert stop.attempt_id == launch.attempt_id
    out = h.feed(AttemptEnded(h.stimulus(), launch.attempt_id, "exited", 0))
    job = h.machine.state.jobs["own"]
    assert job.state in (JobState.QUEUED, JobState.LAUNCHING) and job.has_checkpoint and job.preemptions == 1
    h.close()


def test_a_job_fails_once_it_ran_past_its_time_limit(harness: Harness) -> None:
    h = harness
    launch = start(h, replace(spec("j1", (1,), samples=1e12), time_limit_s=600.0))
    h.now += 500.0
    assert h.of(StopAttempt, tick(h)) == []
    h.now += 200.0
    out = tick(h)
    assert [s.attempt_id for s in h.of(StopAttempt, out)] == [launch.attempt_id]
    assert "j1" not in h.machine.state.jobs
    (change,) = [r for r in h.records(out) if getattr(r, "new", None) == JobState.FAILED]
    assert "past its --time limit of 600 s" in change.message
    h.feed(AttemptEnded(h.stimulus(), launch.attempt_id, "exited", -15))


def test_a_profiling_run_that_writes_no_profile_in_time_fails_its_job_at_once_with_the_reason() -> None:
    settings = ControlSettings(scheduler=SchedulerSettings(profiling_timeout_s=300.0))
    h = Harness(settings=settings)
    out = h.feed(JobSubmitted(h.stimulus(), spec("j1")))
    out += h.feed(RoundTick(h.stimulus(), "first"))
    runs = h.of(StartProfiling, out)
    assert runs
    for run in runs:
        h.feed(AttemptStarted(h.stimulus(), run.attempt_id))
    h.now += 301.0
    out = tick(h)
    assert sorted(s.attempt_id for s in h.of(StopAttempt, out)) == sorted(r.attempt_id for r in runs)
    (change,) = [r for r in h.records(out) if getattr(r, "new", None) == JobState.FAILED]
    assert "wrote no profile within 300 s" in change.message and "--no-runtime" in change.message
    for run in runs:
        h.feed(AttemptEnded(h.stimulus(), run.attempt_id, "exited", -15))
    h.close()


def test_a_job_no_placement_can_ever_hold_is_refused_with_the_reason() -> None:
    servers = (Server("a", "v100", 4, order=1), Server("b", "k80", 2, order=2))
    # With mixed_types (the default) a placement may span the types: only the cluster's size bounds it.
    h = Harness(servers=servers)
    (reply,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j7", (7,)))))
    assert reply.status == 422 and reply.error_field == "gpus"
    assert "exceeds the cluster's 6 GPUs" in (reply.error or "")
    (ok,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j5", (5,)))))
    assert ok.error is None
    h.close()
    one_type = ControlSettings(scheduler=SchedulerSettings(mixed_types=False))
    h = Harness(servers=servers, settings=one_type)
    (reply,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j5", (5,)))))
    assert reply.status == 422 and reply.error_field == "gpus"
    assert "no placement can ever hold 5 GPUs" in (reply.error or "")
    assert "k80: 2, v100: 4" in (reply.error or "")
    assert "j5" not in h.machine.state.jobs
    (ok,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j4", (4, 5)))))
    assert ok.error is None
    h.close()


def test_a_log_excerpt_leads_with_the_last_line() -> None:
    from hopsmgr.control.acting import log_excerpt

    log = "Traceback (most recent call last):\n  File \"x.py\", line 1\n\nKeyError: 'lr'\n"
    text = log_excerpt(log)
    assert text.splitlines()[0] == "KeyError: 'lr'"
    assert text.endswith("KeyError: 'lr'") and "Traceback (most recent call last):" in text
    assert log_excerpt("") == "" and log_excerpt("one line\n") == "one line"
    long = "\n".join(f"line {i} " + "x" * 100 for i in range(100))
    assert len(log_excerpt(long)) < 1700 and log_excerpt(long).startswith("line 99")


def test_a_job_after_another_waits_for_it_and_is_cancelled_when_it_fails() -> None:
    h = Harness(servers=(Server("s1", "v100", 4, order=1),))
    first = start(h, no_runtime("first", gpus=1))
    out = h.feed(JobSubmitted(h.stimulus(), replace(no_runtime("second", gpus=1), after=("first",))))
    assert any("runs after first completes" in getattr(r, "message", "") for r in h.records(out))
    chained = replace(no_runtime("third", gpus=1), after=("second",))
    h.feed(JobSubmitted(h.stimulus(), chained))
    for _ in range(3):  # idle GPUs, yet neither is placed while what it runs after is live
        h.now += 60.0
        out = h.feed(RoundTick(h.stimulus(), "first"))
        assert {c.job_id for c in h.of(LaunchAttempt, out)} <= {"first"}
    h.feed(AttemptEnded(h.stimulus(), first.attempt_id, "exited", 0))
    h.now += 60.0
    out = h.feed(RoundTick(h.stimulus(), "first"))
    (second,) = h.of(LaunchAttempt, out)
    assert second.job_id == "second" and h.machine.state.jobs["third"].state == JobState.QUEUED
    h.feed(AttemptStarted(h.stimulus(), second.attempt_id))
    out = h.feed(AttemptEnded(h.stimulus(), second.attempt_id, "exited", 1))
    cancelled = [r for r in h.records(out) if getattr(r, "new", None) == JobState.CANCELLED]
    assert [r.job_id for r in cancelled] == ["third"]
    assert "second, which it runs after, ended FAILED" in cancelled[0].message
    assert h.machine.state.jobs == {}
    h.close()


def test_a_job_the_caps_per_gpu_type_leave_no_room_for_is_refused_with_the_reason() -> None:
    from hopsmgr.core.model import TenantQuota

    servers = (Server("a", "v100", 4, order=1), Server("b", "k80", 2, order=2))
    capped = (TenantQuota("default", type_caps=(("v100", 1),)),)
    h = Harness(servers=servers, tenants=capped)  # mixed types: 1 v100 + 2 k80 at most
    (reply,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j4", (4,)))))
    assert reply.status == 422 and reply.error_field == "gpus"
    assert "exceeds the 3 GPUs the tenant may hold under the caps per GPU type of tenant 'default'" in (
        reply.error or ""
    )
    (ok,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j3", (3,)))))
    assert ok.error is None
    h.close()
    one_type = ControlSettings(scheduler=SchedulerSettings(mixed_types=False))
    h = Harness(servers=servers, tenants=capped, settings=one_type)
    (reply,) = h.of(Reply, h.feed(JobSubmitted(h.stimulus(), spec("j3", (3,)))))
    assert (
        reply.status == 422
        and "the largest has 2 GPUs under the caps per GPU type of tenant 'default'" in (reply.error or "")
    )
    assert "k80: 2, v100: 1" in (reply.error or "")
    h.close()
