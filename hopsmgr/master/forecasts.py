"""The master's forecasts: the live state copied on the event loop, the queue forecast in a thread.

Every `interval_s` (the round length, at least 5 s) while jobs wait, the loop takes a copy of the
state machine's state (hopsmgr.forecast.future.capture) and hands it to a worker thread that runs
hopsmgr.forecast.run.forecast within `budget_s`; the answer replaces `ctl.forecasts` (job id ->
JobForecast), which the API's job summaries and explanations show. Submission times seen in live jobs
form the recent arrival process the futures draw new jobs from.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import structlog

from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.future import capture
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.master.controller import Controller

log = structlog.get_logger("hopsmgr.master")
WINDOW_S = 6 * 3600.0
WAITING = (JobState.PENDING, JobState.PROFILING, JobState.QUEUED)


class Forecaster:
    def __init__(self, ctl: Controller, settings: ForecastSettings | None = None) -> None:
        self.ctl = ctl
        self.settings = settings or ForecastSettings()
        self.interval_s = max(5.0, ctl.config.scheduler.round_seconds)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="forecast")
        self.seen: set[str] = set()
        self.recent: deque[float] = deque(maxlen=20_000)
        self.made_ms: deque[float] = deque(maxlen=1000)

    def _note_arrivals(self) -> None:
        for job in self.ctl.machine.state.jobs.values():
            if job.id not in self.seen:
                self.seen.add(job.id)
                self.recent.append(job.submitted)

    async def once(self) -> None:
        ctl = self.ctl
        self._note_arrivals()
        if not any(j.state in WAITING for j in ctl.machine.state.jobs.values()):
            ctl.forecasts = {}
            return
        now = ctl.clock()
        live = capture(ctl.machine, now, [t for t in self.recent if t >= now - WINDOW_S], WINDOW_S)
        t0 = time.perf_counter()
        result = await asyncio.get_running_loop().run_in_executor(
            self.pool, forecast, live, self.settings, time.perf_counter
        )
        self.made_ms.append((time.perf_counter() - t0) * 1000)
        ctl.forecasts = result

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: logged, the forecasts go stale, the master goes on
                log.exception("forecast_failed", error=repr(exc))
            await asyncio.sleep(self.interval_s)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
