"""The `hopsmgr` command line.

`simulate` (trace-driven simulation of policies on a cluster) and `demo` (a short simulation of the
paper's 64-GPU cluster, embedded in the package), plus the clients of a running master's REST API
(submit, queue, show, cancel, logs, explain, nodes, drain, undrain, quota, cluster, token), registered
by `hopsmgr.cli.wiring.register`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from hopsmgr.cli import daemon, local, scripts, wiring
from hopsmgr.config import ConfigError
from hopsmgr.core.model import ModelError
from hopsmgr.policies.registry import POLICY_NAMES
from hopsmgr.sim import runner
from hopsmgr.sim.traces import TraceError


class _Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty()
        self.start = time.monotonic()

    def __call__(self, fraction: float) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * min(max(fraction, 0.0), 1.0))
        elapsed = time.monotonic() - self.start
        sys.stderr.write(
            f"\r{self.label:>10} [{'#' * filled}{'.' * (width - filled)}] {fraction:4.0%} {elapsed:5.0f}s"
        )
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _run_simulation(spec: runner.RunSpec, out: Path | None, quiet: bool = False) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    results = {}
    for name in spec.policies:
        bar = _Progress(name)
        t0 = time.perf_counter()
        result = runner.run_policy(spec, name, bar)
        bar.done()
        rows[name] = runner.summarise(result, time.perf_counter() - t0)
        results[name] = result
        if not quiet:
            print(f"  {name}: {rows[name]['description']} ({rows[name]['wall_s']:.1f} s)", file=sys.stderr)
    print(runner.table(rows))
    if out is not None:
        runner.write_outputs(out, spec, rows, results)
        print(f"\nwrote {out / 'results.json'} and plots in {out}/")
    return rows


def cmd_simulate(args: argparse.Namespace) -> int:
    runner.check_out(args.out)
    cluster = runner.parse_cluster(args.cluster)
    world = runner.make_world(
        args.world,
        cluster,
        args.seed,
        args.throughputs,
        variation=not args.gavel_compat,
        server_sigma=args.server_sigma,
    )
    workload = runner.load_workload(world, args.workload, args.trace, args.format, args.seed, args.limit)
    if not workload:
        raise runner.SimInputError("the workload has no jobs")
    policies = runner.check_policies([p.strip() for p in args.policies.split(",") if p.strip()])
    spec = runner.RunSpec(
        cluster=cluster,
        world=world,
        workload=workload,
        policies=policies,
        seed=args.seed,
        round_seconds=args.round_seconds,
        gavel_compat=args.gavel_compat,
        charge_solver=args.charge_solver,
    )
    print(
        f"{len(workload)} jobs on {cluster.total_gpus} GPUs ({len(cluster.servers)} servers), world={world.name}"
        f"{', gavel-compat' if args.gavel_compat else ''}, seed={args.seed}",
        file=sys.stderr,
    )
    runner.prepare_out(args.out)
    _run_simulation(spec, args.out)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    runner.check_out(args.out)
    path = resources.files("hopsmgr") / "data" / "paper-64.toml"
    with resources.as_file(path) as cluster_path:
        cluster = runner.parse_cluster(str(cluster_path))
    world = runner.make_world("paper", cluster, args.seed, None)
    workload = runner.load_workload(
        world, f"poisson:jobs={args.jobs},rate={args.rate}", None, None, args.seed
    )
    print(
        "hopsmgr demo: a simulation of the paper's 64-GPU cluster (GTX1080Ti, TitanXp, RTX3090 servers)\n"
        f"with {len(workload)} jobs arriving at {args.rate}/h: Hops against the Sia-like and Gavel-like\n"
        "baselines on the same workload.\n",
        file=sys.stderr,
    )
    spec = runner.RunSpec(cluster, world, workload, ("hops", "sia-lr", "gavel-lr"), seed=args.seed)
    runner.prepare_out(args.out)
    _run_simulation(spec, args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hopsmgr", description="hopsmgr: Hops scheduling for GPU clusters")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="simulate policies on a cluster and workload")
    sim.add_argument("--cluster", required=True, help="TOML file or TYPE=SERVERSxGPUS[,...] (e.g. v100=2x4)")
    sim.add_argument(
        "--workload",
        help="poisson:jobs=N,rate=R (R jobs per hour) or gang:jobs=N,rate=R[,big_every=K,big=16|32]",
    )
    sim.add_argument("--trace", help="trace file (with --format)")
    sim.add_argument("--format", choices=["gavel", "philly", "tiresias"])
    sim.add_argument("--limit", type=int, help="use only the first N jobs of the workload (N > 0)")
    sim.add_argument(
        "--policies", default="hops,sia,gavel,fifo", help=f"comma list of {', '.join(POLICY_NAMES)}"
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--world", choices=["gavel", "paper"], help="ground truth (default: from the GPU types)")
    sim.add_argument("--throughputs", help="Gavel-format measured throughputs (gavel world)")
    sim.add_argument("--round-seconds", type=_positive_float, help="round length for every policy")
    sim.add_argument(
        "--gavel-compat",
        action="store_true",
        help="Gavel's simulator assumptions: known throughputs, no per-server variation, "
        "no profiling or restart cost",
    )
    sim.add_argument(
        "--server-sigma",
        type=float,
        default=runner.DEFAULT_SERVER_SIGMA,
        help="spread of each server's hidden speed factors in the ground truth (default "
        f"{runner.DEFAULT_SERVER_SIGMA}; 0: every server of one kind alike; --gavel-compat makes it 0)",
    )
    sim.add_argument("--charge-solver", action="store_true", help="charge measured solver time to launches")
    sim.add_argument("--out", type=Path, help="write results.json and PNG plots here")
    sim.set_defaults(func=cmd_simulate)

    local.register(sub, cmd_demo, _positive_float)

    wiring.register(sub)
    daemon.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args = scripts.with_script_directives(parser, list(sys.argv[1:] if argv is None else argv), args)
    except scripts.UsageError as exc:
        print(f"hopsmgr submit: error: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except (runner.SimInputError, ConfigError, TraceError, ModelError) as exc:
        print(f"hopsmgr: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"hopsmgr: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
