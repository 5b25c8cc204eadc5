"""Run metrics (HOPS.md section 8): makespan, JCT, waits, latency ratios, FTF rho, fragments, utilisation.

Pure functions over `JobRecord`s and `RoundRecord`s written by the simulator or the master. Times are in
seconds unless a name says hours (`_h`). A metric with nothing to measure is None, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job's history, finished or not.

    `waited_s` sums all queue periods; `expected_run_s` is the job's age (run time without waiting, the
    latency ratio's denominator); `ideal_s` is the FTF ideal time (None: use `expected_run_s`).
    `completed` is False for a job that failed, was cancelled or had not finished when the run stopped.
    """

    job_id: str
    tenant: str
    gpus_min: int
    submit_time: float
    first_start: float | None
    end_time: float | None
    waited_s: float
    expected_run_s: float
    ideal_s: float | None = None
    completed: bool = True


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One scheduling round (or one plan within a round) as seen right after planning."""

    start: float
    idle_gpus_after_plan: int
    jobs_waiting: int
    solver_s: float = 0.0
    busy_gpus: int = 0
    total_gpus: int = 0
    # [ours] the most GPUs free on any one server after planning, and the smallest GPU count of the
    # waiting jobs a plan could place (not profiling, not waiting for another job): the plan left such
    # a job waiting beside GPUs it may have fitted (`placeable_idle_per_round`)
    largest_free_block: int = 0
    smallest_waiting: int | None = None


def mean(values: Iterable[float]) -> float | None:
    items = list(values)
    if not items:
        return None
    return math.fsum(items) / len(items)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) with linear interpolation between closest ranks; None if empty."""
    if not (0.0 <= q <= 100.0):
        raise ValueError(f"percentile q must be within [0, 100], got {q!r}")
    items = sorted(values)
    if not items:
        return None
    position = (len(items) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(items) - 1)
    fraction = position - low
    return items[low] + (items[high] - items[low]) * fraction


def cdf(values: Iterable[float]) -> list[tuple[float, float]]:
    """Empirical CDF: each distinct value, ascending, with the fraction of values <= it."""
    items = sorted(values)
    total = len(items)
    points: list[tuple[float, float]] = []
    for index, value in enumerate(items):
        if index + 1 < total and items[index + 1] == value:
            continue
        points.append((value, (index + 1) / total))
    return points


def makespan_s(records: Iterable[JobRecord]) -> float | None:
    """First submission to last end (any job that ended, completed or not); None if no job ended."""
    items = list(records)
    ends = [r.end_time for r in items if r.end_time is not None]
    if not items or not ends:
        return None
    return max(ends) - min(r.submit_time for r in items)


def jct_s(records: Iterable[JobRecord]) -> list[float]:
    """Job completion times (end - submit) of the completed jobs."""
    return [r.end_time - r.submit_time for r in records if r.completed and r.end_time is not None]


def waits_s(records: Iterable[JobRecord]) -> list[float]:
    """Total queue time of every job (an unfinished job counts the wait it has had so far)."""
    return [r.waited_s for r in records]


def latency_ratios(records: Iterable[JobRecord]) -> list[float]:
    """waited_s / expected_run_s of every job whose age is known (finite and positive)."""
    return [
        r.waited_s / r.expected_run_s
        for r in records
        if math.isfinite(r.expected_run_s) and r.expected_run_s > 0
    ]


def ftf_rhos(records: Iterable[JobRecord]) -> list[float]:
    """Finish-time fairness rho = (end - submit) / ideal of completed jobs with a known positive ideal."""
    rhos: list[float] = []
    for r in records:
        if not r.completed or r.end_time is None:
            continue
        ideal = r.ideal_s if r.ideal_s is not None else r.expected_run_s
        if math.isfinite(ideal) and ideal > 0:
            rhos.append((r.end_time - r.submit_time) / ideal)
    return rhos


def fragments_per_round(rounds: Iterable[RoundRecord]) -> float | None:
    """Mean over rounds of the idle GPUs left after planning while jobs still wait (HOPS.md section 8).

    A round with no waiting job counts as 0 fragments; None for no rounds.
    """
    return mean(r.idle_gpus_after_plan if r.jobs_waiting > 0 else 0 for r in rounds)


def fragments_per_waiting_round(rounds: Iterable[RoundRecord]) -> float | None:
    """[ours] Mean idle GPUs after planning over the rounds in which jobs wait (the stricter reading
    of "idle GPUs per round while work waits"); None when no round had a waiting job."""
    return mean(r.idle_gpus_after_plan for r in rounds if r.jobs_waiting > 0)


def placeable_idle_per_round(rounds: Iterable[RoundRecord]) -> float | None:
    """[ours] Mean over rounds of the idle GPUs left after planning while a waiting job would fit in one
    server's free GPUs by its smallest count (0 in other rounds); None for no rounds.

    A sign of placements a plan missed, not a bound: it does not ask whether the job may use that
    server's GPU type or whether its tenant's cap allows it (so it may count GPUs no waiting job could
    use), and it does not count placements across servers (so it may miss some).
    """

    def placeable(r: RoundRecord) -> bool:
        return r.smallest_waiting is not None and r.smallest_waiting <= r.largest_free_block

    return mean(r.idle_gpus_after_plan if r.jobs_waiting > 0 and placeable(r) else 0 for r in rounds)


def utilisation(rounds: Iterable[RoundRecord]) -> float | None:
    """Mean busy / total GPUs over the rounds that had any GPU; None if none did."""
    return mean(r.busy_gpus / r.total_gpus for r in rounds if r.total_gpus > 0)


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / HOUR_S


def _max(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def summary(records: Iterable[JobRecord], rounds: Iterable[RoundRecord]) -> dict[str, float | int | None]:
    """The headline numbers of a run (the columns of HOPS.md section 9, plus a few more)."""
    jobs = list(records)
    plans = list(rounds)
    jcts = jct_s(jobs)
    lrs = latency_ratios(jobs)
    return {
        "jobs": len(jobs),
        "completed": sum(1 for r in jobs if r.completed),
        "makespan_h": _hours(makespan_s(jobs)),
        "avg_jct_h": _hours(mean(jcts)),
        "p50_jct_h": _hours(percentile(jcts, 50)),
        "p90_jct_h": _hours(percentile(jcts, 90)),
        "p99_jct_h": _hours(percentile(jcts, 99)),
        "avg_wait_h": _hours(mean(waits_s(jobs))),
        "max_lr": _max(lrs),
        "mean_lr": mean(lrs),
        "max_ftf": _max(ftf_rhos(jobs)),
        "frags_per_round": fragments_per_round(plans),
        "frags_per_waiting_round": fragments_per_waiting_round(plans),
        "placeable_idle_per_round": placeable_idle_per_round(plans),
        "utilisation": utilisation(plans),
        "solver_p95_s": percentile((r.solver_s for r in plans), 95),
    }
