"""A lower bound on the average JCT that any scheduler can reach on a paper-world Poisson workload.

Issue 13 asks for an average JCT of at most 0.75 of Sia-LR's on paper-512. This bench answers whether
any schedule could: it solves a linear relaxation of the scheduling problem whose optimum no real
schedule can beat (given the measured margin below), so when the bound lies above the target the
target is out of reach on that workload, whatever the algorithm. It relaxes, in the schedule's favour:

- time: a slot grid (`--slot-h`, finer for the first `--fine-h` hours) over which a job's work is
  spread freely; within a slot a job may time-share between its GPU counts;
- GPUs: per slot a job time-shares between configurations: one of its GPU counts `n`, its GPUs taken
  from any of the server groups (GPU type and host model) in any shares; the groups' GPUs are shared
  fractionally, no gang or server boundaries;
- speed: on `n` GPUs of one group a job runs at that group's best-case rate (hopsmgr.sim.bestrates:
  the best hidden factors found among the group's servers, over every split of `n` across as many
  servers as the cluster has, times the job's own factor, which the bound knows, and a 5% margin);
  over several groups at the GPU-weighted mean of their rates at `n`. The margin covers placements
  across groups, which ran up to 2.1% faster than that mean in every case we tried
  (tests/sim/test_jct_bound.py repeats a sweep): measured, not proven;
- costs: no profiling, no checkpoint, restart or launch time, no planning rounds, no gang or server
  boundaries.

A job's completion is then at least its arrival plus its best run time, and at least the mean time of
its work plus half its best run time (its work spreads over at least the best run time, so its mean
lies that far before the end); a slot's work counts from the slot's start (or the arrival), and work
past the horizon (`--horizon-h`), or more than `--window-h` after the job's arrival, counts from
that time and takes no GPUs. The program is solved with
the CBC binary PuLP ships (its LP solver, Clp) through hopsmgr.cbc.

    python bench/jct_bound.py --cluster configs/sim/paper-512.toml --workload poisson:jobs=500,rate=100 \
        --seed 2 [--slot-h 0.25] [--fine-h 8] [--fine-slot-h 0.05] [--window-h H] [--server-sigma S] \
        [--json FILE] [--per-job FILE]

`--per-job` writes each job's best run and JCT in the optimum found (one optimal split of the bound
among the jobs; bench/jct_by_class.py sets it beside simulated runs). The JSON's `sigma` is the `--server-sigma` the bound was computed for.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pulp.apis.coin_api import pulp_cbc_path

from hopsmgr import cbc
from hopsmgr.config import ClusterConfig
from hopsmgr.sim.bestrates import BestRates
from hopsmgr.sim.paperworld import PaperWorld
from hopsmgr.sim.runner import DEFAULT_SERVER_SIGMA, SimInputError, parse_cluster
from hopsmgr.sim.traces import workload_from_spec
from hopsmgr.sim.workload import WorkloadJob

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class JobBound:
    """One job as the relaxation sees it: rates in fractions of its work per hour."""

    job_id: str
    arrival_h: float
    best_rate: float  # its fastest configuration (1 / best run hours)
    rates: dict[tuple[int, str], float]  # (GPU count, group) -> rate on that many GPUs of that group


@dataclass(frozen=True, slots=True)
class JobShare:
    """One job's part of the optimum found: its best run, its JCT there, how long it ran (slot time
    shares) and its GPU-hours per GPU type (work past the window or the horizon not counted). The run
    may be longer than the JCT: the relaxation's completion is the mean time of the job's work plus
    half its best run, which is less than its last work's end when it runs slower than its best."""

    job_id: str
    best_run_h: float
    jct_h: float
    run_h: float
    gpu_h: dict[str, float]


def job_bound(table: BestRates, job: WorkloadJob) -> JobBound:
    """The job in the relaxation's units: rates as fractions of its work per hour."""
    rates = {
        (n, group): rate * HOUR_S / job.total_samples
        for group, points in table.job_rates(job).items()
        for n, rate in points
    }
    if not rates:
        raise ValueError(f"job {job.job_id}: none of its GPU counts fits the cluster")
    return JobBound(job.job_id, job.arrival_s / HOUR_S, HOUR_S / table.best_run_s(job), rates)


