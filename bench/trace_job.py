"""Trace one job through a simulation: every plan that changed its placement (the live jobs, their
priorities and placements, the job's five best candidates), each launch of it with the estimator's
rate (its own layers, and with the transfer prior) against the ground truth (hopsmgr.sim.truth).

`--force-plans` marks the machine changed at every round, so that a first plan is asked for even when
nothing waits and nothing changed (an experiment on the level-triggered rounds of
hopsmgr.control.cycle, not a setting of the product). `--prior-launches` lists the launches on a GPU
type the job had no profile on (where the transfer prior answered).

It wraps private methods of hopsmgr.sim.engine.Simulation: a debugging aid, not a benchmark.

    python bench/trace_job.py --job j00002 --seed 2 --policy hops-srtf-lr \
        --workload poisson:jobs=25,rate=10 [--verbose] [--force-plans] [--prior-launches]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from hopsmgr.control.planning import compute_plan
from hopsmgr.core.model import Config
from hopsmgr.core.transfer import with_transfer
from hopsmgr.policies.registry import make_policy
from hopsmgr.sim import runner
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.simstate import SimOptions, job_key


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.3f} h"


def _r(rate: float | None) -> str:
    return "unknown" if rate is None else f"{rate:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--cluster", default="configs/sim/paper-64.toml")
    parser.add_argument("--workload", default="poisson:jobs=25,rate=10")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--policy", default="hops-srtf-lr")
    parser.add_argument("--job", default="j00002")
    parser.add_argument("--verbose", action="store_true", help="every plan with the job, not only changes")
    parser.add_argument("--force-plans", action="store_true")
    parser.add_argument("--prior-launches", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HOPSMGR_SHARED_DATA", "/work/shared/data")

    cluster = runner.parse_cluster(args.cluster)
    world = runner.make_world(None, cluster, args.seed, None)
    workload = runner.load_workload(world, args.workload, None, None, args.seed)
    policy = make_policy(args.policy, cluster.scheduler)
    sim = Simulation(
        world,
        cluster.servers,
        workload,
        policy,
        SimOptions(seed=args.seed),
        time.perf_counter,
        None,
        cluster.tenant_map(),
    )
    est = sim.machine.estimator
    planner_view = with_transfer(est)
    by_job = {w.job_id: w for w in workload}
    job = args.job
    print(job, by_job[job].model, by_job[job].requirements, f"{by_job[job].total_samples:.0f} samples")

    def rates(job_id: str, config: Config) -> tuple[float | None, float | None, float]:
        spec = sim.jobs[job_id].spec
        parts = [(sim.by_id[s], g) for s, g in config.parts]
        true = world.true_rate(sim.jobs[job_id].w.model, parts, job_key(job_id))
        return (
            est.config_rate(spec, config, sim.by_id),
            planner_view.config_rate(spec, config, sim.by_id),
            true,
        )

    def plan(request: Any) -> None:  # Simulation._plan, printing the plans that concern the job
        ready = compute_plan(request, sim.policy, est, sim.timer)
        p = ready.plan
        sim.plans.append((request.kind, sim.now))
        sim._promises = dict(p.backfills)
        sim._reserved.update(r.job_id for r in p.reservations)
        sim._round_solver_s += ready.planner_s
        sim._solver_delay += ready.planner_s
        sim._pending.append(ready)
        current = {v.id: v.current for v in request.snapshot.jobs}
        if job not in current or (p.assignments.get(job) == current[job] and not args.verbose):
            return
        print(
            f"--- {request.kind} plan at {_h(sim.now)}: {job} {current[job]} -> {p.assignments.get(job)}"
            f" (profiled on {sorted(est.profiled_types(job))})"
        )
        for jid in sorted(current):
            print(
                f"    {jid} {by_job[jid].model} {by_job[jid].requirements.counts} priority "
                f"{p.priorities.get(jid, float('nan')):.4g}: {current[jid]} -> {p.assignments.get(jid)}"
            )
        explain = p.explain.get(job)
        if explain is not None:
            for cand in explain.candidates:
                print(f"      candidate {cand.config} rate {cand.rate:.1f} value {cand.value:.4g}")
            if explain.note:
                print(f"      note: {explain.note}")

    def launch(command: Any) -> None:
        if args.prior_launches:
            types = {sim.by_id[s].gpu_type for s, _ in command.placement.parts}
            missing = sorted(t for t in types if not est.has_profile(command.job_id, t))
            if missing:
                own, planner, true = rates(command.job_id, command.placement)
                print(
                    f"PRIOR {command.job_id} at {_h(sim.now)} on {command.placement} (no profile on "
                    f"{missing}): planner's {_r(planner)} (own layers {_r(own)}), true {true:.1f}"
                )
        launch_inner(command)
        if command.job_id == job:
            run = sim.runs[command.attempt_id]
            own, planner, _ = rates(job, command.placement)
            left = sim.jobs[job].spec.total_samples - sim.jobs[job].done
            print(
                f"LAUNCH {job} at {_h(sim.now)} on {command.placement}: true {run.rate:.1f}, estimated "
                f"{_r(planner)} (own layers {_r(own)}); {left / sim.jobs[job].spec.total_samples:.3f} left, "
                f"{left / run.rate / 3600:.2f} h at the true rate"
            )

    launch_inner = sim._launch
    sim._plan = plan  # type: ignore[method-assign]
    sim._launch = launch  # type: ignore[method-assign]
    if args.force_plans:
        round_inner = sim._round

        def forced_round() -> None:
            sim.machine.changed = True
            round_inner()

        sim._round = forced_round  # type: ignore[method-assign]
    result = sim.run()
    jct = {r.job_id: (r.end_time or 0.0) - r.submit_time for r in result.jobs}
    print(
        f"{job} JCT {_h(jct[job])}; avg JCT {statistics.mean(jct.values()) / 3600:.3f} h, "
        f"makespan {result.span_s / 3600:.2f} h"
    )


if __name__ == "__main__":
    main()
