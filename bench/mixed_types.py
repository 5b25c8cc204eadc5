"""Placements across GPU types with speed-balanced batches: Hops with `mixed_types` on and off.

For each cluster file, workload spec and seed, runs Hops twice in the simulator and reports, flat per
run: average JCT, makespan, worst latency ratio, idle GPUs per round while work waits, utilisation,
preemptions, moves, how many jobs ran on a placement across GPU types, and the estimator's error on
multi-server configurations, split into those across types and those of one type (mean signed and
mean absolute relative error of the predicted rate against the ground truth).

    python bench/mixed_types.py --runs configs/sim/paper-16.toml@poisson:jobs=100,rate=8 --seeds 1,2 \\
        --json bench/results/issue13-mixed.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hopsmgr.core.model import Config, spans_types
from hopsmgr.sim import runner
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.simstate import job_key


class _ErrorLog:
    """Wraps Simulation._sample_error to keep signed errors of multi-server configurations."""

    def __init__(self) -> None:
        self.errors: dict[bool, list[float]] = {True: [], False: []}
        self._orig = Simulation._sample_error

    def __enter__(self) -> _ErrorLog:
        log = self

        def sample(
            sim: Simulation, job: Any, config: Config, parts: Any, seen: bool, shares: tuple[float, ...] = ()
        ) -> None:
            # the same truth as the engine's own sample (the job's own variation, the batch's shares)
            predicted = sim.machine.estimator.config_rate(job.spec, config, sim.by_id)
            true = sim.world.true_rate(job.w.model, parts, job_key(job.spec.id), shares)
            if predicted and true > 0 and len(config.parts) > 1:
                log.errors[spans_types(config, sim.by_id)].append((predicted - true) / true)
            log._orig(sim, job, config, parts, seen, shares)

        Simulation._sample_error = sample  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        Simulation._sample_error = self._orig  # type: ignore[method-assign]


def one_run(cluster_path: str, spec: str, seed: int, mixed: bool) -> dict[str, Any]:
    cluster = runner.parse_cluster(cluster_path)
    cluster = replace(cluster, scheduler=replace(cluster.scheduler, mixed_types=mixed))
    world = runner.make_world(None, cluster, seed, None)
    workload = runner.load_workload(world, spec, None, None, seed)
    t0 = time.perf_counter()
    with _ErrorLog() as log:
        result = runner.run_policy(runner.RunSpec(cluster, world, workload, ("hops",), seed), "hops")
    row = runner.summarise(result, time.perf_counter() - t0)

    def mean(values: list[float]) -> float | None:
        return statistics.mean(values) if values else None

    return {
        "cluster": cluster_path,
        "workload": spec,
        "seed": seed,
        "mixed_types": mixed,
        "avg_jct_h": row["avg_jct_h"],
        "makespan_h": row["makespan_h"],
        "max_lr": row["max_lr"],
        "frags_per_round": row["frags_per_round"],
        "utilisation": row["utilisation"],
        "preemptions": row["preemptions"],
        "migrations": row["migrations"],
        "jobs_across_types": sum(1 for o in result.per_job if len(o.gpu_types) > 1),
        "err_mixed_signed": mean(log.errors[True]),
        "err_mixed_abs": mean([abs(e) for e in log.errors[True]]),
        "err_one_type_signed": mean(log.errors[False]),
        "err_one_type_abs": mean([abs(e) for e in log.errors[False]]),
        "samples_mixed": len(log.errors[True]),
        "wall_s": row["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", required=True, help="CLUSTER@WORKLOAD[;CLUSTER@WORKLOAD...]")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for item in args.runs.split(";"):
        cluster_path, _, spec = item.partition("@")
        for seed in (int(s) for s in args.seeds.split(",")):
            for mixed in (True, False):
                row = one_run(cluster_path, spec, seed, mixed)
                rows.append(row)
                print(
                    f"{Path(cluster_path).stem} {spec} seed {seed} mixed={mixed}: avg JCT {row['avg_jct_h']:.3f} h,"
                    f" makespan {row['makespan_h']:.2f} h, max LR {row['max_lr']:.2f}, idle/round"
                    f" {row['frags_per_round']:.2f}, utilisation {row['utilisation']:.3f}, preemptions"
                    f" {row['preemptions']}, moves {row['migrations']}, jobs across types"
                    f" {row['jobs_across_types']}, error across types {row['err_mixed_signed'] or 0:+.3f}"
                    f" (abs {row['err_mixed_abs'] or 0:.3f}), one type {row['err_one_type_signed'] or 0:+.3f}"
                    f" ({row['wall_s']:.0f} s)",
                    flush=True,
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
