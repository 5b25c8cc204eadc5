"""What-if forecasts: a job not submitted yet, or a waiting job with another requirement set.

Both change a copy of the live state (hopsmgr.forecast.live.LiveState) and forecast one job in it
with the queue forecast's own futures (hopsmgr.forecast.run), each stopped once that job has ended:
`with_new_job` adds the job a submission describes, as if submitted now (id WHAT_IF_ID; it borrows
the profile of a profiled job alike, as unprofiled live jobs do); `with_requirements` gives a waiting
job another set of GPU counts (the same work). Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from hopsmgr.control.records import Job
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import JobSpec, RequirementSet
from hopsmgr.forecast.live import WAITING, JobForecast, LiveState
from hopsmgr.forecast.run import ForecastSettings, Timer, forecast

WHAT_IF_ID = "what-if"
# A what-if answers a request: a shorter budget than the queue forecast's, fewer futures at least.
WHAT_IF_SETTINGS = ForecastSettings(budget_s=1.0, min_futures=1, max_futures=12)


class NotWaiting(ValueError):
    """The job of a requirement what-if is not waiting (running or ended): nothing to forecast."""


def with_new_job(live: LiveState, spec: JobSpec) -> LiveState:
    """The live state with `spec` submitted at its `now` (as WHAT_IF_ID)."""
    now = live.now
    job = Job(
        spec=replace(spec, id=WHAT_IF_ID, submit_time=now),
        # as the machine takes a submission: a job without the runtime is queued, no profiling run
        state=JobState.PENDING if spec.runtime else JobState.QUEUED,
        submitted=now,
        state_since=now,
    )
    return replace(live, jobs=(*live.jobs, job))


def with_requirements(live: LiveState, job_id: str, requirements: RequirementSet) -> LiveState:
    """The live state with waiting job `job_id` asking for `requirements` instead (KeyError: no such
    live job; NotWaiting: it is not waiting)."""
    found = next((j for j in live.jobs if j.id == job_id), None)
    if found is None:
        raise KeyError(job_id)
    if found.state not in WAITING:
        raise NotWaiting(f"job {job_id} is {found.state.name}, not waiting")
    changed = replace(found, spec=replace(found.spec, requirements=requirements))
    return replace(live, jobs=tuple(changed if j.id == job_id else j for j in live.jobs))


def forecast_job(
    live: LiveState, job_id: str, timer: Timer, settings: ForecastSettings = WHAT_IF_SETTINGS
) -> JobForecast | None:
    """One job's forecast in `live`; None when nothing could be forecast (no profiled job to go by)."""
    return forecast(live, settings, timer, only=job_id).get(job_id)
