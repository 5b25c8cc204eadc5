"""The live state a forecast starts from, and what a forecast answers.

`capture` copies what the master's state machine holds (jobs, open attempts, nodes, tenants, the
estimator's state) and its recent submissions at `now` into a `LiveState`, which
hopsmgr.forecast.future runs forward; `JobForecast` holds the quantiles over those futures
(hopsmgr.forecast.run) of each job's next start and its completion.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hopsmgr.control.machine import SchedulerMachine
from hopsmgr.control.records import Attempt, EndedJob, Job, NodeHealth
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import Server, ServerId, TenantQuota
from hopsmgr.core.settings import SchedulerSettings

WAITING = (JobState.PENDING, JobState.PROFILING, JobState.QUEUED)
OBSERVED_MIN_S = 3600.0  # the shortest window of submissions a forecast takes the arrival rate over


@dataclass(frozen=True, slots=True)
class LiveState:
    now: float
    servers: tuple[Server, ...]  # as the planner sees them
    usable: dict[ServerId, int]
    healthy: frozenset[ServerId]  # nodes that take new work (healthy, reachable)
    drained: frozenset[ServerId]
    tenants: tuple[TenantQuota, ...]
    jobs: tuple[Job, ...]
    attempts: tuple[Attempt, ...]
    attempt_seq: int
    estimator: dict[str, Any]  # Estimator.export_state()
    recent: tuple[float, ...] = ()  # submission times seen lately (the arrival process)
    window_s: float = 6 * 3600.0  # the span `recent` covers
    round_s: float = 300.0
    next_round: float = 0.0
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)  # the planner's settings
    ended: tuple[EndedJob, ...] = ()  # completed jobs submitted within the window (a recent sample)
    # how long the latest profiled jobs' profiling took, PROFILING to QUEUED (seconds each)
    profiling_waits: tuple[float, ...] = ()

    def profiling_left(self, elapsed: float) -> float:
        """How much longer a job's profiling will take once it has taken `elapsed` seconds: the median of
        what the latest profiling runs that took longer than that took beyond it (0: none took longer)."""
        longer = [w - elapsed for w in self.profiling_waits if w > elapsed]
        return statistics.median(longer) if longer else 0.0


@dataclass(frozen=True, slots=True)
class JobForecast:
    """Quantiles (Unix times) over the sampled futures; None where fewer than that share started/ended."""

    start_p10: float | None
    start_p50: float | None
    start_p90: float | None
    finish_p10: float | None
    finish_p50: float | None
    finish_p90: float | None
    futures: int
    made: float
    # how far every future looked (Unix time): a null quantile says "not before this" (None: unknown)
    horizon: float | None = None
    # the share of the futures that started the job within the horizon (None: it does not wait). On an
    # overloaded cluster a wide or long job either starts soon or waits until the arrivals ebb: a start
    # P50 of None beside a P10 says "not within the horizon in most futures, soon in the others"
    start_within: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "start_p10": self.start_p10,
            "start_p50": self.start_p50,
            "start_p90": self.start_p90,
            "finish_p10": self.finish_p10,
            "finish_p50": self.finish_p50,
            "finish_p90": self.finish_p90,
            "futures": self.futures,
            "made": self.made,
            "horizon": self.horizon,
            "start_within": self.start_within,
        }


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (linear between order statistics); None when it falls on a missing (inf) value."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if not math.isfinite(xs[hi]):
        return None
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def capture(
    machine: SchedulerMachine,
    now: float,
    recent: Sequence[float] = (),
    window_s: float = 6 * 3600.0,
    next_round: float | None = None,
    copy_records: bool = True,
    with_estimator: bool = True,
    observed_since: float | None = None,
) -> LiveState:
    """A copy of the machine's state at `now` that a forecast can run from (in another thread). With
    `copy_records` false its jobs and attempts are the machine's own objects: only for a caller that
    copies the result at once (pickles it for a worker process) before the machine changes them.
    Without `with_estimator` its estimator state is left empty (for a worker that keeps its own copy).
    `observed_since`: when the caller began to note submissions; a window reaching back before then
    would hold too few of them (the arrival rate of a master's or a replay's first hours divided by
    the whole window), so it is cut there, to no less than OBSERVED_MIN_S (a few submissions over
    minutes would give a rate as wrong the other way)."""
    state = machine.state
    s = machine.settings
    healthy = frozenset(
        n.server.id
        for n in state.nodes.values()
        if n.health == NodeHealth.HEALTHY
        and not n.drained
        and now - n.exec_error_at >= s.exec_error_backoff_s
    )
    round_s = s.scheduler.round_seconds
    if observed_since is not None:
        window_s = min(window_s, max(now - observed_since, OBSERVED_MIN_S))
    jobs, attempts = list(state.jobs.values()), list(state.attempts.values())
    return LiveState(
        now=now,
        servers=tuple(n.server for n in state.nodes.values()),
        usable={n.server.id: n.usable_gpus for n in state.nodes.values()},
        healthy=healthy,
        drained=frozenset(n.server.id for n in state.nodes.values() if n.drained),
        tenants=tuple(state.tenants.values()),
        jobs=tuple(copy.deepcopy(jobs) if copy_records else jobs),
        attempts=tuple(copy.deepcopy(attempts) if copy_records else attempts),
        attempt_seq=machine.attempt_seq,
        estimator=machine.estimator.export_state() if with_estimator else {},
        recent=tuple(recent),
        window_s=window_s,
        round_s=round_s,
        next_round=now + round_s if next_round is None else next_round,
        scheduler=s.scheduler,
        ended=tuple(e for e in machine.recently_ended if e.submitted >= now - window_s),
        profiling_waits=tuple(machine.profiling_waits),
    )
