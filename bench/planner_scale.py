"""Planner scale benchmark: whole Hops rounds on busy heterogeneous clusters.

Builds seeded rounds (hopsmgr.core.scenario.busy_instance: half of the GPUs held by running jobs, a
queue of waiting jobs with mixed requirement sets, 4- and 8-GPU servers of several types with
per-server calibration variation), runs `plan_round` on each and reports per-phase times, the model
size, whether the answer was proven within the gap, and the objective against a separate exact solve
(CBC, gap 0, long time limit) of the first round's instance. objective_vs_exact divides our objective
by that solve's best bound (its optimum when proven, else its LP bound): a conservative ratio <= 1.

    python bench/planner_scale.py --gpus 512 --queued 1000 --rounds 5 --seed 1 --json out.json

Each round plans a fresh instance with a fresh estimator (cold: every throughput estimate is computed).
With --warm the same snapshot is planned a second time on the same estimator and timed separately
(warm_*): the estimator's per-job caches then answer, as between two rounds of a running master for
jobs whose profiles and observations did not change (a job that reported new observations pays its
estimates again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from hopsmgr.core.planner import plan_round
from hopsmgr.core.scenario import busy_instance
from hopsmgr.core.settings import SchedulerSettings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=512)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--types", type=int, default=4, help="GPU types in the cluster (3-5)")
    parser.add_argument("--exact-time-limit", type=float, default=120.0)
    parser.add_argument("--no-exact", action="store_true", help="skip the exact reference solve")
    parser.add_argument("--solver", default="auto", choices=["auto", "exact", "classes"])
    parser.add_argument("--json", type=Path, help="write the flat result object here")
    parser.add_argument("--warm", action="store_true", help="also time a second plan on the same estimator")
    args = parser.parse_args(argv)
    if args.gpus <= 0 or args.queued < 0 or args.rounds <= 0:
        parser.error(
            f"--gpus, --rounds must be > 0 and --queued >= 0 (got {args.gpus}, {args.rounds}, {args.queued})"
        )

    settings = SchedulerSettings(solver=args.solver)
    rows = []
    warm_rows = []
    first = None
    for r in range(args.rounds):
        inst = busy_instance(args.seed + r, args.gpus, args.queued, types=args.types)
        first = first or inst
        t0 = time.perf_counter()
        plan = plan_round(inst.snapshot, inst.estimator, settings, time.perf_counter)
        wall = time.perf_counter() - t0
        s = plan.stats
        rows.append((wall, s))
        print(
            f"round {r}: {wall:.3f}s  model={s.model} method={s.method} vars={s.variables} "
            f"config={s.config_s:.3f}s build={s.build_s:.3f}s solve={s.solve_s:.3f}s map={s.map_s:.3f}s "
            f"objective={s.objective:.2f} bound={s.bound} gap={s.gap} proven={s.proven} idle={plan.idle_gpus} "
            f"fallback={s.fallback}",
            flush=True,
        )
        if args.warm:
            t0 = time.perf_counter()
            again = plan_round(inst.snapshot, inst.estimator, settings, time.perf_counter)
            warm_wall = time.perf_counter() - t0
            warm_rows.append((warm_wall, again.stats))
            print(
                f"  warm: {warm_wall:.3f}s config={again.stats.config_s:.3f}s solve={again.stats.solve_s:.3f}s "
                f"method={again.stats.method} objective={again.stats.objective:.2f}",
                flush=True,
            )
    ours = rows[0][1].objective
    ratio = None
    exact_info: dict[str, object] = {}
    if not args.no_exact and first is not None:
        exact_settings = dataclasses.replace(
            settings, solver="exact", gap=0.0, time_limit_s=args.exact_time_limit
        )
        t0 = time.perf_counter()
        ref = plan_round(first.snapshot, first.estimator, exact_settings, time.perf_counter)
        bound = ref.stats.objective if ref.stats.proven else (ref.stats.bound or ref.stats.objective)
        ratio = ours / bound if bound > 0 else 1.0
        exact_info = {
            "exact_objective": ref.stats.objective,
            "exact_bound": bound,
            "exact_proven": ref.stats.proven,
            "exact_s": time.perf_counter() - t0,
        }
        print(
            f"exact reference: objective={ref.stats.objective:.2f} bound={bound:.2f} proven={ref.stats.proven} "
            f"in {exact_info['exact_s']:.1f}s; ours/bound = {ratio:.4f}"
        )
    walls = [w for w, _ in rows]
    result = {
        "gpus": args.gpus,
        "queued": args.queued,
        "rounds": args.rounds,
        "seed": args.seed,
        "round_p50_s": statistics.median(walls),
        "round_p95_s": percentile(walls, 95),
        "config_p50_s": statistics.median(s.config_s for _, s in rows),
        "build_p50_s": statistics.median(s.build_s for _, s in rows),
        "build_p95_s": percentile([s.build_s for _, s in rows], 95),
        "solve_p50_s": statistics.median(s.solve_s for _, s in rows),
        "solve_p95_s": percentile([s.solve_s for _, s in rows], 95),
        "map_p50_s": statistics.median(s.map_s for _, s in rows),
        "variables": int(statistics.median(s.variables for _, s in rows)),
        "fallback_fraction": sum(1 for _, s in rows if s.fallback is not None) / len(rows),
        "methods": ",".join(s.method for _, s in rows),
        # The solve's own LP bound: the class LP's value for the class model (valued at each class's
        # median server, so not a rigorous bound), the LP relaxation for the exact model.
        "lp_bound": rows[0][1].bound,
        "objective_vs_lp_bound": (ours / rows[0][1].bound) if rows[0][1].bound else None,
        "objective_vs_lp_bound_p50": statistics.median(s.objective / s.bound for _, s in rows if s.bound)
        if any(s.bound for _, s in rows)
        else None,
        "model": rows[0][1].model,
        "proven_optimal_fraction": sum(1 for _, s in rows if s.proven) / len(rows),
        "objective": ours,
        "objective_vs_exact": ratio,
        **exact_info,
    }
    if warm_rows:
        warm_walls = [w for w, _ in warm_rows]
        result |= {
            "warm_round_p50_s": statistics.median(warm_walls),
            "warm_round_p95_s": percentile(warm_walls, 95),
            "warm_config_p50_s": statistics.median(s.config_s for _, s in warm_rows),
            "warm_solve_p50_s": statistics.median(s.solve_s for _, s in warm_rows),
            "warm_fallback_fraction": sum(1 for _, s in warm_rows if s.fallback is not None) / len(warm_rows),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
