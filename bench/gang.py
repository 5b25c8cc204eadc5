"""Big gang jobs among a flood of small ones: are they starved, and does backfill delay their reservations?

Runs the simulator on `--workload gang:...` (hopsmgr.sim.workload.gang_workload: short rigid 1-GPU
jobs, a rigid 16- or 32-GPU job every `big_every`-th arrival) for each policy and seed, and reports
per run, flat: the worst latency ratio of the big jobs and of the 1-GPU jobs and their ratio (issue 13
target: <= 2), the big jobs' mean and worst wait, how many jobs got a reservation, how many attempts
were backfilled onto reserved GPUs and how many of those delayed a reservation (still there after the
start they promised to end by, the reserved job not yet started; target < 5%), average JCT, makespan,
idle GPUs per round while work waits and preemptions. `hops-res` and `hops-nores` are Hops with
`reservations` on and off whatever the cluster file says. With several seeds it also prints, per
workload and policy, on how many seeds the big-job target was missed: one seed's ratio says little
(docs/results.md measures it on ten).

    python bench/gang.py --cluster configs/sim/paper-64.toml --rates 60,100 --seeds 1,2,3,4,5,6,7,8,9,10 \
        --policies hops --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hopsmgr.core import metrics
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.sim import runner

ROOT = Path(__file__).resolve().parents[1]


def one_run(
    cluster_path: str, spec: str, seed: int, policy: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    cluster = runner.parse_cluster(cluster_path)
    if overrides:
        cluster = replace(cluster, scheduler=replace(cluster.scheduler, **overrides))
    name = policy
    if policy in ("hops-res", "hops-nores"):
        on = policy == "hops-res"
        cluster = replace(cluster, scheduler=replace(cluster.scheduler, reservations=on))
        name = "hops"
    world = runner.make_world(None, cluster, seed, None)
    workload = runner.load_workload(world, spec, None, None, seed)
    t0 = time.perf_counter()
    result = runner.run_policy(runner.RunSpec(cluster, world, workload, (name,), seed), name)
    wall = time.perf_counter() - t0
    big_min = cluster.scheduler.reserve_min_gpus
    width = {w.job_id: w.requirements.minimum for w in workload}

    def ratio(r: metrics.JobRecord) -> float:
        return r.waited_s / r.expected_run_s if r.expected_run_s > 0 else 0.0

    big = [r for r in result.jobs if width[r.job_id] >= big_min]
    small = [r for r in result.jobs if width[r.job_id] == 1]
    worst_big = max((ratio(r) for r in big), default=0.0)
    worst_small = max((ratio(r) for r in small), default=0.0)
    summary = metrics.summary(result.jobs, result.rounds)
    late = sum(1 for b in result.backfills if b.late)
    return {
        "policy": policy,
        "workload": spec,
        "seed": seed,
        "big_jobs": len(big),
        "max_lr_big": worst_big,
        "max_lr_1gpu": worst_small,
        "lr_ratio_big_to_1gpu": worst_big / worst_small if worst_small > 0 else None,
        "mean_wait_big_h": sum(r.waited_s for r in big) / len(big) / 3600 if big else None,
        "max_wait_big_h": max((r.waited_s for r in big), default=0.0) / 3600,
        "reserved_jobs": result.reserved_jobs,
        "backfills": len(result.backfills),
        "backfills_late": late,
        "backfills_late_share": late / len(result.backfills) if result.backfills else None,
        "avg_jct_h": summary["avg_jct_h"],
        "makespan_h": summary["makespan_h"],
        "frags_per_round": summary["frags_per_round"],
        "preemptions": result.preemptions,
        "completed": summary["completed"],
        "jobs": summary["jobs"],
        "wall_s": wall,
    }


TARGET_RATIO = 2.0  # issue 13: the big jobs' worst latency ratio within 2x the 1-GPU jobs'


def _ratio(row: dict[str, Any]) -> float:
    value = row["lr_ratio_big_to_1gpu"]
    if value is None:  # no 1-GPU job waited
        return math.inf if row["max_lr_big"] > 0 else 0.0
    return float(value)


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per workload and policy over its seeds: how many runs missed the big-job target (a
    ratio above TARGET_RATIO, or big jobs waiting while no 1-GPU job did), the median and worst ratio,
    and the mean average JCT and preemptions. Single runs of this scenario differ by tens of percent
    from seed to seed, so a target is judged on the count of misses, not on one or two seeds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in runs:
        groups.setdefault((row["workload"], row["policy"]), []).append(row)
    rows = []
    for (workload, policy), group in groups.items():
        ratios = [_ratio(r) for r in group]
        rows.append(
            {
                "workload": workload,
                "policy": policy,
                "runs": len(group),
                "missed": sum(1 for x in ratios if x > TARGET_RATIO),
                "median_ratio": statistics.median(ratios),
                "worst_ratio": max(ratios),
                "mean_avg_jct_h": statistics.fmean(r["avg_jct_h"] for r in group),
                "mean_preemptions": statistics.fmean(r["preemptions"] for r in group),
            }
        )
    return rows


BOOLEANS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def setting(item: str) -> tuple[str, Any]:
    """A `--set KEY=VALUE`: the field and its value, checked as a cluster file's would be (bad input
    ends the run with a message naming the key as given)."""
    name, _, text = item.partition("=")
    key = "lambda_" if name == "lambda" else name  # the TOML key (hopsmgr.config) or the field's name
    default = getattr(SchedulerSettings(), key, None)
    if default is None or not text:
        raise SystemExit(f"--set: {item!r} is not KEY=VALUE of a scheduler setting")
    value: Any
    if isinstance(default, bool):
        if text.lower() not in BOOLEANS:
            raise SystemExit(f"--set: {name} = {text!r} is not true or false")
        value = BOOLEANS[text.lower()]
    else:
        try:
            value = type(default)(text)
        except ValueError:
            raise SystemExit(f"--set: {name} = {text!r} is not a {type(default).__name__}") from None
    try:
        replace(SchedulerSettings(), **{key: value})
    except ValueError as exc:
        raise SystemExit(f"--set: {name} = {text!r}: {exc}") from None
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cluster", default=str(ROOT / "configs/sim/paper-64.toml"))
    parser.add_argument("--rates", default="60,100", help="arrival rates per hour, comma-separated")
    parser.add_argument("--jobs", type=int, default=800)
    parser.add_argument("--big-every", type=int, default=40)
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--policies", default="hops-res,hops-nores,sia-lr,gavel-lr")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a [scheduler] setting for every run"
    )
    parser.add_argument("--json", type=Path, help="write the runs here (a list of flat objects)")
    args = parser.parse_args()
    overrides = dict(setting(item) for item in args.set)
    runs = []
    for rate in (float(r) for r in args.rates.split(",")):
        spec = f"gang:jobs={args.jobs},rate={rate:g},big_every={args.big_every}"
        for seed in (int(s) for s in args.seeds.split(",")):
            for policy in args.policies.split(","):
                row = one_run(args.cluster, spec, seed, policy, overrides)
                row.update({f"set_{k}": v for k, v in overrides.items()})
                runs.append(row)
                print(
                    f"{spec} seed {seed} {policy:>10}: max LR big {row['max_lr_big']:.2f} / 1-GPU "
                    f"{row['max_lr_1gpu']:.2f} = {row['lr_ratio_big_to_1gpu'] or 0:.2f}; big wait mean "
                    f"{row['mean_wait_big_h'] or 0:.2f} h max {row['max_wait_big_h']:.2f} h; reserved "
                    f"{row['reserved_jobs']}, backfills {row['backfills']} (late {row['backfills_late']}); "
                    f"avg JCT {row['avg_jct_h']:.2f} h, makespan {row['makespan_h']:.2f} h, idle/round "
                    f"{row['frags_per_round']:.2f}, preemptions {row['preemptions']} ({row['wall_s']:.0f} s)",
                    flush=True,
                )
    if len(args.seeds.split(",")) > 1:
        for row in summarise(runs):
            print(
                f"{row['workload']} {row['policy']:>10}: target missed on {row['missed']} of {row['runs']} "
                f"seeds; ratio median {row['median_ratio']:.2f}, worst {row['worst_ratio']:.2f}; mean avg JCT "
                f"{row['mean_avg_jct_h']:.3f} h, mean preemptions {row['mean_preemptions']:.0f}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
