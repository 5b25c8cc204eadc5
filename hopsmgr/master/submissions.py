"""A submission (hopsmgr.protocol.Submission) as the job it describes: the tenant it may submit to, its
GPU counts, its work in samples and the jobs it still waits for (`--after`), checked field by field
(RequestError naming the field) into a `JobSpec`. Plain functions: the controller
(hopsmgr.master.controller, `Controller.spec_for`) hands in its clock, its check of which jobs the
submitter may see and the live jobs, and adds the state machine's own refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import JobSpec, ModelError, RequirementSet
from hopsmgr.master.access import Principal
from hopsmgr.master.errors import RequestError
from hopsmgr.master.store import Row
from hopsmgr.protocol import Submission


def job_spec(
    who: Principal,
    sub: Submission,
    *,
    default_run_s: float,
    visible: Callable[[Principal, str], Row],
    live: Container[str],
    clock: Callable[[], float],
) -> JobSpec:
    """The job `sub` describes, submitted by `who` now (`clock`), its id "j-new": RequestError naming
    the field it cannot accept. `visible`: the row of a job `who` may see (RequestError otherwise);
    `live`: the ids of the live jobs; `default_run_s`: the run time of a job without the runtime and
    without --time. The state machine's refusals (tenant, GPU counts) are not checked here."""
    tenant = sub.tenant or who.tenant
    if not who.admin and tenant != who.tenant:
        raise RequestError(
            403, "tenant", f"user {who.user!r} of tenant {who.tenant!r} cannot submit to {tenant!r}"
        )
    try:
        requirements = RequirementSet.of(sub.gpus)
    except ModelError as exc:
        raise RequestError(400, "gpus", str(exc)) from exc
    batch_size = sub.batch_size or 1
    if not sub.runtime:  # work in seconds at nominal speed (hopsmgr.core.estimator.RUN_TIME_PROFILE)
        run_s = sub.time_s or default_run_s
        samples = JobSpec.samples_from_iterations(run_s, 1, requirements)
    elif sub.samples is not None:
        samples = sub.samples
    else:
        assert sub.iterations is not None
        samples = JobSpec.samples_from_iterations(sub.iterations, batch_size, requirements)
    after = dependencies(who, sub.after, visible=visible, live=live)
    now = clock()
    try:
        return JobSpec(
            id="j-new",
            requirements=requirements,
            total_samples=samples,
            batch_size=batch_size,
            runtime=sub.runtime,
            preemptible=sub.runtime or sub.checkpoint_signal is not None,
            time_limit_s=sub.time_s,
            after=after,
            one_server=sub.one_server,
            tenant=tenant,
            user=who.user,
            name=sub.name,
            params_bytes=sub.params * 4.0,
            submit_time=now,
            restart_s=10.0 + sub.params * 4.0 * 2 / 200e6,  # start-up + checkpoint write and read
        )
    except ModelError as exc:
        raise RequestError(400, None, str(exc)) from exc


def dependencies(
    who: Principal,
    after: tuple[str, ...],
    *,
    visible: Callable[[Principal, str], Row],
    live: Container[str],
) -> tuple[str, ...]:
    """The jobs of `after` still to wait for (those in `live`); refused: one the submitter cannot see
    (`visible` raises), or one that ended without completing (this job could never start)."""
    waiting = []
    for dep in after:
        try:
            row = visible(who, dep)
        except RequestError:
            raise RequestError(422, "after", f"no job {dep!r} to wait for") from None
        if dep in live:
            waiting.append(dep)
        elif row["state"] != JobState.COMPLETED.value:
            raise RequestError(
                422, "after", f"job {dep} ended {row['state']}: a job after it could never start"
            )
    return tuple(waiting)
