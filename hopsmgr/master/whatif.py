"""What-if forecasts over the API: a submission's forecast without storing it (`submit --dry-run`),
and a waiting job's forecast with other GPU counts (`explain JOB --gpus 2,4`).

Both take a copy of the live state on the event loop (hopsmgr.forecast.live.capture), change it
(hopsmgr.forecast.whatif) and forecast the one job off the event loop, as the queue forecast does
(hopsmgr.master.forecasts: a worker process of its own, or a daemon thread), within WHAT_IF_SETTINGS' budget; one at a time, at most MAX_IN_LINE
waiting (more are refused with 429, so requests cannot pile forecasts onto the master). Nothing is
stored and the queue's own forecasts are untouched.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from typing import Any

from hopsmgr.core.model import ModelError, RequirementSet
from hopsmgr.forecast.live import LiveState
from hopsmgr.forecast.whatif import (
    WHAT_IF_ID,
    NotWaiting,
    forecast_job,
    with_new_job,
    with_requirements,
)
from hopsmgr.master.access import Principal
from hopsmgr.master.controller import Controller, RequestError
from hopsmgr.master.forecasts import Forecaster
from hopsmgr.master.schemas import GPUS_PATTERN
from hopsmgr.master.worker import WorkerError, WorkerTimeout
from hopsmgr.protocol import Submission

MAX_IN_LINE = 4
NO_PROFILE = "no forecast: no profiled job to take its speed from yet"


class WhatIfs:
    def __init__(self, ctl: Controller, forecaster: Forecaster) -> None:
        self.ctl = ctl
        self.forecaster = forecaster
        self.lock = asyncio.Lock()
        self.in_line = 0

    async def _forecast(self, live: LiveState, job_id: str) -> dict[str, Any] | None:
        try:
            found = await self.forecaster.offload(forecast_job, live, job_id, time.perf_counter, what_if=True)
        except (WorkerError, WorkerTimeout) as exc:
            raise RequestError(503, None, f"the what-if forecast failed: {exc}") from exc
        if found is None:
            return None
        # shown as the queue's forecasts are: its start interval widened by the calibration (not
        # noted by it: no job will start to check it against)
        return self.forecaster.tracker.residuals.widen(found).as_dict()

    def _live(self) -> LiveState:
        return self.forecaster.capture(self.ctl.clock())

    async def _one_at_a_time(self) -> None:
        if self.in_line >= MAX_IN_LINE:
            raise RequestError(429, None, f"{self.in_line} what-if forecasts are in line: try again soon")
        self.in_line += 1
        await self.lock.acquire()

    def _done(self) -> None:
        self.lock.release()
        self.in_line -= 1

    async def dry_run(self, who: Principal, sub: Submission) -> dict[str, Any]:
        """The job `sub` describes, checked as a submission is, and its forecast as if submitted now."""
        spec = self.ctl.spec_for(who, sub)
        await self._one_at_a_time()
        try:
            forecast = await self._forecast(with_new_job(self._live(), spec), WHAT_IF_ID)
        finally:
            self._done()
        return {
            "tenant": spec.tenant,
            "user": spec.user,
            "name": spec.name,
            "gpus": list(spec.requirements.counts),
            "total_samples": spec.total_samples,
            "forecast": forecast,
            "note": None if forecast else NO_PROFILE,
        }

    async def other_gpus(self, job_id: str, gpus: str) -> dict[str, Any]:
        """Waiting job `job_id`'s forecast had it asked for the GPU counts `gpus` ("2,4")."""
        if not re.fullmatch(GPUS_PATTERN, gpus):
            raise RequestError(
                400, "gpus", f"must be GPU counts separated by commas (2,4), got {gpus[:80]!r}"
            )
        try:
            requirements = RequirementSet.of(int(g) for g in gpus.split(","))
        except ModelError as exc:
            raise RequestError(400, "gpus", str(exc)) from exc
        job = self.ctl.machine.state.jobs.get(job_id)
        if job is None:
            raise RequestError(409, "gpus", f"job {job_id} has ended: nothing to forecast")
        refused = self.ctl.machine.refusal(replace(job.spec, id=WHAT_IF_ID, requirements=requirements))
        if refused is not None:
            raise RequestError(refused.status, "gpus", refused.error or "refused")
        await self._one_at_a_time()
        try:
            try:
                live = with_requirements(self._live(), job_id, requirements)
            except (KeyError, NotWaiting) as exc:
                raise RequestError(409, "gpus", f"job {job_id} is not waiting: nothing to forecast") from exc
            forecast = await self._forecast(live, job_id)
        finally:
            self._done()
        return {
            "gpus": list(requirements.counts),
            "forecast": forecast,
            "note": None if forecast else NO_PROFILE,
        }
