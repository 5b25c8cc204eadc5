"""Start-time forecasts against what then happened: a trace replayed through the simulator, the queue
forecast at every job's arrival, each job's forecast compared with its actual start.

The replay is a Simulation (hopsmgr.sim.engine) of `--cluster` (default configs/sim/paper-16.toml) in
the paper world (hopsmgr.sim.truth: the ground truth the estimator learns) under the Hops policy, with
a Poisson workload (`--jobs`, `--rate-per-hour`, hopsmgr.sim.workload). Jobs arrive with their profiles
(no profiling phase: `--profiling` turns it on, and the forecast then guesses a new job's profile from
the latest profiled job). At each arrival the live state is captured (hopsmgr.forecast.live.capture)
and forecast (hopsmgr.forecast.run.forecast, `--budget-s`, `--min-futures`, `--max-futures`); the
arriving job's P10/P50/P90 start is kept. After the run:

- `start_p50_median_abs_error_rel`: median, over jobs that waited at least one round, of
  |P50 forecast wait - actual wait| / actual wait;
- `start_in_p10_p90`: share of all forecast jobs whose actual start lies in [P10, P90] (1 s slack; a
  P90 of None, past the horizon or a tail the calibration leaves open, counts as no upper end; a
  forecast with no P10, in which too few futures started the job within their horizon, says "not
  within the horizon" and holds a start from the horizon on), and `start_p90_open`: the share of
  forecasts whose P90 was None; `start_in_p10_p90_strict`: the same with every forecast without a
  P10 counted as a miss (the figure before 2026-12-04); `start_beyond_horizon` (and `_right`): how
  many forecasts had no P10 (and how many of those jobs did start after the horizon);
  `start_in_p10_p90_waited`: the same over jobs that waited at least one round;
- `*_arriving` (and `jobs_waited_arriving`): the same over the jobs that started before the trace's last
  arrival, i.e. while arrivals went on as the futures assume they do (the futures draw arrivals at the
  recent rate; a finite trace stops them, which no forecast from the recent rate can know); the
  headline figures above are over all jobs;
- `--tail-jobs N`: N more jobs of the same arrival process after the `--jobs` forecast ones, neither
  forecast nor scored, so arrivals go on as the futures assume while the scored jobs wait (the run
  stops once every scored job has started; `scored_started_before_tail_end` says whether they all
  did before the tail's last arrival). Without a tail the trace's arrivals stop at its end;
- `--exact-s S`: wall seconds each future may plan with the Hops planner before it plans greedily
  (FutureOptions.exact_s; 0: greedy plans only);
- `--limit-s S`: past the first future, none is begun that is expected to end after S seconds, even
  below `--min-futures` (ForecastSettings.limit_s, the master's 5 s by default);
- `--per-job FILE`: one CSV row per forecast job (its P10/P50/P90 and actual waits, relative error);
- `forecast_ms_p50`, `forecast_ms_p95`: wall time of one whole-queue forecast in the replay;
- with `--scale` (default on): a burst of `--scale-jobs` jobs on configs/sim/paper-512.toml, run until
  at least 1,000 wait, then the whole queue forecast `--scale-repeats` times: `scale_waiting`,
  `scale_gpus`, `scale_forecast_ms_p95`, `scale_futures`, and `scale_capture_ms` (the copy of the
  live state the master takes on its event loop).

    python bench/forecast.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hopsmgr.config import load_cluster_config
from hopsmgr.core.lifecycle import JobState
from hopsmgr.forecast.calibrate import Residuals, StartTracker
from hopsmgr.forecast.future import FutureOptions
from hopsmgr.forecast.live import capture
from hopsmgr.forecast.policy import ForecastPolicy
from hopsmgr.forecast.run import ForecastSettings, forecast
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob, poisson_workload

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


class Replay(Simulation):
    """The simulation, forecasting the queue each time a job arrives."""

    def __init__(self, *args: Any, settings: ForecastSettings, scored: frozenset[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.scored = scored  # the jobs forecast at their arrival (the others only arrive)
        self.forecasts: dict[str, tuple[float, float | None, float | None, float | None]] = {}
        self.horizons: dict[str, float | None] = {}  # how far each job's futures looked
        self.forecast_ms: list[float] = []
        # as the master does (hopsmgr.master.forecasts): intervals widened by recent residuals
        self.tracker = StartTracker(Residuals(round_s=self.policy.round_seconds))
        self.raw: dict[str, tuple[float | None, float | None]] = {}

    def _arrive(self, job: Any) -> None:
        super()._arrive(job)
        if job.spec.id not in self.scored:
            return
        for job_id in list(self.tracker.first):
            started = self.jobs[job_id].first_start
            if started is not None and started <= self.now:
                self.tracker.started(job_id, started)
        self.tracker.waiting(self.now)  # the rest still wait: those past their P90 are known misses
        live = capture(
            self.machine, self.now, self.machine.submissions, next_round=self.next_round, observed_since=0.0
        )
        t0 = time.perf_counter()
        result = forecast(live, self.settings, time.perf_counter)
        self.forecast_ms.append((time.perf_counter() - t0) * 1000)
        self.tracker.note(result)
        raw = result.get(job.spec.id)
        if raw is not None:
            f = self.tracker.residuals.widen(raw)
            self.forecasts[job.spec.id] = (self.now, f.start_p10, f.start_p50, f.start_p90)
            self.horizons[job.spec.id] = f.horizon
            self.raw[job.spec.id] = (raw.start_p10, raw.start_p90)


def _wait(at_time: float | None, arrival: float) -> str:
    return "" if at_time is None else str(round(at_time - arrival))


def replay(args: argparse.Namespace) -> dict[str, Any]:
    cluster = load_cluster_config(args.cluster)
    world = paper_world(seed=args.seed)
    types = sorted({s.gpu_type for s in cluster.servers})
    tenants = tuple(t.name for t in cluster.tenants) or ("default",)
    workload = poisson_workload(
        world, args.jobs + args.tail_jobs, args.rate_per_hour, args.seed, tenants, types
    )
    scored = frozenset(w.job_id for w in sorted(workload, key=lambda w: w.arrival_s)[: args.jobs])
    settings = replace(cluster.scheduler, round_seconds=args.round_s)
    sim = Replay(
        world,
        cluster.servers,
        workload,
        HopsPolicy(settings),
        SimOptions(seed=args.seed, profiling=args.profiling),
        time.perf_counter,
        tenants=cluster.tenant_map(),
        scored=scored,
        settings=ForecastSettings(
            budget_s=args.budget_s,
            min_futures=args.min_futures,
            max_futures=args.max_futures,
            limit_s=args.limit_s,
            future=FutureOptions(
                sigma=args.sigma,
                round_growth=args.round_growth,
                keep_bonus=args.keep_bonus,
                exact_s=args.exact_s,
            ),
        ),
    )
    if args.tail_jobs:  # until every scored job has started (the tail's own runs are not measured)
        sim.advance(until=lambda: all(sim.jobs[j].first_start is not None for j in scored))
    else:
        sim.run()
    errors: list[float] = []
    covered: list[bool] = []
    covered_waited: list[bool] = []
    covered_raw: list[bool] = []
    strict: list[bool] = []  # a forecast with no P10 counted as a miss, whenever the job started
    beyond: list[bool] = []  # forecasts with no P10 (no start within the horizon): right or not
    opened: list[bool] = []
    last_arrival = max((w.arrival_s for w in workload if w.job_id in scored), default=0.0)
    tail_end = max((w.arrival_s for w in workload), default=0.0)
    errors_arriving: list[float] = []
    covered_arriving: list[bool] = []
    rows: list[str] = ["job,gpus,arrival,p10_wait,p50_wait,p90_wait,actual_wait,rel_error,inside"]
    for job_id, (at, p10, p50, p90) in sim.forecasts.items():
        truth = sim.jobs[job_id]
        if truth.first_start is None:
            continue
        actual = truth.first_start
        arriving = actual <= last_arrival
        # a P90 of None is "later than can be said" (past the horizon, or a tail the calibration left
        # open): the interval [P10, oo) holds any start from P10 on; `start_p90_open` counts them
        inside = p10 is not None and p10 - 1.0 <= actual and (p90 is None or actual <= p90 + 1.0)
        strict.append(inside)
        horizon = sim.horizons[job_id]
        if p10 is None and horizon is not None:  # "not within the horizon": [horizon, oo)
            beyond.append(actual >= horizon - 1.0)
            inside = beyond[-1]
        opened.append(p90 is None)
        covered.append(inside)
        if arriving:
            covered_arriving.append(inside)
        r10, r90 = sim.raw[job_id]
        covered_raw.append(r10 is not None and r10 - 1.0 <= actual and (r90 is None or actual <= r90 + 1.0))
        wait = actual - at
        rows.append(
            ",".join(
                str(x)
                for x in (
                    job_id,
                    sim.jobs[job_id].spec.requirements.minimum,
                    round(at),
                    _wait(p10, at),
                    _wait(p50, at),
                    _wait(p90, at),
                    round(wait),
                    round(abs((p50 - at) - wait) / wait, 3) if p50 is not None and wait > 0 else "",
                    int(inside),
                )
            )
        )
        if wait >= args.round_s:
            covered_waited.append(inside)
            # no P50 (most futures did not start it): counted as a full miss
            error = abs((p50 - at) - wait) / wait if p50 is not None else 1.0
            errors.append(error)
            if arriving:
                errors_arriving.append(error)
    if args.per_job:
        Path(args.per_job).write_text("\n".join(rows) + "\n")
    return {
        "jobs": len(sim.forecasts),
        "jobs_waited": len(errors),
        "start_p50_median_abs_error_rel": statistics.median(errors) if errors else None,
        "start_in_p10_p90": sum(covered) / len(covered) if covered else None,
        "start_in_p10_p90_strict": sum(strict) / len(strict) if strict else None,
        "start_beyond_horizon": len(beyond),
        "start_beyond_horizon_right": sum(beyond),
        "start_in_p10_p90_waited": sum(covered_waited) / len(covered_waited) if covered_waited else None,
        "start_in_p10_p90_uncalibrated": sum(covered_raw) / len(covered_raw) if covered_raw else None,
        "start_p90_open": sum(opened) / len(opened) if opened else None,
        "jobs_arriving": len(covered_arriving),
        "jobs_waited_arriving": len(errors_arriving),
        "start_p50_median_abs_error_rel_arriving": statistics.median(errors_arriving)
        if errors_arriving
        else None,
        "start_in_p10_p90_arriving": sum(covered_arriving) / len(covered_arriving)
        if covered_arriving
        else None,
        "tail_jobs": args.tail_jobs,
        "scored_started_before_tail_end": all(
            (start := sim.jobs[j].first_start) is not None and start <= tail_end for j in scored
        ),
        "forecast_ms_p50": percentile(sim.forecast_ms, 50),
        "forecast_ms_p95": percentile(sim.forecast_ms, 95),
        "gpus": sum(s.gpus for s in cluster.servers),
    }


def scale(args: argparse.Namespace) -> dict[str, Any]:
    """1,000+ waiting jobs on 512 GPUs: how long one whole-queue forecast takes."""
    cluster = load_cluster_config(str(REPO / "configs" / "sim" / "paper-512.toml"))
    world = paper_world(seed=args.seed)
    types = sorted({s.gpu_type for s in cluster.servers})
    tenants = tuple(t.name for t in cluster.tenants) or ("default",)
    burst: list[WorkloadJob] = poisson_workload(
        world, args.scale_jobs, 3600.0 * 50, args.seed, tenants, types
    )
    sim = Simulation(
        world,
        cluster.servers,
        burst,
        ForecastPolicy(
            replace(cluster.scheduler, round_seconds=args.round_s)
        ),  # only to reach a busy state quickly; the forecast is what is timed
        SimOptions(seed=args.seed, profiling=False),
        time.perf_counter,
        tenants=cluster.tenant_map(),
    )

    def busy() -> bool:
        state = sim.machine.state
        return sim.now > burst[-1].arrival_s and state.counts.get(JobState.QUEUED, 0) >= 1000

    sim.advance(until=busy)
    t0 = time.perf_counter()
    live = capture(sim.machine, sim.now, [w.arrival_s for w in burst], next_round=sim.next_round)
    capture_ms = (time.perf_counter() - t0) * 1000
    waiting = sum(1 for j in live.jobs if j.state == JobState.QUEUED)
    times: list[float] = []
    futures = 0
    settings = ForecastSettings(
        budget_s=args.budget_s,
        min_futures=args.min_futures,
        max_futures=args.max_futures,
        limit_s=args.limit_s,
        future=FutureOptions(
            round_growth=args.round_growth, keep_bonus=args.keep_bonus, exact_s=args.exact_s
        ),
    )
    for _ in range(args.scale_repeats):
        t0 = time.perf_counter()
        result = forecast(live, settings, time.perf_counter)
        times.append((time.perf_counter() - t0) * 1000)
        futures = max((f.futures for f in result.values()), default=0)
    return {
        "scale_waiting": waiting,
        "scale_gpus": sum(s.gpus for s in cluster.servers),
        "scale_forecast_ms_p50": percentile(times, 50),
        "scale_forecast_ms_p95": percentile(times, 95),
        "scale_futures": futures,
        "scale_capture_ms": capture_ms,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default=str(REPO / "configs" / "sim" / "paper-16.toml"))
    p.add_argument("--jobs", type=int, default=120)
    p.add_argument(
        "--tail-jobs", type=int, default=0, help="jobs arriving after the scored ones (not scored)"
    )
    p.add_argument("--rate-per-hour", type=float, default=12.0)
    p.add_argument("--round-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=2.0)
    p.add_argument("--min-futures", type=int, default=3)
    p.add_argument("--max-futures", type=int, default=10)
    p.add_argument(
        "--limit-s",
        type=float,
        default=ForecastSettings().limit_s,
        help="past the first future, none expected to end after this (ForecastSettings.limit_s)",
    )
    p.add_argument("--sigma", type=float, default=0.15)
    p.add_argument(
        "--round-growth",
        type=float,
        default=FutureOptions().round_growth,
        help="futures' rounds at least this fraction of their elapsed time apart (FutureOptions)",
    )
    p.add_argument(
        "--keep-bonus",
        type=float,
        default=FutureOptions().keep_bonus,
        help="futures: how far ahead in priority a waiting job must be to preempt (FutureOptions)",
    )
    p.add_argument(
        "--exact-s",
        type=float,
        default=FutureOptions().exact_s,
        help="futures: wall seconds each may plan with the Hops planner before it plans greedily",
    )
    p.add_argument("--profiling", action="store_true")
    p.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--scale", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--scale-jobs", type=int, default=1400)
    p.add_argument("--scale-repeats", type=int, default=3)
    p.add_argument("--json", help="write the figures as flat JSON here")
    p.add_argument("--per-job", help="write one CSV row per forecast job here (forecast against actual)")
    args = p.parse_args(argv)
    try:
        ForecastSettings(budget_s=args.budget_s, limit_s=args.limit_s)
    except ValueError as exc:
        p.error(str(exc))  # names the field: budget_s is --budget-s, limit_s --limit-s
    if args.tail_jobs < 0:
        p.error(f"--tail-jobs must be >= 0, got {args.tail_jobs}")
    out = replay(args) if args.replay else {}
    if args.scale:
        out.update(scale(args))
    for key, value in out.items():
        print(f"{key:34} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