def slot_grid(horizon_h: float, slot_h: float, fine_h: float, fine_slot_h: float) -> list[float]:
    """Slot start times (hours), then the horizon: `fine_slot_h` up to `fine_h`, `slot_h` after."""
    edges, t = [0.0], 0.0
    while t < horizon_h - 1e-9:
        t = min(horizon_h, t + (fine_slot_h if t < fine_h - 1e-9 else slot_h))
        edges.append(t)
    return edges


def solve(
    jobs: Sequence[JobBound],
    capacity: dict[str, int],
    edges: Sequence[float],
    budget_s: float = 3600.0,
    window_h: float = math.inf,
    per_job: list[JobShare] | None = None,
) -> dict[str, float]:
    """Build and solve the relaxation; the bound on the average JCT (hours) and the program's size.
    `per_job`, if given, receives each job's share of the optimum found: one optimal split of the
    bound among the jobs (another optimum may split it otherwise)."""
    columns: list[cbc.Column] = []
    rhs: list[float] = []

    def row(bound: float) -> int:
        rhs.append(bound)
        return len(rhs) - 1

    horizon = edges[-1]
    slack = 10.0 * horizon + max(1.0 / j.best_rate for j in jobs)  # the scale of each job's excess
    cap_rows = {(k, t): row(float(capacity[k])) for k in capacity for t in range(len(edges) - 1)}
    excess_cols: list[int] = []
    runs: list[list[tuple[int, float, int, str]]] = []  # per job: (column, slot length, n, group)
    for job in jobs:
        runs.append([])
        r = job.best_rate
        work_row = row(-1.0)  # -(work done) <= -1
        # mean time of the work + half the best run - (arrival + best run + excess) <= 0
        done_row = row(job.arrival_h + 0.5 / r)
        last = min(horizon, job.arrival_h + window_h)  # work after this counts from it, takes no GPUs
        for t in range(len(edges) - 1):
            start, end = edges[t], edges[t + 1]
            if end <= job.arrival_h or start >= last:
                continue
            begin = max(start, job.arrival_h)
            length = end - start
            time_row = row((end - begin) / length)  # the job runs one configuration at a time
            # y: the share of the slot the job runs on n GPUs, counting those of `group`; a placement
            # of n GPUs over several groups is these columns of one n together (their shares of each
            # group's rate at n bound its rate: tests/sim/test_jct_bound.py)
            for (n, group), rate in job.rates.items():
                work = rate * length
                runs[-1].append((len(columns), length, n, group))
                columns.append(
                    (
                        0.0,
                        [
                            (time_row, 1.0),
                            (cap_rows[group, t], float(n)),
                            (work_row, -work),
                            (done_row, begin * work),
                        ],
                    )
                )
        columns.append((0.0, [(work_row, -1.0), (done_row, last)]))  # work past the window
        excess_cols.append(len(columns))
        columns.append((-slack / len(jobs), [(done_row, -slack)]))
    started = time.perf_counter()
    result = cbc.run(columns, rhs, integer=False, gap=0.0, budget_s=budget_s, path=str(pulp_cbc_path))
    solve_s = time.perf_counter() - started
    if result.status != "optimal":
        raise RuntimeError(f"CBC gave no optimal answer ({result.status}) in {budget_s:.0f} s")
    best_runs = sum(1.0 / j.best_rate for j in jobs)
    excess = sum(result.values[c] * slack for c in excess_cols)
    if per_job is not None:
        for job, col, placed in zip(jobs, excess_cols, runs, strict=True):
            best = 1.0 / job.best_rate
            gpu_h: dict[str, float] = {}
            run_h = 0.0
            for c, length, n, group in placed:
                share = result.values[c] * length
                run_h += share
                gpu_type = group.split("/")[0]
                gpu_h[gpu_type] = gpu_h.get(gpu_type, 0.0) + share * n
            per_job.append(JobShare(job.job_id, best, best + result.values[col] * slack, run_h, gpu_h))
    return {
        "bound_avg_jct_h": (best_runs + excess) / len(jobs),
        "avg_best_run_h": best_runs / len(jobs),
        "columns": len(columns),
        "rows": len(rhs),
        "solve_s": solve_s,
    }


