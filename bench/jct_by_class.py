"""Where simulated runs lose against the JCT lower bound, class by class of jobs.

bench/jct_bound.py --per-job writes each job's best run time and JCT in the relaxation's optimum;
`hopsmgr simulate --out DIR` writes each job's JCT to DIR/jobs.csv. This sets them side by side,
grouped three ways: by the job's best run time (quartiles over the workload), by its smallest GPU
count, and rigid (one GPU count) against elastic. For each class and policy it prints the average JCT,
its ratio to the bound's, the average running time (JCT less wait; the bound's: its jobs' time shares
of running), and the class's share of the policy's whole excess over the bound (the sum
over the class's jobs of JCT minus bound JCT, over that sum for all jobs): where the policy's lost time
lies. JSON keys join kind, class, policy and figure with ":" (e.g. "shape:elastic:hops:avg_jct_h").

The bound's split among jobs is one optimum of the relaxation, not the only one; a class's bound JCT
is therefore indicative, while the total is the bound. Every run's jobs must be the bound's workload
(same --workload and --seed), which is checked by job id.

    python bench/jct_by_class.py --bound B.csv --runs DIR1/jobs.csv [LABEL=DIR2/jobs.csv ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class JobFacts:
    job_id: str
    best_run_h: float
    bound_jct_h: float
    bound_run_h: float
    gpus: tuple[int, ...]


def read_bound(path: Path) -> dict[str, tuple[float, float, float]]:
    """job -> (best run h, bound JCT h, bound run h), from jct_bound.py --per-job."""
    if not path.is_file():
        raise ValueError(f"--bound {path}: no such file")
    with path.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"job", "best_run_h", "jct_h", "run_h"} <= set(rows[0]):
        raise ValueError(
            f"--bound {path}: not a jct_bound.py --per-job file (columns job,best_run_h,jct_h,run_h)"
        )
    try:
        return {r["job"]: (float(r["best_run_h"]), float(r["jct_h"]), float(r["run_h"])) for r in rows}
    except ValueError as exc:
        raise ValueError(f"--bound {path}: {exc}") from exc


RunJob = tuple[float, float, tuple[int, ...]]  # (JCT h, wait h, GPU counts)


def run_file(spec: str) -> tuple[str, Path]:
    """A --runs argument as (label, path): LABEL=PATH when LABEL has no "/" and PATH is given, else a
    plain path (label "")."""
    label, sep, rest = spec.partition("=")
    if sep and label and rest and "/" not in label:
        return label, Path(rest)
    return "", Path(spec)


def read_runs(specs: Iterable[str]) -> dict[str, dict[str, RunJob]]:
    """policy -> job -> (JCT h, wait h, GPU counts), from `hopsmgr simulate --out` jobs.csv files, each
    given as PATH or LABEL=PATH (its policies then named LABEL/policy, to tell runs of one policy apart)."""
    runs: dict[str, dict[str, RunJob]] = {}
    for spec in specs:
        label, path = run_file(spec)
        if not path.is_file():
            raise ValueError(f"--runs {spec}: no such file")
        seen: set[str] = set()
        with path.open(encoding="utf-8") as f:
            for r in csv.DictReader(f):
                try:
                    policy = f"{label}/{r['policy']}" if label else r["policy"]
                    if r["completed"] != "1":
                        raise ValueError(f"job {r['job']!r} of {policy!r} did not complete")
                    gpus = tuple(int(g) for g in r["gpus"].split())
                    jct, wait = float(r["jct_s"]) / HOUR_S, float(r["wait_s"]) / HOUR_S
                except KeyError as exc:
                    raise ValueError(
                        f"--runs {spec}: no column {exc} (not a jobs.csv of hopsmgr simulate)"
                    ) from exc
                except ValueError as exc:
                    raise ValueError(f"--runs {spec}: {exc}") from exc
                if policy in runs and policy not in seen:
                    raise ValueError(
                        f"--runs {spec}: {policy} is in another file too; name them apart (LABEL=PATH)"
                    )
                seen.add(policy)
                runs.setdefault(policy, {})[r["job"]] = (jct, wait, gpus)
    return runs


def quartile_of(values: Sequence[float]) -> Callable[[float], str]:
    """A value's quartile among `values`, named by its range of best run times."""
    ordered = sorted(values)
    cuts = [ordered[len(ordered) * k // 4] for k in (1, 2, 3)]
    names = [
        f"best run < {cuts[0]:.2f} h",
        f"{cuts[0]:.2f}-{cuts[1]:.2f} h",
        f"{cuts[1]:.2f}-{cuts[2]:.2f} h",
        f">= {cuts[2]:.2f} h",
    ]
    return lambda v: names[sum(v >= c for c in cuts)]


def classes(facts: Sequence[JobFacts]) -> dict[str, Callable[[JobFacts], str]]:
    by_best = quartile_of([f.best_run_h for f in facts])
    return {
        "best_run": lambda f: by_best(f.best_run_h),
        "min_gpus": lambda f: f"{min(f.gpus)} GPU" + ("s" if min(f.gpus) > 1 else ""),
        "shape": lambda f: "elastic" if len(f.gpus) > 1 else "rigid",
    }


Row = tuple[str, str, str, int, float, float, float, float, float, float]


def compare(
    bound: Mapping[str, tuple[float, float, float]], runs: Mapping[str, Mapping[str, RunJob]]
) -> tuple[list[Row], dict[str, float]]:
    """Rows (kind, class, policy, jobs, best run, bound avg JCT, bound avg run, policy avg JCT, policy
    avg run (JCT less wait), share of the policy's excess) and the flat figures."""
    policies = sorted(runs)
    if not policies:
        raise ValueError("--runs: no jobs found")
    for policy in policies:
        if set(runs[policy]) != set(bound):
            missing = sorted(set(bound) ^ set(runs[policy]))[:3]
            raise ValueError(f"--runs: {policy}'s jobs are not the bound's workload (e.g. {missing})")
    first = runs[policies[0]]
    facts = [JobFacts(j, best, jct, run, first[j][2]) for j, (best, jct, run) in sorted(bound.items())]
    rows: list[Row] = []
    figures: dict[str, float] = {
        "jobs": float(len(facts)),
        "bound_avg_jct_h": _mean(f.bound_jct_h for f in facts),
    }
    for policy in policies:
        figures[f"{policy}:avg_jct_h"] = _mean(runs[policy][f.job_id][0] for f in facts)
    for kind, key in classes(facts).items():
        groups: dict[str, list[JobFacts]] = {}
        for f in facts:
            groups.setdefault(key(f), []).append(f)
        for name in sorted(groups, key=lambda n: _order(groups[n], kind)):
            members = groups[name]
            bound_avg = _mean(f.bound_jct_h for f in members)
            bound_run = _mean(f.bound_run_h for f in members)
            best = _mean(f.best_run_h for f in members)
            for policy in policies:
                jct = runs[policy]
                total_excess = sum(jct[f.job_id][0] - f.bound_jct_h for f in facts)
                excess = sum(jct[f.job_id][0] - f.bound_jct_h for f in members)
                share = excess / total_excess if total_excess > 0 else 0.0
                avg = _mean(jct[f.job_id][0] for f in members)
                run = _mean(jct[f.job_id][0] - jct[f.job_id][1] for f in members)
                rows.append((kind, name, policy, len(members), best, bound_avg, bound_run, avg, run, share))
                figures[f"{kind}:{name}:{policy}:avg_jct_h"] = avg
                figures[f"{kind}:{name}:{policy}:avg_run_h"] = run
                figures[f"{kind}:{name}:{policy}:excess_share"] = share
            figures[f"{kind}:{name}:jobs"] = float(len(members))
            figures[f"{kind}:{name}:bound_avg_jct_h"] = bound_avg
            figures[f"{kind}:{name}:bound_avg_run_h"] = bound_run
            figures[f"{kind}:{name}:avg_best_run_h"] = best
    return rows, figures


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def _order(members: Sequence[JobFacts], kind: str) -> float:
    if kind == "best_run":
        return min(f.best_run_h for f in members)
    if kind == "min_gpus":
        return float(min(members[0].gpus))
    return float(len(members[0].gpus) > 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", type=Path, required=True, help="jct_bound.py --per-job CSV")
    ap.add_argument(
        "--runs",
        nargs="+",
        required=True,
        help="jobs.csv files of hopsmgr simulate --out (PATH or LABEL=PATH)",
    )
    ap.add_argument("--json", type=Path, help="write the figures here (flat JSON)")
    args = ap.parse_args(argv)
    try:
        rows, figures = compare(read_bound(args.bound), read_runs(args.runs))
    except (OSError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(
        f"{'class':28} {'policy':22} {'jobs':>5} {'best':>6} {'bound':>6} {'b.run':>6} {'JCT':>6} {'run':>6}"
        f" {'x bound':>8} {'excess':>7}"
    )
    for kind, name, policy, n, best, bound_avg, bound_run, avg, run, share in rows:
        ratio = avg / bound_avg if bound_avg > 0 else float("inf")
        print(
            f"{kind + ': ' + name:28} {policy:22} {n:5d} {best:6.3f} {bound_avg:6.3f} {bound_run:6.3f}"
            f" {avg:6.3f} {run:6.3f} {ratio:8.2f} {share:7.1%}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
