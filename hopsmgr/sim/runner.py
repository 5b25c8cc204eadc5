"""Runs simulations end to end: cluster and workload from the command line's words, each policy on the
same workload, a metrics table, `results.json` and PNG plots.

`--cluster` takes a TOML file (hopsmgr.config) or an inline spec `TYPE=SERVERSxGPUS[,...]` such as
`v100=2x4,p100=2x4,k80=2x4`. The world (ground truth) is "gavel" when every GPU type is one of Gavel's
measured types (k80, p100, v100) and "paper" otherwise, unless named.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hopsmgr.config import ClusterConfig, ConfigError, load_cluster_config, parse_cluster_config
from hopsmgr.core import metrics
from hopsmgr.core.estimator import Estimator
from hopsmgr.core.model import Server
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.policies.registry import POLICY_NAMES, make_policy
from hopsmgr.sim.engine import Simulation
from hopsmgr.sim.gavelworld import gavel_world
from hopsmgr.sim.oracle import OracleEstimator
from hopsmgr.sim.outcome import SimResult, error_over_time
from hopsmgr.sim.paperworld import paper_world
from hopsmgr.sim.simstate import SimOptions, job_key
from hopsmgr.sim.traces import read_trace, workload_from_spec
from hopsmgr.sim.truth import World
from hopsmgr.sim.workload import WorkloadJob

GAVEL_TYPES = frozenset({"k80", "p100", "v100"})
_SPEC_PART = re.compile(r"^([a-z0-9][a-z0-9_.-]*)=(\d+)x(\d+)$")


class SimInputError(ValueError):
    """Bad command-line input for a simulation (names the option and the value)."""


def parse_cluster(text: str) -> ClusterConfig:
    """A TOML file, or an inline `TYPE=SERVERSxGPUS[,...]` spec."""
    if os.path.exists(text) or text.endswith(".toml"):
        try:
            return load_cluster_config(text)
        except ConfigError as exc:
            raise SimInputError(f"--cluster: {exc}") from exc
    servers: list[dict[str, Any]] = []
    for part in text.split(","):
        match = _SPEC_PART.match(part.strip().lower())
        if match is None:
            raise SimInputError(
                f"--cluster: {part!r} is neither a TOML file nor TYPE=SERVERSxGPUS (e.g. v100=2x4)"
            )
        gpu_type, count, gpus = match.group(1), int(match.group(2)), int(match.group(3))
        if count <= 0:
            raise SimInputError(f"--cluster: {part!r}: the server count must be positive")
        for k in range(count):
            servers.append({"id": f"{gpu_type}-{k + 1:02d}", "gpu_type": gpu_type, "gpus": gpus})
    try:
        return parse_cluster_config({"cluster": {"name": text}, "servers": servers}, source="--cluster")
    except ConfigError as exc:
        raise SimInputError(str(exc)) from exc


def default_throughputs() -> Path:
    base = os.environ.get("HOPSMGR_SHARED_DATA")
    candidates = [Path(base)] if base else []
    here = Path(__file__).resolve().parents[2]
    candidates += [here.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for root in candidates:
        path = root / "gavel" / "simulation_throughputs.json"
        if path.exists():
            return path
    raise SimInputError(
        "--throughputs: no Gavel throughput file found; pass --throughputs FILE "
        "(Gavel's scheduler/simulation_throughputs.json) or set HOPSMGR_SHARED_DATA"
    )


DEFAULT_SERVER_SIGMA = 0.08  # the hidden per-server variation of both worlds (hopsmgr.sim.truth)


def make_world(
    name: str | None,
    cluster: ClusterConfig,
    seed: int,
    throughputs: str | None,
    variation: bool = True,
    server_sigma: float = DEFAULT_SERVER_SIGMA,
) -> World:
    """The ground truth for `cluster`: `server_sigma` is the spread of each server's hidden factors (0:
    every server of one kind alike); `variation=False` (Gavel's assumptions) forces 0 and Gavel's
    measured slowdowns."""
    if not (math.isfinite(server_sigma) and server_sigma >= 0):
        raise SimInputError(f"--server-sigma: must be a non-negative number, got {server_sigma!r}")
    types = {s.gpu_type for s in cluster.servers}
    chosen = name or ("gavel" if types <= GAVEL_TYPES else "paper")
    sigma = server_sigma if variation else 0.0
    world: World
    if chosen == "gavel":
        path = throughputs or str(default_throughputs())
        if not os.path.isfile(path):
            raise SimInputError(f"--throughputs: no such file {path!r}")
        try:
            world = gavel_world(path, seed=seed, per_server_sigma=sigma, spread_slowdown=variation)
        except (OSError, ValueError) as exc:
            raise SimInputError(f"--throughputs: cannot read {path!r}: {exc}") from exc
    elif chosen == "paper":
        world = paper_world(seed=seed, per_server_sigma=sigma)
    else:
        raise SimInputError(f"--world: unknown world {name!r} (known: gavel, paper)")
    for server in cluster.servers:
        try:
            world.calibration(server)
        except ValueError as exc:
            raise SimInputError(
                f"--cluster: server {server.id!r} (gpu_type {server.gpu_type!r}, host_model "
                f"{server.host_model!r}) is unknown to the {world.name} world: {exc}"
            ) from exc
    return world


@dataclass(frozen=True, slots=True)
class RunSpec:
    cluster: ClusterConfig
    world: World
    workload: list[WorkloadJob]
    policies: tuple[str, ...]
    seed: int = 0
    round_seconds: float | None = None
    gavel_compat: bool = False
    charge_solver: bool = False


def load_workload(
    world: World,
    workload: str | None,
    trace: str | None,
    fmt: str | None,
    seed: int,
    limit: int | None = None,
) -> list[WorkloadJob]:
    if (workload is None) == (trace is None):
        raise SimInputError("give exactly one of --workload SPEC and --trace FILE")
    if limit is not None and limit <= 0:
        raise SimInputError(f"--limit: must be a positive integer, got {limit}")
    if trace is not None:
        if not os.path.isfile(trace):
            raise SimInputError(f"--trace: no such file {trace!r}")
        if fmt is None:
            raise SimInputError("--format is required with --trace (gavel, philly or tiresias)")
        kw: dict[str, Any] = {}
        if fmt in ("philly",) and limit is not None:
            kw["limit"] = limit
        if fmt in ("philly", "tiresias"):
            kw["rng_seed"] = seed
        jobs = read_trace(trace, fmt, world, **kw)
    else:
        assert workload is not None
        try:
            jobs = workload_from_spec(workload, world, seed)
        except ValueError as exc:
            raise SimInputError(f"--workload: {exc}") from exc
    if limit is not None:
        jobs = jobs[:limit]
    return jobs


def run_policy(spec: RunSpec, name: str, progress: Callable[[float], None] | None = None) -> SimResult:
    settings = spec.cluster.scheduler
    if spec.round_seconds is not None:
        settings = replace(settings, round_seconds=spec.round_seconds)
    policy = make_policy(name, settings)
    if spec.round_seconds is not None:
        policy.round_seconds = spec.round_seconds
    estimator: Estimator | None = None
    servers: Sequence[Server] = spec.cluster.servers
    if spec.gavel_compat:
        sim_servers = {
            s.id: Server(s.id, s.gpu_type, s.gpus, spec.world.calibration(s), s.host_model, s.order)
            for s in servers
        }
        estimator = OracleEstimator(
            spec.world, sim_servers, {w.job_id: job_key(w.job_id) for w in spec.workload}
        )
    options = SimOptions(
        seed=spec.seed,
        profiling=not spec.gavel_compat,
        restart_costs=not spec.gavel_compat,
        charge_solver=spec.charge_solver,
    )
    sim = Simulation(
        spec.world,
        servers,
        spec.workload,
        policy,
        options,
        time.perf_counter,
        estimator,
        spec.cluster.tenant_map(),
    )
    return sim.run(progress)


def summarise(result: SimResult, wall_s: float) -> dict[str, Any]:
    s = metrics.summary(result.jobs, result.rounds)
    seen = [x.ape for x in result.estimator if x.seen]
    unseen = [x.ape for x in result.estimator if not x.seen]
    every = [x.ape for x in result.estimator]
    return {
        "description": result.description,
        "jobs": s["jobs"],
        "completed": s["completed"],
        "avg_jct_h": s["avg_jct_h"],
        "p50_jct_h": s["p50_jct_h"],
        "p90_jct_h": s["p90_jct_h"],
        "p99_jct_h": s["p99_jct_h"],
        "makespan_h": s["makespan_h"],
        "avg_wait_h": s["avg_wait_h"],
        "max_lr": s["max_lr"],
        "mean_lr": s["mean_lr"],
        "max_ftf": s["max_ftf"],
        "frags_per_round": s["frags_per_round"],
        "frags_per_waiting_round": s["frags_per_waiting_round"],
        "placeable_idle_per_round": s["placeable_idle_per_round"],
        "utilisation": result.busy_gpu_s / (result.total_gpus * result.span_s) if result.span_s > 0 else None,
        "solver_p95_s": s["solver_p95_s"],
        "estimator_mape": metrics.mean(every),
        "estimator_mape_seen": metrics.mean(seen),
        "estimator_mape_unseen": metrics.mean(unseen),
        "estimator_mape_over_time": error_over_time(result),
        "preemptions": result.preemptions,
        "migrations": result.migrations,
        "reserved_jobs": result.reserved_jobs,
        "backfills": len(result.backfills),
        "backfills_late": sum(1 for b in result.backfills if b.late),
        "wall_s": wall_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


COLUMNS = (
    ("policy", "{}", 10),
    ("makespan_h", "{:.2f}", 9),
    ("avg_jct_h", "{:.2f}", 9),
    ("p99_jct_h", "{:.2f}", 9),
    ("avg_wait_h", "{:.2f}", 10),
    ("max_lr", "{:.2f}", 7),
    ("mean_lr", "{:.2f}", 7),
    ("max_ftf", "{:.2f}", 7),
    ("frags_per_round", "{:.2f}", 8),
    ("utilisation", "{:.2f}", 6),
    ("solver_p95_s", "{:.3f}", 9),
    ("estimator_mape", "{:.3f}", 8),
    ("wall_s", "{:.1f}", 7),
)


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The summary table; every column as wide as its name, so no header is cut."""
    columns = [(name, fmt, max(w, len(name))) for name, fmt, w in COLUMNS]
    head = " ".join(f"{name:>{w}}" for name, _, w in columns)
    lines = [head, "-" * len(head)]
    for policy, row in rows.items():
        cells = []
        for name, fmt, w in columns:
            value = policy if name == "policy" else row.get(name)
            cells.append(f"{'-' if value is None else fmt.format(value):>{w}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def write_outputs(
    out: Path, spec: RunSpec, rows: dict[str, dict[str, Any]], results: dict[str, SimResult]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "cluster": spec.cluster.name if spec.cluster.source == "--cluster" else spec.cluster.source,
        "gpus": spec.cluster.total_gpus,
        "world": spec.world.name,
        "server_sigma": getattr(spec.world, "sigma", None),
        "jobs": len(spec.workload),
        "seed": spec.seed,
        "gavel_compat": spec.gavel_compat,
        "policies": rows,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_jobs_csv(out / "jobs.csv", results)
    from hopsmgr.sim.plots import draw_all

    draw_all(out, results)


JOB_COLUMNS = (
    "policy",
    "job",
    "tenant",
    "gpus",
    "arrival_s",
    "first_start_s",
    "end_s",
    "wait_s",
    "jct_s",
    "latency_ratio",
    "gpu_types",
    "preemptions",
    "moves",
    "completed",
)


def write_jobs_csv(path: Path, results: dict[str, SimResult]) -> None:
    """One row per job and policy: requirement set, times, wait, JCT, latency ratio (wait / expected run
    time), the GPU types it ran on, preemptions and moves. Lists are space-separated."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(JOB_COLUMNS)
        for name, result in results.items():
            outcomes = {o.job_id: o for o in result.per_job}
            for r in result.jobs:
                o = outcomes.get(r.job_id)
                jct = r.end_time - r.submit_time if r.end_time is not None else None
                ratio = r.waited_s / r.expected_run_s if r.expected_run_s > 0 else None
                writer.writerow(
                    [
                        name,
                        r.job_id,
                        r.tenant,
                        " ".join(map(str, o.gpus)) if o else r.gpus_min,
                        _num(r.submit_time),
                        _num(r.first_start),
                        _num(r.end_time),
                        _num(r.waited_s),
                        _num(jct),
                        _num(ratio),
                        " ".join(o.gpu_types) if o else "",
                        o.preemptions if o else "",
                        o.moves if o else "",
                        int(r.completed),
                    ]
                )


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def check_out(out: Path | None) -> None:
    if out is not None and out.exists() and not out.is_dir():
        raise SimInputError(f"--out: {str(out)!r} exists and is not a directory")


def prepare_out(out: Path | None) -> None:
    """Create --out once every other input is checked, and refuse it if the results could not be
    written there, before any policy runs."""
    if out is None:
        return
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimInputError(f"--out: cannot create {str(out)!r}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SimInputError(f"--out: {str(out)!r} is not writable")


def check_policies(names: Sequence[str]) -> tuple[str, ...]:
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise SimInputError(f"--policies: unknown {bad or names!r} (known: {', '.join(POLICY_NAMES)})")
    return tuple(names)


def settings_for(cluster: ClusterConfig) -> SchedulerSettings:
    return cluster.scheduler
