"""The master's forecasts: the live state copied on the event loop, the queue forecast in a thread.

Every `interval_s` (the round length, at least 5 s, and at least DUTY_FACTOR times the last
forecast's duration, so forecasting takes at most a fifth of a core) while jobs wait, the loop takes a
copy of the state machine's state (hopsmgr.forecast.future.capture) and hands it to a daemon thread (a
master that stops does not wait for a forecast under way) that runs hopsmgr.forecast.run.forecast
within `budget_s`; the answer replaces `ctl.forecasts` (job id ->
JobForecast), which the API's job summaries and explanations show. Submission times seen in live jobs
form the recent arrival process the futures draw new jobs from.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.calibrate import Residuals, StartTracker
from hopsmgr.forecast.future import capture
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.master.controller import Controller

log = structlog.get_logger("hopsmgr.master")
WINDOW_S = 6 * 3600.0
WAITING = (JobState.PENDING, JobState.PROFILING, JobState.QUEUED)
DUTY_FACTOR = 4.0
_T = TypeVar("_T")


def in_daemon_thread(fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
    """Run `fn(*args)` in a daemon thread; its result (or error) arrives in the returned future."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: the master stopped meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="forecast", daemon=True).start()
    return done


class Forecaster:
    def __init__(self, ctl: Controller, settings: ForecastSettings | None = None) -> None:
        self.ctl = ctl
        self.settings = settings or ForecastSettings()
        self.interval_s = max(5.0, ctl.config.scheduler.round_seconds)
        self.last_s = 0.0
        self.seen: set[str] = set()
        self.recent: deque[float] = deque(maxlen=20_000)
        self.made_ms: deque[float] = deque(maxlen=1000)
        # start intervals widened by how far recent jobs' starts were from their forecasts
        self.tracker = StartTracker(Residuals(round_s=ctl.config.scheduler.round_seconds))

    def _note_arrivals(self) -> None:
        for job in self.ctl.machine.state.jobs.values():
            if job.id not in self.seen:
                self.seen.add(job.id)
                self.recent.append(job.submitted)

    def recent_arrivals(self, now: float) -> list[float]:
        """Submission times of the last WINDOW_S (the arrival process futures draw new jobs from)."""
        self._note_arrivals()
        return [t for t in self.recent if t >= now - WINDOW_S]

    def _note_starts(self) -> None:
        jobs = self.ctl.machine.state.jobs
        for job_id in list(self.tracker.first):
            job = jobs.get(job_id)
            if job is None:
                self.tracker.forget(job_id)  # ended (it may have started: the store knows, not needed)
            elif job.first_start is not None:
                self.tracker.started(job_id, job.first_start)

    async def once(self) -> None:
        ctl = self.ctl
        self._note_arrivals()  # also when nothing waits: the arrival process counts every submission
        self._note_starts()
        if not any(j.state in WAITING for j in ctl.machine.state.jobs.values()):
            ctl.forecasts = {}
            return
        now = ctl.clock()
        live = capture(ctl.machine, now, self.recent_arrivals(now), WINDOW_S)
        t0 = time.perf_counter()
        result = await in_daemon_thread(forecast, live, self.settings, time.perf_counter)
        self.last_s = time.perf_counter() - t0
        self.made_ms.append(self.last_s * 1000)
        self.tracker.note(result)
        ctl.forecasts = {job_id: self.tracker.residuals.widen(f) for job_id, f in result.items()}

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: logged, the forecasts go stale, the master goes on
                log.exception("forecast_failed", error=repr(exc))
            await asyncio.sleep(max(self.interval_s, DUTY_FACTOR * self.last_s))

    def close(self) -> None:
        """Nothing to wait for: a forecast under way runs on in its daemon thread, unused."""
