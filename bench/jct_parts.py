"""Where a simulated run's average JCT goes: each job's best run time, its wait, and the rest (running
slower than its best: fewer GPUs than its largest count, a slower GPU type, restarts).

Reads the jobs.csv of `hopsmgr simulate --out DIR` on a paper-world Poisson workload and rebuilds the
same workload (same spec and seed) to know each job's model, work and GPU counts. A job's best run time
is its work at its fastest best-case rate on the run's cluster (hopsmgr.sim.bestrates: every GPU type
and host model, each of the job's counts, the best hidden factors of the group's servers, the job's own
factor, 5% for placements across groups), so no placement we know of beats it; it is a bound, not a
plan. `--server-sigma` must be the run's (the world's hidden factors depend on it). (Until 2026-12-04 it was the world's
nominal rate on reference servers, host model A for the RTX3090s: on paper-512 seed 2 the best run
times came out 1.309 h on average against 0.910 h now, so it was not a bound.)

    hopsmgr simulate --cluster configs/sim/paper-512.toml --workload poisson:jobs=500,rate=100 \
        --policies hops-srtf-lr --seed 2 --out /tmp/s2
    python bench/jct_parts.py --cluster configs/sim/paper-512.toml --jobs-csv /tmp/s2/jobs.csv \
        --workload poisson:jobs=500,rate=100 --seed 2 [--server-sigma S] [--json FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from hopsmgr.config import ClusterConfig
from hopsmgr.sim.bestrates import BestRates
from hopsmgr.sim.paperworld import PaperWorld
from hopsmgr.sim.runner import DEFAULT_SERVER_SIGMA, SimInputError, parse_cluster
from hopsmgr.sim.traces import workload_from_spec

HOUR_S = 3600.0


def parts(
    jobs_csv: Path, workload: str, seed: int, cluster: ClusterConfig, sigma: float = DEFAULT_SERVER_SIGMA
) -> dict[str, float]:
    """Per-job means in hours (best run, wait, the rest) and the rest's split by elastic and rigid jobs."""
    world = PaperWorld(seed=seed, per_server_sigma=sigma)
    best_rates = BestRates(world, cluster.servers)
    jobs = workload_from_spec(workload, world, seed)
    with jobs_csv.open(encoding="utf-8") as fh:
        rows = {row["job"]: row for row in csv.DictReader(fh)}
    missing = [job.job_id for job in jobs if job.job_id not in rows]
    if missing:
        raise SystemExit(
            f"--jobs-csv: {len(missing)} jobs of the workload are not in the file, e.g. {missing[0]}"
        )
    best = wait = jct = rest_elastic = rest_rigid = 0.0
    min_rest = float("inf")
    elastic = 0
    for job in jobs:
        run_s = best_rates.best_run_s(job)
        row = rows[job.job_id]
        job_jct, job_wait = float(row["jct_s"]), float(row["wait_s"])
        best += run_s
        min_rest = min(min_rest, job_jct - job_wait - run_s)
        wait += job_wait
        jct += job_jct
        if len(job.requirements.counts) > 1:
            elastic += 1
            rest_elastic += job_jct - job_wait - run_s
        else:
            rest_rigid += job_jct - job_wait - run_s
    n = len(jobs)
    return {
        "jobs": n,
        "elastic_jobs": elastic,
        "avg_jct_h": jct / n / HOUR_S,
        "avg_best_run_h": best / n / HOUR_S,
        "avg_wait_h": wait / n / HOUR_S,
        "avg_rest_h": (rest_elastic + rest_rigid) / n / HOUR_S,
        "rest_elastic_share": rest_elastic / (rest_elastic + rest_rigid)
        if rest_elastic + rest_rigid
        else 0.0,
        "avg_rest_elastic_h": rest_elastic / max(elastic, 1) / HOUR_S,
        "avg_rest_rigid_h": rest_rigid / max(n - elastic, 1) / HOUR_S,
        "min_rest_h": min_rest / HOUR_S,  # below 0 only if a job beat its best run time: the bound broke
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True, help="the run's --cluster (a paper-world cluster)")
    ap.add_argument("--jobs-csv", type=Path, required=True, help="jobs.csv of hopsmgr simulate --out")
    ap.add_argument("--workload", required=True, help="the run's --workload (poisson:jobs=N,rate=R)")
    ap.add_argument("--seed", type=int, required=True, help="the run's --seed")
    ap.add_argument(
        "--server-sigma",
        type=float,
        default=DEFAULT_SERVER_SIGMA,
        help=f"the run's --server-sigma (default {DEFAULT_SERVER_SIGMA})",
    )
    ap.add_argument("--json", type=Path, help="write the figures here (flat JSON)")
    args = ap.parse_args(argv)
    if not args.jobs_csv.is_file():
        print(f"--jobs-csv: no such file {str(args.jobs_csv)!r}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.server_sigma) and args.server_sigma >= 0):
        print(f"--server-sigma: must be a non-negative number, got {args.server_sigma!r}", file=sys.stderr)
        return 2
    try:
        cluster = parse_cluster(args.cluster)
    except SimInputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        figures = parts(args.jobs_csv, args.workload, args.seed, cluster, args.server_sigma)
    except ValueError as exc:
        print(f"--workload: {exc}", file=sys.stderr)
        return 2
    for key, value in figures.items():
        print(f"{key:22} {value:.3f}" if isinstance(value, float) else f"{key:22} {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
