"""Start intervals calibrated by what happened (split conformal prediction over recent jobs).

The futures' P10-P90 spread comes from the rate errors and arrivals they sample; it leaves out how
far their greedy plan (hopsmgr.forecast.policy) and everything else not modelled can be from what
the master then does, so on its own it is too narrow. `Residuals` keeps, for recent jobs that have
started, how far the actual wait was from the P50 forecast made for them (the first one, made while
they waited), in units of the larger of that forecast wait and a round: r = (actual - forecast) /
max(forecast, round_s). Once `min_count` jobs are in, `widen` moves each start P10 and P90 out to at
least the P50 forecast plus the residuals' lower and upper split-conformal bounds (never before the
forecast was made): with n residuals, the floor((n + 1) * 0.1)-th smallest and the ceil((n + 1) * 0.9)-th
smallest, the finite-sample quantiles under which a new job's residual falls outside each bound with
probability at most 10% when jobs are exchangeable; they exist from n = 9 on, hence `min_count`.

Jobs are not exchangeable when the load moves (a queue that keeps growing makes every wait longer than
the last jobs' residuals say), so the two tails' levels adapt to what happened (adaptive conformal
inference, Gibbs and Candes, NeurIPS 2021): when a job starts, each tail's level moves by
`gamma * (0.1 - miss)`, `miss` 1 if the start fell outside that side of the interval first shown for
the job, else 0; a side that misses more than 10% of the time widens until it does not, and one that
misses less narrows back, but never past the split-conformal bound: a level never rises above 10%,
nor falls below FLOOR (-1/4: an open tail closes again after at most 50 starts in their intervals).
(Without that ceiling the first jobs of a quiet cluster, which start at once and inside any interval,
raised the levels to 0.2-0.26 within 30 jobs in bench/forecast.py's carried load, narrowing the
intervals to the residuals' 74th-80th percentiles before the first waits; the misses that followed
were what brought them back.) A level at or below 0 leaves that side unbounded (a P90 "past what can
be said", None, as past the horizon). Over any run of jobs the share of misses on each side stays at
most (0.1 + gamma) / (gamma * jobs) above 10%, whatever the load does (the ceiling gives up only the
bound on how far below 10% it can be: a side the split-conformal bound covers better stays as is).

A miss above is often known long before the job starts: in a queue that grows, the jobs that will
start above their intervals are the ones still waiting, and learning of them only at their start
(hours later) leaves the levels behind the load. So `StartTracker.waiting` takes each job still waiting
past the P90 first shown for it as the miss it will be, at once: its observation (above, not below)
adapts the levels then, once, and not again when it starts (its residual still comes at its start).
Each job is still observed once, so the bound above holds, loosened by the misses observed while a side
was already open (of intervals shown before it opened), as it was with misses learnt at the start.
For the same reason the started jobs' residuals are the short waits' more than the long ones': a job
still waiting past its P50 forecast has a residual of at least (now - P50) / scale (right-censored), so
the upper bound is taken over the residuals and these least values together (each is at most its
job's residual to come, so the bound is at most the one those jobs' residuals will give). The lower
bound stays the started jobs' (the censored ones could only raise it: a narrower interval on what is
not known yet).
Pure: the callers say what started and when it is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from hopsmgr.forecast.live import JobForecast

MIN_COUNT = 9  # the fewest residuals for which both conformal bounds below are finite
TAIL = Fraction(1, 10)  # each bound's miscoverage (exact: ranks must not round up): 80% in all
KEEP = 500
GAMMA = Fraction(1, 20)  # how fast a tail's level follows its misses (adaptive conformal inference)
# The lowest a level goes. A level at or below 0 shows an open tail, which cannot miss, so with misses
# learnt at once a level stays above -GAMMA; misses learnt late (thousands of waiting jobs found past
# their P90 at once) would drive it so far below 0 that the tail stayed open for tens of thousands of
# starts. At -1/4 an open tail closes again after at most 50 starts (each in-interval start adds
# GAMMA x TAIL = 0.005), and a drift that goes on keeps it open (tests/forecast/test_calibrate.py).
FLOOR = Fraction(-1, 4)


@dataclass(slots=True)
class Residuals:
    round_s: float
    min_count: int = MIN_COUNT
    values: deque[float] = field(default_factory=lambda: deque(maxlen=KEEP))
    gamma: Fraction = GAMMA
    # each tail's miscoverage level (TAIL at first and at most), moved by the misses the callers `observe`
    low_level: Fraction = TAIL
    high_level: Fraction = TAIL
    # the least residuals of the jobs still waiting past their P50 forecast, as of the last `censor`
    censored: list[float] = field(default_factory=list)
    # (values, values and censored), sorted: what `bounds` reads, kept until either changes
    ordered: tuple[list[float], list[float]] | None = field(default=None, repr=False, compare=False)

    def censor(self, least: list[float]) -> None:
        """The jobs waiting now past their P50 forecast: each one's residual is at least that in `least`."""
        self.censored = list(least)
        self.ordered = None

    def observe(self, below: bool, above: bool, count: int = 1) -> None:
        """`count` jobs started below (`below`) or above (`above`) the interval first shown for them, or
        in it: each level moves as `count` single observations would, within [FLOOR, TAIL]."""
        self.low_level = _within(self.low_level + self.gamma * count * (TAIL - int(below)))
        self.high_level = _within(self.high_level + self.gamma * count * (TAIL - int(above)))

    def add(self, forecast_wait_s: float, actual_wait_s: float) -> None:
        """A job started `actual_wait_s` after a forecast that said `forecast_wait_s` (its P50)."""
        scale = max(forecast_wait_s, self.round_s)
        self.values.append((actual_wait_s - forecast_wait_s) / scale)
        self.ordered = None

    def bounds(self) -> tuple[float, float] | None:
        """The split-conformal lower and upper bounds of the residuals (module docstring), the upper one
        over the censored residuals too, each at its least; None until `min_count` jobs are in, or while
        the bounds do not exist yet."""
        n = len(self.values)
        if n < self.min_count:
            return None
        low_rank, high_rank = math.floor((n + 1) * TAIL), math.ceil((n + 1) * (1 - TAIL))
        if low_rank < 1 or high_rank > n:
            return None
        # the adapted levels; at or below 0 a tail has no bound (the past's residuals are not enough)
        low_rank = min(math.floor((n + 1) * self.low_level), n)
        if self.ordered is None:
            self.ordered = sorted(self.values), sorted([*self.values, *self.censored])
        xs, ys = self.ordered
        low = xs[low_rank - 1] if low_rank >= 1 else -math.inf
        m = len(ys)
        high_rank = max(math.ceil((m + 1) * (1 - self.high_level)), 1)
        high = ys[high_rank - 1] if high_rank <= m else math.inf
        return low, high

    def widen(self, forecast: JobForecast) -> JobForecast:
        """`forecast` with its start P10-P90 widened to at least a round either side of its P50 and
        to the recent residuals' (these from `min_count` on; jobs with no start forecast are left as
        they are). Before `min_count`, a forecast of one
        future (a queue so large that one is all the time limit allows: hopsmgr.forecast.run) has
        no interval to show, its P10 = P50 = P90: both tails are left open (P10 the instant it was
        made, P90 None), as the adapted levels leave them, and no start can miss them (a point
        would be missed by nearly every job, and those misses would open the tails for the next
        fifty starts, long after the residuals could bound them)."""
        found = self.bounds()
        p10, p50, p90 = forecast.start_p10, forecast.start_p50, forecast.start_p90
        if found is None and p50 is not None and forecast.futures < 2:
            return replace(forecast, start_p10=forecast.made, start_p90=None)
        if p50 is None:
            return forecast
        made = forecast.made
        # [ours] no interval narrower than a round either side of P50: the futures start a job at
        # their rounds, the live planner at its own, after profiling runs the futures do not model; on
        # a small cluster every future agrees, and a point interval was missed by nearly every start
        # before the residuals were in (and its misses then opened the upper tail for many starts)
        p10 = max(made, p50 - self.round_s) if p10 is None else min(p10, max(made, p50 - self.round_s))
        p90 = None if p90 is None else max(p90, p50 + self.round_s)
        if found is None:
            return replace(forecast, start_p10=p10, start_p90=p90)
        lo, hi = found
        scale = max(p50 - made, self.round_s)
        low = max(made, p50 + lo * scale)
        high = max(made, p50 + hi * scale)
        return replace(
            forecast,
            start_p10=low if p10 is None else min(p10, low),
            start_p90=None if p90 is None or not math.isfinite(high) else max(p90, high),
        )


