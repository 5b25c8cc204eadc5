"""Fidelity: one workload on a live local cluster and in the simulator, and how far apart they land.

The live side is what `hopsmgr up` runs (hopsmgr.local.cluster.LocalCluster: a master and one
emulated-device agent per server, real processes, loopback only) on `configs/fidelity.toml`; the bench
submits a fixed workload of `examples/emulated_train.py` jobs for two tenants through the API (the nlp
tenant borrows the whole cluster first, the vision tenant, guaranteed 2 GPUs, arrives later and
reclaims them: preemptions), waits until every job has ended (or `--timeout`), then stops the cluster.

The simulator side drives the same scheduler state machine on the same cluster file, with the same
submissions (at the live run's measured submission offsets), against `EmulatedWorld`
(hopsmgr.sim.emulated): the emulated speeds as ground truth. The simulated executor's costs are
calibration constants measured on live runs of this bench on this machine (`--launch-s`,
`--profile-fixed-s`, `--checkpoint-s`, `--step-overhead`; defaults: the figures in docs/benchmarks.md);
the same constants measured on this run are written beside them (`measured_*`), so a run also checks
its own calibration.

Preemptions and moves are counted the same way on both sides: checkpoint-and-stops the machine ordered
(live: job events into CHECKPOINTING, kind "migrated" for moves; sim: SimResult.preemptions/migrations).
JCT = end - submit of completed jobs; makespan = last end - first submit.

The live run also keeps every distinct forecast the master showed (hopsmgr/forecast, in the job
details the bench polls) and reports how they came out (`forecast_figures`).

    python bench/sim_vs_live.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopsmgr.config import ClusterConfig, load_cluster_config
from hopsmgr.core.model import RequirementSet
from hopsmgr.local.cluster import EMULATED_SPEED, LocalCluster, emulated_speed
from hopsmgr.policies.base import HopsPolicy
from hopsmgr.sim.emulated import EmulatedModel, EmulatedWorld
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.outcome import SimResult
from hopsmgr.sim.simstate import SimOptions
from hopsmgr.sim.workload import WorkloadJob

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "emulated_train.py"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
BATCH = 16


@dataclass(frozen=True)
class BenchJob:
    at_s: float
    tenant: str
    gpus: tuple[int, ...]
    iters: int
    step_s: float

    @property
    def model(self) -> EmulatedModel:
        base = min(self.gpus)
        return EmulatedModel(EmulatedModel.name_for(self.step_s, BATCH, base), self.step_s, BATCH, base)

    def body(self, python: str) -> dict[str, Any]:
        argv = [python, str(EXAMPLE), "--iters", str(self.iters), "--batch-size", str(BATCH)]
        return {
            "command": [*argv, "--step-seconds", str(self.step_s)],
            "gpus": list(self.gpus),
            "batch_size": BATCH,
            "iterations": self.iters,
            "tenant": self.tenant,
            "name": f"emu-{self.tenant}-{self.iters}",
        }


def workload() -> list[BenchJob]:
    """8 nlp jobs ({1,2}) in the first 7 s fill the 6 GPUs; 5 vision jobs ({1} and {2}) arrive from
    30 s on and take back vision's 2 guaranteed GPUs."""
    jobs = [BenchJob(float(i), "nlp", (1, 2), (400, 600, 800)[i % 3], 0.1) for i in range(8)]
    for i in range(5):
        jobs.append(BenchJob(30.0 + 25.0 * i, "vision", (1,) if i % 2 == 0 else (2,), 300, 0.1))
    return sorted(jobs, key=lambda j: j.at_s)


