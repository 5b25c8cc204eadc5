"""The master's forecasts: the live state copied on the event loop, the queue forecast off it.

Every `interval_s` (the round length but at most REFRESH_S, at least 5 s, and at least DUTY_FACTOR
times the last forecast's duration, so forecasting takes at most a fifth of a core) while jobs wait, the loop takes a
copy of the state machine's state (hopsmgr.forecast.live.capture) and hands it to the forecast worker
that runs hopsmgr.forecast.run.forecast within `budget_s` (and, for a large queue whose futures take
seconds each, within `limit_s` but for its first future); the answer replaces `ctl.forecasts` (job id
-> JobForecast), which the API's job summaries and explanations show. The state machine's submission
times (`SchedulerMachine.submissions`, since this master began to lead) form the recent arrival
process the futures draw new jobs from.

Where the master plans in a process of its own (`master.planner = "process"`, the default), forecasts
and what-ifs run in two worker processes of their own too (hopsmgr.master.worker: niced, started on
first use; the state is copied by pickling it, the estimator as the updates since the last forecast to
the copy the forecast worker keeps: `forecast_following`), so they never hold the event loop's lock;
with `planner = "thread"`, in daemon threads (a master that stops does not wait for one under way).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import structlog

from hopsmgr.core.estimator import Estimator
from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.calibrate import Residuals, StartTracker
from hopsmgr.forecast.live import LiveState, capture
from hopsmgr.forecast.run import ForecastSettings, JobForecast, forecast
from hopsmgr.master import live_wire
from hopsmgr.master.controller import Controller
from hopsmgr.master.planner_process import LoggedEstimator, Update, apply_updates
from hopsmgr.master.worker import WorkerProcess

log = structlog.get_logger("hopsmgr.master")
WINDOW_S = 6 * 3600.0
WAITING = (JobState.PENDING, JobState.PROFILING, JobState.QUEUED)
DUTY_FACTOR = 4.0
REFRESH_S = 30.0
FORECAST_TIMEOUT_S = 300.0  # a forecast worker silent this long is replaced (forecasts go stale meanwhile)
WHAT_IF_TIMEOUT_S = 60.0
PRELOAD_JOBS = 500  # jobs sent ahead of a forecast per call, when the worker lacks more than this
_T = TypeVar("_T")


_MIRROR: dict[str, Estimator] = {}  # in the forecast worker: the master's estimator, by token
_HELD: dict[str, live_wire.Held] = {}  # in the forecast worker: the jobs of the last forecast


def forecast_following(
    message: tuple[Any, ...],
    token: str,
    whole: dict[str, Any] | None,
    updates: list[Update],
    settings: ForecastSettings,
    timer: Callable[[], float],
) -> dict[str, JobForecast] | None:
    """In the forecast worker: bring its copy of the master's estimator up to date (`whole` replaces
    it; else `updates` are replayed on the copy named `token`), then forecast the live state of
    `message` (hopsmgr.master.live_wire) with it. None when this worker has no such copy (it was
    replaced, or it does not hold a job the message names): the caller then sends the whole state,
    and every job."""
    if whole is not None:
        _MIRROR.clear()
        _MIRROR[token] = Estimator.from_state(whole)
    elif token not in _MIRROR:
        return None
    try:
        live, _HELD[token] = live_wire.decode(message, _HELD.get(token, {}))
    except ValueError:
        _MIRROR.clear()
        _HELD.clear()
        return None
    estimator = _MIRROR[token]
    apply_updates(estimator, updates)
    return forecast(replace(live, estimator=estimator.export_state()), settings, timer)


def preload_jobs(token: str, changed: live_wire.Changed) -> int:
    """In the forecast worker: take jobs sent ahead of a forecast (hopsmgr.master.live_wire); how many
    it holds."""
    for other in [t for t in _HELD if t != token]:
        del _HELD[other]
    _HELD[token] = live_wire.hold(changed, _HELD.get(token, {}))
    return len(_HELD[token])


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
        # every round, but at least every REFRESH_S: a forecast shown for a whole 120-s round was often
        # past (its P50 behind, the job still waiting) before the next one came
        self.interval_s = max(5.0, min(REFRESH_S, ctl.config.scheduler.round_seconds))
        self.last_s = 0.0
        self.observed_since = ctl.clock()  # submissions are noted from here on (the window is cut here)
        self.made_ms: deque[float] = deque(maxlen=1000)
        # start intervals widened by how far recent jobs' starts were from their forecasts
        # (a round of the futures: they plan at most once a minute, however short the master's round)
        round_s = max(ctl.config.scheduler.round_seconds, self.settings.future.min_round_s)
        self.tracker = StartTracker(Residuals(round_s=round_s))
        self.in_process = ctl.config.master.planner == "process"
        self.worker = WorkerProcess("hopsmgr-forecast")
        # the forecast worker's copy of the estimator: which one (a new worker has none) and whether the
        # next call must send it whole
        self.token = uuid.uuid4().hex
        self.resend = True
        self.what_if_worker = WorkerProcess("hopsmgr-what-if")
        # The estimator as it was when this forecaster began to follow it (at the master's start, when
        # exporting it is cheap or done before serving), and every update since: what a worker without
        # a copy is sent, instead of a whole export taken on the loop later (0.23 s at 10,000 jobs).
        self.base: dict[str, Any] | None = None
        self.since_base: list[Update] = []
        self.held: live_wire.Held = {}  # the jobs the forecast worker holds (as of its last forecast)
        estimator = ctl.machine.estimator
        if self.in_process and isinstance(estimator, LoggedEstimator):
            self.base = estimator.export_state()
            estimator.take_updates("forecast")  # follows from now on

    def capture(self, now: float, *, with_estimator: bool = True) -> LiveState:
        """The live state to forecast from (the machine's own records where offload will pickle them)."""
        recent = self.recent_arrivals(now)
        return capture(
            self.ctl.machine,
            now,
            recent,
            WINDOW_S,
            next_round=self._next_round(now),
            copy_records=not self.in_process,
            with_estimator=with_estimator,
            observed_since=self.observed_since,
        )

    def _next_round(self, now: float) -> float | None:
        """When the round loop's next first plan is due (no sooner than now: one running late starts as
        soon as it can); None (a round from now) before the loop's first tick."""
        due = self.ctl.next_round_at
        return None if due is None else max(due, now)

    async def offload(self, fn: Callable[..., _T], *args: Any, what_if: bool = False) -> _T:
        """`fn(*args)` off the event loop: in a worker process (pickled at once, before any await) or a
        daemon thread (`args` must then be copies the loop will not change)."""
        if not self.in_process:
            return await in_daemon_thread(fn, *args)
        worker = self.what_if_worker if what_if else self.worker
        result: _T = await worker.call(
            fn, *args, timeout_s=WHAT_IF_TIMEOUT_S if what_if else FORECAST_TIMEOUT_S
        )
        return result

    async def _following(self, now: float, estimator: LoggedEstimator) -> dict[str, JobForecast]:
        """The forecast from a worker that keeps its own copy of the estimator, sent the updates since
        the last forecast (pickling the whole estimator took 0.1 s of the loop per 5,000 jobs)."""
        for _ in range(2):
            await self._preload()
            live = self.capture(now, with_estimator=False)
            updates = estimator.take_updates("forecast")  # (follows from now on)
            whole: dict[str, Any] | None = None
            if updates is None:  # was not following (the log dropped it): the base is of no use
                self.base, self.since_base = None, []
            if self.resend and self.base is not None and updates is not None:
                self.since_base += updates
                whole, updates = self.base, self.since_base
            elif self.resend or updates is None:
                whole, updates = estimator.export_state(), []
            self.resend = True  # until this call has answered: a failure may have lost the updates
            message, held = live_wire.encode(live, self.held)
            self.held = {}  # until this call has answered
            found: dict[str, JobForecast] | None = await self.worker.call(
                forecast_following,
                message,
                self.token,
                whole,
                updates or [],
                self.settings,
                time.perf_counter,
                timeout_s=FORECAST_TIMEOUT_S,
            )
            if found is not None:
                self.resend = False
                self.base, self.since_base = None, []  # the worker holds its copy now
                self.held = held
                return found
        raise RuntimeError("the forecast worker refused the whole estimator state")

    async def _preload(self) -> None:
        """Send the forecast worker, PRELOAD_JOBS at a time, the live jobs it does not hold (first
        forecast, a replaced worker), the loop serving others between two slices."""
        missing = [j for j in self.ctl.machine.state.jobs.values() if j.spec.id not in self.held]
        if len(missing) <= PRELOAD_JOBS:
            return  # they go with the forecast
        for start in range(0, len(missing), PRELOAD_JOBS):
            changed, rows = live_wire.encode_jobs(missing[start : start + PRELOAD_JOBS], self.held)
            try:
                await self.worker.call(preload_jobs, self.token, changed, timeout_s=FORECAST_TIMEOUT_S)
            except BaseException:
                self.held = {}
                raise
            self.held.update(rows)

    def recent_arrivals(self, now: float) -> list[float]:
        """Submission times of the last WINDOW_S (the arrival process futures draw new jobs from)."""
        return [t for t in self.ctl.machine.submissions if t >= now - WINDOW_S]

    def _note_starts(self) -> None:
        jobs = self.ctl.machine.state.jobs
        for job_id in list(self.tracker.first):
            job = jobs.get(job_id)
            if job is None:
                self.tracker.forget(job_id)  # ended (it may have started: the store knows, not needed)
            elif job.first_start is not None:
                self.tracker.started(job_id, job.first_start)
        self.tracker.waiting(self.ctl.clock())  # the rest wait: those past their P90 are known misses

    async def once(self) -> None:
        ctl = self.ctl
        self._note_starts()
        if not any(ctl.machine.state.counts.get(s) for s in WAITING):
            ctl.forecasts = {}
            return
        await asyncio.sleep(0)  # the loop serves others before the state is copied (each a pass over jobs)
        now = ctl.clock()
        t0 = time.perf_counter()
        estimator = ctl.machine.estimator
        if self.in_process and isinstance(estimator, LoggedEstimator):
            result = await self._following(now, estimator)
        else:
            result = await self.offload(forecast, self.capture(now), self.settings, time.perf_counter)
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
        """Stop the workers; a forecast under way in a daemon thread runs on, unused."""
        self.worker.close()
        self.what_if_worker.close()