@dataclass(slots=True)
class StartTracker:
    """The first start forecast of each waiting job, turned into a residual once the job starts, and
    the interval first shown for it, whose misses adapt the residuals' levels."""

    residuals: Residuals
    # job -> (made, raw start P50, shown start P10, shown start P90)
    first: dict[str, tuple[float, float, float | None, float | None]] = field(default_factory=dict)
    # waiting jobs past their shown P90: a miss above, observed when it became known (`waiting`)
    overdue: set[str] = field(default_factory=set)

    def note(self, forecasts: Mapping[str, JobForecast]) -> None:
        """Keep the first P50 start forecast of every job that has one (the raw futures', not widened),
        and the interval shown with it (widened)."""
        for job_id, f in forecasts.items():
            if f.start_p50 is not None and job_id not in self.first:
                shown = self.residuals.widen(f)
                self.first[job_id] = (f.made, f.start_p50, shown.start_p10, shown.start_p90)

    def started(self, job_id: str, at: float) -> None:
        """The job's first start was at `at`; a start before its forecast was made is not a start of
        the wait forecast (the job waited for a restart after a preemption): no residual."""
        found = self.first.pop(job_id, None)
        known = job_id in self.overdue
        self.overdue.discard(job_id)
        if found is not None and at >= found[0]:
            made, p50, p10, p90 = found
            self.residuals.add(p50 - made, at - made)
            if not known:  # an overdue job's miss was observed when it became known
                self.residuals.observe(p10 is not None and at < p10, p90 is not None and at > p90)

    def waiting(self, now: float) -> None:
        """Every job the tracker holds still waits at `now` (the callers have reported each start up to
        `now` with `started`): each one past the P90 first shown for it will start above its interval,
        a miss known now, observed now (module docstring), once; each one past its P50 forecast has a
        residual of at least (now - P50) / scale, which the upper bound counts (`Residuals.censor`)."""
        round_s = self.residuals.round_s
        self.residuals.censor(
            [(now - p50) / max(p50 - made, round_s) for made, p50, _, _ in self.first.values() if now > p50]
        )
        known = [
            job_id
            for job_id, (_, _, _, p90) in self.first.items()
            if p90 is not None and now > p90 and job_id not in self.overdue
        ]
        if known:
            self.overdue.update(known)
            self.residuals.observe(False, True, count=len(known))

    def forget(self, job_id: str) -> None:
        """A job that ended without starting (cancelled, failed): no residual (a miss above observed
        while it waited stays observed: it was one for as long as the job waited)."""
        self.first.pop(job_id, None)
        self.overdue.discard(job_id)


def _within(level: Fraction) -> Fraction:
    return max(FLOOR, min(TAIL, level))
