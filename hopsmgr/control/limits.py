"""Time limits the scheduler state machine enforces at each health tick (hopsmgr.control.nodes.on_health).

A job that has run longer than its `--time` (`JobSpec.time_limit_s`) fails and its attempt is stopped;
a profiling run that has written no profile within `scheduler.profiling_timeout_s` is stopped, and its
job fails at once with a reason that names what to do (use hopsmgr.runtime, or submit with
--no-runtime) instead of running a whole training inside its profiling run.
"""

from __future__ import annotations

from hopsmgr.control.context import MachineCore
from hopsmgr.control.snapshot import PLACED
from hopsmgr.core.lifecycle import JobState


def enforce_limits(m: MachineCore) -> None:
    """Time limits: a job that ran past its `--time` fails, and so does one whose profiling run
    wrote no profile within `scheduler.profiling_timeout_s`; their attempts are stopped."""
    for job in list(m.state.jobs.values()):
        limit = job.spec.time_limit_s
        if limit is None or job.attempt is None or job.state not in PLACED:
            continue
        attempt = m.state.attempts[job.attempt]
        ran = job.running_s + (m.now - attempt.started if attempt.started is not None else 0.0)
        if ran > limit:
            m.set_state(
                job,
                JobState.FAILED,
                "walltime",
                f"ran {ran:.0f} s, past its --time limit of {limit:.0f} s",
            )
            attempt.stop_reason = "walltime"
            m.emit_stop(attempt)
    cap = m.settings.scheduler.profiling_timeout_s
    for attempt in list(m.state.attempts.values()):
        since = attempt.started if attempt.started is not None else attempt.created
        if not attempt.profiling or not attempt.launched or attempt.stopping or m.now - since <= cap:
            continue
        message = (
            f"profiling run {attempt.id} on {attempt.primary} wrote no profile within {cap:.0f} s"
            " (scheduler.profiling_timeout_s): in profile mode the command must use hopsmgr.runtime"
            " (or one of its integrations), which exits after HOPS_PROFILE_ITERS iterations;"
            " submit a script without it with --no-runtime"
        )
        owner = m.state.jobs.get(attempt.job_id)
        if owner is not None and owner.state in (JobState.PENDING, JobState.PROFILING):
            owner.failures += 1
            others = [m.state.attempts[a] for a in sorted(owner.profiling) if a in m.state.attempts]
            m.set_state(owner, JobState.FAILED, "failed", message)
            for other in others:
                other.stop_reason = "job_ended"
                m.emit_stop(other)
        else:
            if owner is not None:
                m.note(owner, "profiling_timeout", message)
            attempt.stop_reason = "job_ended"
            m.emit_stop(attempt)