def bound(
    cluster: ClusterConfig,
    workload: str,
    seed: int,
    edges: Sequence[float],
    budget_s: float = 3600.0,
    sigma: float = DEFAULT_SERVER_SIGMA,
    window_h: float = math.inf,
    per_job: list[JobShare] | None = None,
) -> dict[str, float]:
    world = PaperWorld(seed=seed, per_server_sigma=sigma)
    table = BestRates(world, cluster.servers)
    jobs = [job_bound(table, job) for job in workload_from_spec(workload, world, seed)]
    figures = solve(jobs, table.capacity(), edges, budget_s, window_h, per_job)
    return {
        "jobs": len(jobs),
        "seed": seed,
        "sigma": sigma,
        "horizon_h": edges[-1],
        "window_h": min(window_h, edges[-1]),
        "slots": len(edges) - 1,
        **figures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True, help="a paper-world cluster (TOML file or TYPE=NxG spec)")
    ap.add_argument("--workload", required=True, help="poisson:jobs=N,rate=R (as hopsmgr simulate takes it)")
    ap.add_argument("--seed", type=int, required=True, help="the run's --seed (workload and world)")
    ap.add_argument("--horizon-h", type=float, default=30.0, help="slots end here (default 30)")
    ap.add_argument("--slot-h", type=float, default=0.25, help="slot length after --fine-h (default 0.25)")
    ap.add_argument("--fine-h", type=float, default=8.0, help="fine slots up to this hour (default 8)")
    ap.add_argument("--fine-slot-h", type=float, default=0.05, help="fine slot length (default 0.05)")
    ap.add_argument(
        "--window-h",
        type=float,
        default=math.inf,
        help="a job's slots end this long after its arrival (default: the horizon)",
    )
    ap.add_argument(
        "--server-sigma",
        type=float,
        default=DEFAULT_SERVER_SIGMA,
        help=f"the world's per-server variation, as hopsmgr simulate --server-sigma (default {DEFAULT_SERVER_SIGMA})",
    )
    ap.add_argument("--budget-s", type=float, default=3600.0, help="CBC's wall-clock budget (default 3600)")
    ap.add_argument("--json", type=Path, help="write the figures here (flat JSON)")
    ap.add_argument(
        "--per-job",
        type=Path,
        help="write each job's part of the optimum found here (CSV: job,best_run_h,jct_h,run_h,gpu_h; "
        "gpu_h: GPU-hours per GPU type, 'type:h type:h')",
    )
    args = ap.parse_args(argv)
    for name in ("horizon_h", "slot_h", "fine_slot_h", "budget_s"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            print(f"--{name.replace('_', '-')}: must be a positive number, got {value!r}", file=sys.stderr)
            return 2
    for name in ("fine_h", "server_sigma"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            print(
                f"--{name.replace('_', '-')}: must be a non-negative number, got {value!r}", file=sys.stderr
            )
            return 2
    try:
        cluster = parse_cluster(args.cluster)
    except SimInputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not args.workload.startswith("poisson:"):
        print(f"--workload: only poisson:... workloads are bounded, got {args.workload!r}", file=sys.stderr)
        return 2
    for flag, path in (("--json", args.json), ("--per-job", args.per_job)):
        if path is not None and not path.parent.is_dir():
            print(f"{flag}: no folder {str(path.parent)!r} to write {path.name!r} in", file=sys.stderr)
            return 2
    edges = slot_grid(args.horizon_h, args.slot_h, args.fine_h, args.fine_slot_h)
    per_job: list[JobShare] | None = [] if args.per_job else None
    try:
        figures = bound(
            cluster, args.workload, args.seed, edges, args.budget_s, args.server_sigma, args.window_h, per_job
        )
    except ValueError as exc:
        print(f"--workload / --cluster: {exc}", file=sys.stderr)
        return 2
    for key, value in figures.items():
        print(f"{key:18} {value:.4f}" if isinstance(value, float) else f"{key:18} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    if args.per_job and per_job is not None:
        rows = "".join(
            f"{j.job_id},{j.best_run_h:.6f},{j.jct_h:.6f},{j.run_h:.6f},"
            + " ".join(f"{t}:{h:.4f}" for t, h in sorted(j.gpu_h.items()) if h > 1e-6)
            + "\n"
            for j in per_job
        )
        args.per_job.write_text("job,best_run_h,jct_h,run_h,gpu_h\n" + rows, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