# ---- live -----------------------------------------------------------------------------------------------
def run_live(
    config_path: Path, config: ClusterConfig, root: Path, jobs: list[BenchJob], timeout_s: float
) -> dict[str, Any]:
    cluster = LocalCluster(config_path, config, root)
    ids: list[str] = []
    submitted: dict[str, float] = {}
    details: dict[str, dict[str, Any]] = {}
    forecasts: dict[str, dict[str, Any]] = {}  # every distinct forecast seen, with the job's state then
    try:
        cluster.start()
        start = time.monotonic()
        deadline = start + timeout_s
        pending = list(jobs)
        while time.monotonic() < deadline:
            while pending and time.monotonic() - start >= pending[0].at_s:
                job = pending.pop(0)
                row = cluster.request("POST", "/api/v1/jobs", job.body(sys.executable))
                ids.append(row["id"])
            details = {j: cluster.get(f"/api/v1/jobs/{j}") for j in ids}
            for job_id, d in details.items():
                if d.get("forecast"):
                    key = f"{job_id} {d['state']} {d['forecast']['made']}"
                    forecasts.setdefault(key, {"id": job_id, "state": d["state"], **d["forecast"]})
            if not pending and all(d["state"] in TERMINAL for d in details.values()):
                break
            time.sleep(1.0)
        timed_out = time.monotonic() >= deadline
    finally:
        cluster.stop()
    for job_id, d in details.items():
        submitted[job_id] = float(d["submitted"])
    attempts = _rows(root / "state" / "state.db", "attempts")
    throughput = _rows(root / "state" / "state.db", "throughput")
    return {
        "ids": ids,
        "details": details,
        "submitted": submitted,
        "attempts": attempts,
        "throughput": throughput,
        "timed_out": timed_out,
        "forecasts": list(forecasts.values()),
    }


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    """Every row of one of the live master's tables (read-only), in insertion order."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"SELECT * FROM {table} ORDER BY seq")]
    finally:
        con.close()


def live_figures(live: dict[str, Any]) -> dict[str, Any]:
    jct, ends, preempt, moves = [], [], 0, 0
    for d in live["details"].values():
        for e in d["history"]:
            if e["state"] == "CHECKPOINTING":
                if e["kind"] == "migrated":
                    moves += 1
                else:
                    preempt += 1
            if e["kind"] == "completed":
                jct.append(e["time"] - d["submitted"])
                ends.append(e["time"])
    first = min(live["submitted"].values()) if live["submitted"] else 0.0
    return {
        "completed": len(jct),
        "avg_jct_s": statistics.fmean(jct) if jct else None,
        "makespan_s": max(ends) - first if ends else None,
        "preemptions": preempt,
        "migrations": moves,
    }


def forecast_figures(live: dict[str, Any], round_s: float) -> dict[str, Any]:
    """How the live master's forecasts (hopsmgr/forecast) came out: for each distinct forecast of a
    running job, its finish P50 against the job's end; of a waiting job, its start P50 against the
    job's next start; errors relative to what was left to wait from when the forecast was made, over
    the forecasts with at least one round (`round_s`) left to wait, as bench/forecast.py counts them
    (a job a second from its end, forecast to end now, would count as an error of 100%)."""
    finish_err, start_err, inside = [], [], 0
    seen = set()
    for f in live.get("forecasts", []):
        history = live["details"][f["id"]]["history"]
        made = f["made"]
        if (f["id"], made) in seen:
            continue
        seen.add((f["id"], made))
        # the job's state when the forecast was made (the master shows it until the next forecast,
        # so a poll may see a forecast made while the job waited beside the job running)
        state = next((e["state"] for e in reversed(history) if e["time"] <= made), "PENDING")
        if state == "RUNNING" and f["finish_p50"] is not None:
            ends = [e["time"] for e in history if e["kind"] == "completed"]
            if ends and ends[0] - made >= round_s:
                finish_err.append(abs(f["finish_p50"] - ends[0]) / (ends[0] - made))
        elif state in ("QUEUED", "PENDING", "PROFILING") and f["start_p50"] is not None:
            starts = [e["time"] for e in history if e["kind"] == "started" and e["time"] >= made]
            if starts and starts[0] - made >= round_s:
                start_err.append(abs(f["start_p50"] - starts[0]) / (starts[0] - made))
                p90 = f["start_p90"]
                inside += (
                    (f["start_p10"] or made) - 1 <= starts[0] <= (p90 if p90 is not None else math.inf) + 1
                )
    return {
        "live_finish_forecasts": len(finish_err),
        "live_finish_p50_abs_error_rel_median": statistics.median(finish_err) if finish_err else None,
        "live_start_forecasts": len(start_err),
        "live_start_p50_abs_error_rel_median": statistics.median(start_err) if start_err else None,
        "live_start_in_p10_p90": inside / len(start_err) if start_err else None,
    }


# ---- calibration measured on the live run -------------------------------------------------------------
def measure_calibration(
    live: dict[str, Any],
    world: EmulatedWorld,
    jobs: dict[str, BenchJob],
    config: ClusterConfig,
    profile_iters: int,
) -> dict[str, float | None]:
    """Per-launch costs of the live run, by subtracting the emulated work from attempt durations (the
    master's own clock: attempt created -> ended): the fixed part of a profiling run, the start-up and
    end detection of a run attempt, a checkpoint-and-stop; and the relative per-iteration overhead."""
    servers = {s.id: s for s in config.servers}
    profile_fixed, launch, checkpoint, overhead = [], [], [], []
    seen_run: set[str] = set()
    stop_time: dict[str, float] = {}
    for d in live["details"].values():
        for e in d["history"]:
            if e["state"] == "CHECKPOINTING" and "checkpoint-and-stop of " in e["message"]:
                stop_time[e["message"].split("checkpoint-and-stop of ")[1].split()[0]] = e["time"]
    bare = EmulatedWorld(world.speeds, list(world._models.values()))  # without the overhead constant
    for a in live["attempts"]:
        job = jobs.get(a["job_id"])
        if job is None or a["ended"] is None:
            continue
        placement = json.loads(a["placement"])
        server = servers[next(iter(placement))]
        iter_s = bare.iteration_s(job.model.name, server)
        if a["profiling"]:
            if a["exit_code"] == 0:
                profile_fixed.append(a["ended"] - a["created"] - profile_iters * iter_s)
            continue
        first = a["job_id"] not in seen_run
        seen_run.add(a["job_id"])
        if first and a["exit_code"] == 0:
            # an iteration on G GPUs does G / R1 of the job's iterations (rt.work)
            steps = math.ceil(job.iters * job.model.base_gpus / sum(placement.values()) - 1e-9)
            launch.append(a["ended"] - a["created"] - steps * iter_s)
        if a["id"] in stop_time:
            checkpoint.append(a["ended"] - stop_time[a["id"]])
    for t in live["throughput"]:
        job = jobs.get(t["job_id"])
        if job is not None and t["samples_per_s"] > 0:
            placement = json.loads(t["placement"])
            server = servers[next(iter(placement))]
            gpus = sum(placement.values())
            overhead.append(bare.reported_rate(job.model.name, server, gpus) / t["samples_per_s"] - 1.0)

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return {
        "measured_profile_fixed_s": med(profile_fixed),
        "measured_launch_s": med(launch),
        "measured_checkpoint_s": med(checkpoint),
        "measured_step_overhead": med(overhead),
    }


PHASES = 4


# ---- simulator ------------------------------------------------------------------------------------------
def run_sim(
    config: ClusterConfig,
    world: EmulatedWorld,
    sim_jobs: list[WorkloadJob],
    args: argparse.Namespace,
    phase_s: float = 0.0,
) -> SimResult:
    policy = HopsPolicy(config.scheduler)
    options = SimOptions(
        round_phase_s=phase_s,
        profile_s=args.profile_fixed_s,
        profile_iterations=config.scheduler.profiling_iterations,
        launch_s=args.launch_s,
        checkpoint_fixed_s=args.checkpoint_s,
        observe_every_s=10.0,  # the master's ControlSettings.observe_every_s
        seed=1,
    )
    sim = Simulation(
        world, list(config.servers), sim_jobs, policy, options, time.perf_counter, None, config.tenant_map()
    )
    return sim.run()


def sim_figures(result: SimResult) -> dict[str, Any]:
    done = [j for j in result.jobs if j.completed and j.end_time is not None]
    jct = [j.end_time - j.submit_time for j in done if j.end_time is not None]
    first = min((j.submit_time for j in result.jobs), default=0.0)
    return {
        "completed": len(done),
        "avg_jct_s": statistics.fmean(jct) if jct else None,
        "makespan_s": max(j.end_time for j in done if j.end_time is not None) - first if done else None,
        "preemptions": result.preemptions,
        "migrations": result.migrations,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "fidelity.toml"))
    p.add_argument("--timeout", type=float, default=420.0, help="stop the live run after this many s")
    p.add_argument("--workdir", default="", help="directory for the live cluster (default: a temp dir)")
    p.add_argument("--launch-s", type=float, default=1.16, help="sim: a launch's start-up + end detection")
    p.add_argument(
        "--profile-fixed-s", type=float, default=0.59, help="sim: profiling run beyond its iterations"
    )
    p.add_argument("--checkpoint-s", type=float, default=0.21, help="sim: checkpoint-and-stop duration")
    p.add_argument("--step-overhead", type=float, default=0.011, help="sim: relative per-iteration overhead")
    p.add_argument("--reuse-live", default="", help="skip the live run: read a run's live.json instead")
    p.add_argument("--json", default="", help="write the figures here (flat JSON)")
    args = p.parse_args(argv)

    config_path = Path(args.config)
    config = load_cluster_config(config_path)
    jobs = workload()
    speeds = {s.id: emulated_speed(config, s.id) for s in config.servers}
    models = list({j.model.name: j.model for j in jobs}.values())
    world = EmulatedWorld(speeds, models, step_overhead=args.step_overhead, default_speed=EMULATED_SPEED)
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hops-fidelity-"))
    print(f"live: {len(jobs)} jobs on {', '.join(f'{k} (speed {v:g})' for k, v in speeds.items())}; {root}")
    t0 = time.monotonic()
    if args.reuse_live:
        live = json.loads(Path(args.reuse_live).read_text())
    else:
        live = run_live(config_path, config, root, jobs, args.timeout)
        live["wall_s"] = time.monotonic() - t0
        (root / "live.json").write_text(json.dumps(live))
    live_wall = live["wall_s"]
    by_id = dict(zip(live["ids"], jobs, strict=False))
    first = min(live["submitted"].values())
    sim_jobs = [
        WorkloadJob(
            job_id=job_id,
            arrival_s=live["submitted"][job_id] - first,
            model=job.model.name,
            requirements=RequirementSet.of(job.gpus),
            total_samples=float(job.iters * BATCH * min(job.gpus)),
            batch_size=BATCH,
            tenant=job.tenant,
        )
        for job_id, job in by_id.items()
    ]
    # The live master's rounds tick on its own clock, so the workload meets them at an arbitrary phase;
    # the simulator is run at PHASES evenly spread phases and its figures are their means.
    t1 = time.monotonic()
    round_s = config.scheduler.round_seconds
    results = [run_sim(config, world, sim_jobs, args, k * round_s / PHASES) for k in range(PHASES)]
    runs = [sim_figures(r) for r in results]
    result = results[0]  # per-job lines below: the phase-0 run
    sim_wall = time.monotonic() - t1
    lv = live_figures(live)
    sm = {
        key: statistics.fmean(r[key] for r in runs) if all(r[key] is not None for r in runs) else None
        for key in runs[0]
    }
    makespans = [r["makespan_s"] for r in runs if r["makespan_s"] is not None]
    calib = measure_calibration(live, world, by_id, config, config.scheduler.profiling_iterations)
    out: dict[str, Any] = {
        "jobs": len(sim_jobs),
        "tenants": len({j.tenant for j in jobs}),
        "gpus": sum(s.gpus for s in config.servers),
        "round_s": config.scheduler.round_seconds,
        "live_completed": lv["completed"],
        "sim_completed": sm["completed"],
        "live_timed_out": live["timed_out"],
        "live_avg_jct_s": lv["avg_jct_s"],
        "sim_avg_jct_s": sm["avg_jct_s"],
        "live_makespan_s": lv["makespan_s"],
        "sim_makespan_s": sm["makespan_s"],
        "live_preemptions": lv["preemptions"],
        "sim_preemptions": sm["preemptions"],
        "live_migrations": lv["migrations"],
        "sim_migrations": sm["migrations"],
        "jct_ratio": ratio(sm["avg_jct_s"], lv["avg_jct_s"]),
        "makespan_ratio": ratio(sm["makespan_s"], lv["makespan_s"]),
        "sim_phases": PHASES,
        "makespan_ratio_min": ratio(min(makespans, default=None), lv["makespan_s"]),
        "makespan_ratio_max": ratio(max(makespans, default=None), lv["makespan_s"]),
        "sim_launch_s": args.launch_s,
        "sim_profile_fixed_s": args.profile_fixed_s,
        "sim_checkpoint_s": args.checkpoint_s,
        "sim_step_overhead": args.step_overhead,
        **calib,
        **forecast_figures(live, config.scheduler.round_seconds),
        "live_wall_s": live_wall,
        "sim_wall_s": sim_wall,
    }
    for key, value in out.items():
        print(f"{key:<26} {value:.3f}" if isinstance(value, float) else f"{key:<26} {value}")
    per_job = {
        j.job_id: (j.end_time - j.submit_time if j.end_time is not None else None) for j in result.jobs
    }
    for job_id, d in live["details"].items():
        ends = [e["time"] for e in d["history"] if e["kind"] == "completed"]
        lj = ends[0] - d["submitted"] if ends else None
        sj = per_job.get(job_id)
        print(
            f"  {job_id} {d['tenant']:<6} gpus {d['gpus']}  live {lj if lj is None else round(lj, 1)}  sim {sj if sj is None else round(sj, 1)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0 if lv["completed"] == len(jobs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
