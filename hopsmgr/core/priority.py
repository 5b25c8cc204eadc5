"""Queue priorities: job age under heterogeneity, latency ratio, the comparison orders, ILP weights, RAQLR.

Pure functions over `JobView`s (HOPS.md section 5). A priority value is "higher = served first"; kinds
whose natural order is "smaller first" are mapped to a decreasing function of the quantity. Values may be
zero or negative: the ILP adds a bias (HOPS.md section 7, `ilp_weights`) so every weight base is positive.

A job with no known throughput on any GPU type (still being profiled) has an infinite age; its latency
ratio and FTF rho are then 0.0, and its SJF/SRTF values rank it after every job of known size.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hopsmgr.core.model import GpuType, JobId, JobSpec, JobView

RateFn = Callable[[JobSpec, GpuType], float | None]
"""Per-GPU samples/s of a job on one GPU of a type; None when unknown (not profiled yet)."""

HOUR_S = 3600.0
BIAS_EPSILON = 0.01
HYSTERESIS_TIE = 1e-3  # `with_hysteresis`: how far above its rival a running job's raised weight is

PRIORITY_KINDS: tuple[str, ...] = ("latency_ratio", "fifo", "las", "sjf", "srtf", "ftf", "srtf_lr")

# [ours] The latency ratio past which the "srtf_lr" priority lets a job climb over the shortest-remaining
# order (`srtf_lr_value`): a job that has waited twice as long as it would run. It was 1: on Gavel's
# trace d3 (a queue of days) 37 of 200 jobs then climbed over the SRTF order, and the average JCT was
# 0.85 of Gavel's best; with 2, 0.78 (other workloads within noise; docs/results.md).
DEFAULT_LR_GUARD = 2.0


@dataclass(frozen=True, slots=True)
class PriorityContext:
    """What every priority needs besides the job: the instant, the cluster's type mix and the rates.

    `type_share` maps each GPU type to its share of the cluster's GPUs (sums to 1). `active_jobs` is the
    number of live jobs competing (FTF's ideal share is 1/N of the cluster). A tenant missing from
    `tenant_weight` weighs 1.0.
    """

    now: float
    type_share: Mapping[GpuType, float]
    rate: RateFn
    total_gpus: int
    active_jobs: int = 1
    tenant_weight: Mapping[str, float] = field(default_factory=dict)
    # seconds per sample by job id, kept by a caller whose rates and type mix stay as they are across
    # contexts (a forecast's future: its estimator learns nothing); None: computed each time
    per_sample: dict[str, float] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.now):
            raise ValueError(f"priority context: now must be finite, got {self.now!r}")
        if self.total_gpus < 0:
            raise ValueError(f"priority context: total_gpus must be >= 0, got {self.total_gpus!r}")
        if self.active_jobs < 0:
            raise ValueError(f"priority context: active_jobs must be >= 0, got {self.active_jobs!r}")
        for gpu_type, share in self.type_share.items():
            if not (math.isfinite(share) and share >= 0):
                raise ValueError(f"priority context: share of {gpu_type!r} must be >= 0, got {share!r}")

    def weight_of(self, tenant: str) -> float:
        return self.tenant_weight.get(tenant, 1.0)


def _seconds_per_sample(job: JobSpec, ctx: PriorityContext) -> float:
    """Expected seconds per sample at the job's mean GPU count, averaged over the cluster's type mix.

    Types with no known (finite, positive) rate are left out and P is renormalised over the rest;
    math.inf when no type has a known rate.
    """
    memo = ctx.per_sample
    if memo is not None:
        found = memo.get(job.id)
        if found is not None:
            return found
    value = _per_sample(job, ctx)
    if memo is not None and math.isfinite(value):  # an unknown rate may become known: asked again
        memo[job.id] = value
    return value


def _per_sample(job: JobSpec, ctx: PriorityContext) -> float:
    known_share = 0.0
    weighted = 0.0
    for gpu_type, share in ctx.type_share.items():
        if share <= 0:
            continue
        rate = ctx.rate(job, gpu_type)
        if rate is None or not math.isfinite(rate) or rate <= 0:
            continue
        known_share += share
        weighted += share / rate
    if known_share <= 0:
        return math.inf
    return weighted / known_share / job.requirements.mean


# [ours] The shortest expected run time: a second. Ratios over a job's age (its wait over it) stay
# finite for any positive work, however small (the API takes iterations down to 5e-324, whose age
# underflowed to a few denormals and made the latency ratio infinite).
MIN_RUN_S = 1.0


def expected_run_s(job: JobSpec, ctx: PriorityContext) -> float:
    """The job's age: run time without waiting, sum_type P(type) * samples / (rate(type) * R_avg),
    at least MIN_RUN_S.

    P is renormalised over the types with a known rate; math.inf when no rate is known at all.
    """
    age = job.total_samples * _seconds_per_sample(job, ctx)
    return max(age, MIN_RUN_S) if math.isfinite(age) else age


def remaining_run_s(view: JobView, ctx: PriorityContext) -> float:
    """As `expected_run_s`, for the samples still to do (0.0 for a job with none left)."""
    remaining = view.remaining_samples
    if remaining <= 0:
        return 0.0
    return remaining * _seconds_per_sample(view.spec, ctx)


def latency_ratio(view: JobView, ctx: PriorityContext) -> float:
    """wait / age (>= 0); 0.0 for a job whose age is unknown (no rate known yet)."""
    age = expected_run_s(view.spec, ctx)
    if not math.isfinite(age) or age <= 0:
        return 0.0
    return max(view.waited_s, 0.0) / age


def projected_latency_ratio(view: JobView, ctx: PriorityContext, ahead_s: float) -> float:
    """[ours] (wait + ahead_s) / age: the latency ratio the job will have if it is not served for
    `ahead_s` more seconds; 0.0 when its age is unknown.

    The planner asks it of every job over the plan's horizon, and for a running job adds what a
    preemption would delay it by (checkpoint and restart): a running job's plain ratio is frozen while
    queued jobs' grow, so every queued job overtakes it in time and the cluster rotates its jobs; the
    projected one compares what each job would suffer from not being served.
    """
    age = expected_run_s(view.spec, ctx)
    if not math.isfinite(age) or age <= 0:
        return 0.0
    return (max(view.waited_s, 0.0) + max(ahead_s, 0.0)) / age


def ftf_rho(view: JobView, ctx: PriorityContext) -> float:
    """Themis finish-time fairness rho = T_shared / T_ideal; 0.0 when the job's age is unknown.

    T_shared = (now - submit_time) + remaining_run_s; T_ideal = expected_run_s * max(1, N * R_avg / G)
    with N = active_jobs and G = total_gpus (taken as 1 when the cluster has none).
    """
    age = expected_run_s(view.spec, ctx)
    if not math.isfinite(age) or age <= 0:
        return 0.0
    shared = max(ctx.now - view.spec.submit_time, 0.0) + remaining_run_s(view, ctx)
    contention = ctx.active_jobs * view.spec.requirements.mean / max(ctx.total_gpus, 1)
    return shared / (age * max(1.0, contention))


def srtf_lr_value(
    view: JobView, ctx: PriorityContext, ahead_s: float = 0.0, guard: float = DEFAULT_LR_GUARD
) -> float:
    """[ours] Shortest remaining time first with a latency-ratio guard:

        1 / (1 + remaining run hours) + max(0, (wait + ahead_s) / age - guard)

    The first term (in (0, 1]) ranks jobs by their expected remaining run time, the order that minimises
    the average completion time; a running job's grows as it progresses, so a queued job of the same
    size does not overtake it by waiting alone before it passes its guard (the latency ratio of a
    running job is frozen while a queued one's grows). The second term is 0 until the job's (projected) latency ratio passes `guard`
    and then grows by one for each further age of waiting: a job whose ratio passes guard + 1 ranks
    above every job not past its guard, so no job starves, in the latency ratio's own units. 0.0 for a
    job whose age is unknown (like the other kinds' "unknown size last").
    """
    age = expected_run_s(view.spec, ctx)
    if not math.isfinite(age) or age <= 0:
        return 0.0
    ratio = (max(view.waited_s, 0.0) + max(ahead_s, 0.0)) / age
    return _smaller_first(remaining_run_s(view, ctx)) + max(0.0, ratio - guard)


def critical_path_jobs(
    remaining_s: Mapping[JobId, float], gpus: Mapping[JobId, float], total_gpus: int, horizon_s: float
) -> frozenset[JobId]:
    """[ours] The jobs on the critical path of the backlog's makespan, from each live job's remaining
    run time and GPU count (jobs of unknown size, math.inf, left out). The backlog cannot end before
    `bound` = max(drain time, longest remaining run time), the drain time being the remaining work
    (run time x GPUs) over the cluster's GPUs. A job whose remaining run time is within `horizon_s` of
    that bound ends after it if it is not served over the horizon; the shortest-remaining order would
    serve it last of all, and the backlog's makespan would be its wait plus its run."""
    known = {job_id: r for job_id, r in remaining_s.items() if math.isfinite(r) and r > 0}
    if not known:
        return frozenset()
    drain = sum(r * gpus.get(job_id, 1.0) for job_id, r in known.items()) / max(total_gpus, 1)
    bound = max(drain, max(known.values()))
    return frozenset(job_id for job_id, r in known.items() if r >= bound - horizon_s)


def _smaller_first(seconds: float) -> float:
    """Map a duration to (0, 1], decreasing: 1 / (1 + hours); an infinite duration maps to 0.0."""
    if not math.isfinite(seconds):
        return 0.0
    return 1.0 / (1.0 + max(seconds, 0.0) / HOUR_S)


def _value(kind: str, view: JobView, ctx: PriorityContext) -> float:
    if kind == "latency_ratio":
        return latency_ratio(view, ctx) * ctx.weight_of(view.spec.tenant)
    if kind == "fifo":
        return (ctx.now - view.spec.submit_time) / HOUR_S
    if kind == "las":
        return _smaller_first(view.attained_gpu_s)
    if kind == "sjf":
        return _smaller_first(expected_run_s(view.spec, ctx))
    if kind == "srtf":
        return _smaller_first(remaining_run_s(view, ctx))
    if kind == "ftf":
        return ftf_rho(view, ctx)
    if kind == "srtf_lr":
        return srtf_lr_value(view, ctx) * ctx.weight_of(view.spec.tenant)
    raise ValueError(f"unknown priority kind {kind!r}; valid kinds: {', '.join(PRIORITY_KINDS)}")


def priority_values(kind: str, views: Sequence[JobView], ctx: PriorityContext) -> dict[JobId, float]:
    """Priority value of every job for one kind; higher = served first. All values are finite.

    - "latency_ratio": wait / age, times the tenant's weight (HOPS' LRF order);
    - "fifo": hours since submission (earlier submit first);
    - "las": 1 / (1 + attained GPU-hours) (least attained service first);
    - "sjf": 1 / (1 + age in hours) (shortest expected run first);
    - "srtf": 1 / (1 + remaining run in hours) (shortest remaining first);
    - "ftf": Themis rho = T_shared / T_ideal (the job furthest behind its fair finish first);
    - "srtf_lr": the SRTF value plus max(0, latency ratio - DEFAULT_LR_GUARD), times the tenant's weight
      (`srtf_lr_value`; the plans' queue order, hopsmgr.core.queueorder, projects the ratio over the
      horizon, reads the guard from the settings and lifts the running jobs on the critical path:
      these plain values have none of that).

    The bounded 1/(1+hours) form keeps ILP weights (prio + bias)^lambda in a sane numeric range. Unknown
    kind: ValueError naming it and the valid kinds.
    """
    if kind not in PRIORITY_KINDS:
        raise ValueError(f"unknown priority kind {kind!r}; valid kinds: {', '.join(PRIORITY_KINDS)}")
    return {view.id: _value(kind, view, ctx) for view in views}


def order_queue(views: Iterable[JobView], values: Mapping[JobId, float]) -> list[JobView]:
    """Views by descending value; ties by earlier submit_time, then job id. Missing or NaN values go last."""

    def key(view: JobView) -> tuple[float, float, str]:
        value = values.get(view.id, -math.inf)
        if math.isnan(value):
            value = -math.inf
        return (-value, view.spec.submit_time, view.id)

    return sorted(views, key=key)


def ilp_bias(values: Iterable[float]) -> float:
    """HOPS.md section 7: 0 if every priority is positive, else |min| + 0.01 (0 for no values)."""
    items = list(values)
    if not items:
        return 0.0
    lowest = min(items)
    return 0.0 if lowest > 0 else abs(lowest) + BIAS_EPSILON


def ilp_weights(
    values: Mapping[JobId, float], lambda_: float, knee: float = 0.0, below: float = 0.5
) -> dict[JobId, float]:
    """ILP objective weights (prio + bias)^lambda; lambda 0 (without a knee) gives 1.0 to every job.

    [ours] With a `knee` > 0, x = prio + bias is weighed x^below up to the knee and
    knee^below * (x / knee)^lambda past it: one curve, continuous at the knee, flatter below it
    (throughput counts more among jobs that have waited little) and the paper's slope above.

    Raises ValueError for a negative or non-finite lambda, knee or exponent below the knee, or a
    non-finite priority.
    """
    for name, number in (("lambda", lambda_), ("lambda_knee", knee), ("lambda_below", below)):
        if not (math.isfinite(number) and number >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {number!r}")
    for job_id, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"priority of job {job_id!r} must be finite, got {value!r}")
    if lambda_ == 0 and knee == 0:
        return dict.fromkeys(values, 1.0)
    bias = ilp_bias(values.values())
    if knee == 0:
        return {job_id: (value + bias) ** lambda_ for job_id, value in values.items()}
    at_knee = knee**below

    def weight(x: float) -> float:
        return x**below if x <= knee else at_knee * (x / knee) ** lambda_

    return {job_id: weight(value + bias) for job_id, value in values.items()}


def with_hysteresis(
    values: Mapping[JobId, float],
    weights: Mapping[JobId, float],
    running: Collection[JobId],
    rivals: Collection[JobId],
    delta: float,
) -> dict[JobId, float]:
    """[ours] Weights where a running job ties with every rival within `delta` of its priority value:
    each running job's weight is raised to just above (by HYSTERESIS_TIE, and always below every rival
    beyond `delta`) the highest weight of a rival (a waiting job) whose value is at most its own plus
    `delta`. A waiting job then takes a running job's GPUs on priority only once
    its value is more than `delta` above the running job's (or on throughput, as before): with the
    latency-ratio priority, ratios that differ by less than `delta` count as equal, and the tie goes to
    the job that holds the GPUs. Weights are only raised, and the order between a running job and
    every job beyond `delta` is unchanged. `delta` 0 returns the weights as they are.

    Without it, long jobs rotate on the GPUs: a waiting long job's ratio passes a running one's by a
    hundredth within minutes, and each pass costs a checkpoint and a restart (docs/results.md)."""
    if not (math.isfinite(delta) and delta >= 0):
        raise ValueError(f"lr_hysteresis must be a finite number >= 0, got {delta!r}")
    out = dict(weights)
    if delta == 0:
        return out
    ranked = sorted((values[j], weights[j]) for j in rivals if j in values and j in weights)
    keys = [value for value, _ in ranked]
    best_up_to: list[float] = []
    best = -math.inf
    for _, weight in ranked:
        best = max(best, weight)
        best_up_to.append(best)
    least_from = [math.inf] * (len(ranked) + 1)  # the lowest weight of the rivals from index i on
    for i in range(len(ranked) - 1, -1, -1):
        least_from[i] = min(least_from[i + 1], ranked[i][1])
    for job_id in running:
        if job_id not in values or job_id not in out:
            continue
        i = bisect.bisect_right(keys, values[job_id] + delta)
        best = best_up_to[i - 1] if i else -math.inf
        if best <= out[job_id]:
            continue
        raised = best * (1.0 + HYSTERESIS_TIE)
        beyond = least_from[i]  # never at or above a rival beyond delta: its order stays
        if raised >= beyond:
            raised = (best + beyond) / 2 if beyond > best else best
        out[job_id] = raised
    return out


def raqlr(ended: Iterable[tuple[float, float]], now: float, hours: float) -> float | None:
    """Recent average queue latency ratio: mean LR of jobs that ended at or after now - hours.

    `ended` holds (end_time, latency_ratio) pairs; None when no job ended in the window.
    """
    if not (math.isfinite(hours) and hours >= 0):
        raise ValueError(f"RAQLR window must be a finite number of hours >= 0, got {hours!r}")
    cutoff = now - hours * HOUR_S
    recent = [ratio for end_time, ratio in ended if end_time >= cutoff]
    if not recent:
        return None
    return sum(recent) / len(recent)


def estimated_wait_s(view: JobView, ctx: PriorityContext, raqlr_value: float | None) -> float | None:
    """Rough forecast of a job's total queue time: RAQLR x its age.

    None when there is no RAQLR yet or the job's age is unknown. It is the whole expected wait, not what
    is left of it (subtract `view.waited_s` for that).
    """
    if raqlr_value is None:
        return None
    age = expected_run_s(view.spec, ctx)
    if not math.isfinite(age):
        return None
    return max(raqlr_value, 0.0) * age
