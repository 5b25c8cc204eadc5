"""Forecasting the whole queue: sampled futures until the time budget is spent, then quantiles per job.

`forecast(live, settings, timer)` runs Future after Future (hopsmgr.forecast.future), each with its own
seed (its own rate errors and arrivals), at least `min_futures` and at most `max_futures`, and stops
starting new ones once `budget_s` has passed by `timer` (which only measures: the forecast's own time
is simulated); past `min_futures`, a future is begun only if it is expected to end within the budget
(the longest one so far), so the forecast does not overrun its budget by a whole future. `limit_s` is
the hard bound that `min_futures` yields to: past the first future, none is begun that is expected to
end after it (a queue of a thousand jobs on 512 GPUs, where one future takes seconds, is then forecast
from fewer futures, its intervals widened by the calibration, rather than late). Each live job gets
P10/P50/P90 of its next start (waiting jobs) and of its completion.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hopsmgr.core.estimator import Estimator
from hopsmgr.forecast.future import Future, FutureOptions
from hopsmgr.forecast.live import WAITING, JobForecast, LiveState, quantile

Timer = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ForecastSettings:
    budget_s: float = 2.0
    min_futures: int = 3
    max_futures: int = 16
    limit_s: float = 5.0  # past the first future, none expected to end later than this (min_futures too)
    seed: int = 0
    future: FutureOptions = field(default_factory=FutureOptions)

    def __post_init__(self) -> None:
        # NaN would compare false everywhere: no budget and no limit, silently (math.inf: none, openly)
        for name in ("budget_s", "limit_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"forecast settings: {name} must be a number > 0, got {value!r}")


def forecast(
    live: LiveState, settings: ForecastSettings, timer: Timer, only: str | None = None
) -> dict[str, JobForecast]:
    """Every live job's forecast, or (`only`) that one job's: each future then stops once it ended."""
    t0 = timer()
    waiting = {j.id for j in live.jobs if j.state in WAITING}
    starts: dict[str, list[float]] = {j.id: [] for j in live.jobs}
    finishes: dict[str, list[float]] = {j.id: [] for j in live.jobs}
    runs = 0
    longest = 0.0  # the longest future so far
    options = settings.future
    while runs < settings.max_futures:
        begun = timer()
        elapsed = begun - t0
        if runs >= settings.min_futures and (
            elapsed >= settings.budget_s or elapsed + longest > settings.budget_s
        ):
            break
        if runs >= 1 and elapsed + longest > settings.limit_s:
            break
        future = Future(live, settings.seed + runs, options, Estimator.from_state(live.estimator), timer)
        future.go(only)
        if future.planner_fell_back:  # the planner cannot answer in time here: the next futures don't ask
            options = replace(options, exact_s=0.0)
        runs += 1
        longest = max(longest, timer() - begun)
        for job_id in future.forecastable if only is None else future.forecastable & {only}:
            starts[job_id].append(future.started.get(job_id, math.inf))
            finishes[job_id].append(future.finished.get(job_id, math.inf))
    out: dict[str, JobForecast] = {}
    for job in live.jobs:
        if only is not None and job.id != only:
            continue
        s, f = starts[job.id], finishes[job.id]
        if not f:
            continue
        waits = job.id in waiting
        out[job.id] = JobForecast(
            start_p10=quantile(s, 0.1) if waits else None,
            start_p50=quantile(s, 0.5) if waits else None,
            start_p90=quantile(s, 0.9) if waits else None,
            finish_p10=quantile(f, 0.1),
            finish_p50=quantile(f, 0.5),
            finish_p90=quantile(f, 0.9),
            futures=len(f),
            made=live.now,
            horizon=live.now + settings.future.horizon_s,
            start_within=sum(1 for t in s if math.isfinite(t)) / len(s) if waits and s else None,
        )
    return out
