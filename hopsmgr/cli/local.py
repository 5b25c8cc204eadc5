"""`hopsmgr demo`, `hopsmgr up` and `hopsmgr down`: the product on this machine.

`demo` runs the live demo (hopsmgr.local.demo); `demo --simulate` the simulated comparison of the
paper's 64-GPU cluster instead. `up --config FILE` starts a master and emulated-device agents for your
own cluster file in the background (state and logs in --dir) and prints how to reach it; `down` stops
everything `up` started, jobs included. Run as root with `[[users]]` that name Unix accounts, `up` runs
each job as its user (`run_as_users`, docs/security.md) unless the file says `run_as_users = false`;
otherwise it is single-user: every job runs as whoever ran `up`.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

from hopsmgr.config import ClusterConfig, ConfigError, load_cluster_config
from hopsmgr.local.cluster import LocalCluster, LocalClusterError, read_run, stop_recorded

DEFAULT_DIR = Path(".hopsmgr")


def cmd_demo(args: argparse.Namespace, simulate: Callable[[argparse.Namespace], int]) -> int:
    if args.simulate:
        return simulate(args)
    from hopsmgr.local.demo import run_demo

    if args.jobs < 2:
        print(f"hopsmgr demo: error: --jobs must be at least 2, got {args.jobs}", file=sys.stderr)
        return 2
    if not args.minutes > 0:
        print(f"hopsmgr demo: error: --minutes must be > 0, got {args.minutes}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="hopsmgr-demo-"))
    try:
        metrics = run_demo(out, jobs=args.jobs, minutes=args.minutes, quick=args.quick, ssh=not args.local)
    except KeyboardInterrupt:
        print("\nhopsmgr demo: interrupted; everything it started was stopped", file=sys.stderr)
        return 130
    except LocalClusterError as exc:
        print(f"hopsmgr demo: error: {exc}", file=sys.stderr)
        return 1
    return 0 if metrics["completed"] == metrics["jobs"] else 1


def cmd_up(args: argparse.Namespace) -> int:
    try:
        config = load_cluster_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = args.dir.resolve()
    running = read_run(root)
    if running is not None:
        print(
            f"error: a local cluster already runs from {root} (master {running.get('url')}); `hopsmgr down --dir {args.dir}` first",
            file=sys.stderr,
        )
        return 1
    if config.master.run_as_users and os.geteuid() != 0:
        print(
            "error: master.run_as_users = true: only root can run each job as its user (hopsmgr.node.runas); "
            "run `hopsmgr up` as root, or leave run_as_users out (single-user: every job runs as "
            f"{getpass.getuser()})",
            file=sys.stderr,
        )
        return 2
    config_path = Path(args.config).resolve()
    if os.geteuid() == 0 and not config.master.run_as_users and _run_as_by_default(config_path, config):
        config_path, config = _with_run_as(config_path, root)
    if config.master.run_as_users:
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # the jobs' accounts pass through to their own directories
    cluster = LocalCluster(config_path, config, root)
    try:
        url = cluster.start()
    except LocalClusterError as exc:
        stop_recorded(root)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    mode = (
        "jobs run as their users (run_as_users, docs/security.md)"
        if config.master.run_as_users
        else f"single-user: every job runs as {getpass.getuser()}"
    )
    print(
        f"local cluster {config.name!r} up: master {url}, {len(config.servers)} emulated-device agents, "
        f"{mode}, logs in {root}"
    )
    print(f"export HOPSMGR_URL={url} HOPSMGR_TOKEN=$(cat {cluster.state_dir / 'admin.token'})")
    return 0


def _run_as_by_default(path: Path, config: ClusterConfig) -> bool:
    """As root, with users that have Unix accounts and no `run_as_users` in the file: run jobs as them."""
    if not any(u.unix_user for u in config.users):
        return False
    master = tomllib.loads(path.read_text()).get("master", {})
    return isinstance(master, dict) and "run_as_users" not in master


def _with_run_as(path: Path, root: Path) -> tuple[Path, ClusterConfig]:
    """A copy of the cluster file in `root` with `run_as_users = true` (and node-local checkpoints,
    unless the file says where they go: the default shared root is inside the master's state)."""
    text = path.read_text()
    master = tomllib.loads(text).get("master", {})
    lines = ["run_as_users = true"]
    if "checkpoint_shared" not in master and "checkpoint_root" not in master:
        lines.append("checkpoint_shared = false")
    if re.search(r"^\[master\]\s*$", text, re.MULTILINE):
        text = re.sub(r"^\[master\]\s*$", "[master]\n" + "\n".join(lines), text, count=1, flags=re.MULTILINE)
    else:
        text += "\n[master]\n" + "\n".join(lines) + "\n"
    root.mkdir(parents=True, exist_ok=True)
    copy = root / f"{path.stem}.run-as.toml"
    copy.write_text(text)
    return copy, load_cluster_config(copy)


def cmd_down(args: argparse.Namespace) -> int:
    root = args.dir.resolve()
    if read_run(root) is None:
        print(f"no local cluster runs from {root}", file=sys.stderr)
        return 1
    stopped = stop_recorded(root)
    print(f"stopped {stopped} processes started from {root}")
    return 0


def register(
    sub: Any, simulate_demo: Callable[[argparse.Namespace], int], positive: Callable[[str], float]
) -> None:
    demo = sub.add_parser(
        "demo", help="run the whole product on this machine: a live local cluster and real jobs"
    )
    demo.add_argument("--quick", action="store_true", help="fewer, shorter jobs (about a minute)")
    demo.add_argument("--jobs", type=int, default=9, help="jobs to submit (default 9)")
    demo.add_argument(
        "--minutes", type=positive, default=4.0, help="rough length of the workload (default 4)"
    )
    demo.add_argument("--out", type=Path, help="where to write summary.json, timeline.png and the logs")
    demo.add_argument(
        "--local", action="store_true", help="use the local executor even where sshd is installed"
    )
    demo.add_argument(
        "--simulate",
        action="store_true",
        help="instead: simulate the paper's 64-GPU cluster (Hops vs baselines)",
    )
    demo.add_argument("--rate", type=positive, default=40.0, help="with --simulate: arrivals per hour")
    demo.add_argument("--seed", type=int, default=1, help="with --simulate: workload seed")
    demo.set_defaults(func=lambda a: cmd_demo(a, simulate_demo))

    up = sub.add_parser("up", help="start a local cluster (master + emulated agents) for a cluster file")
    up.add_argument("--config", required=True, help="cluster TOML file")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state and logs (default ./.hopsmgr)")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop the local cluster `hopsmgr up` started, and its jobs")
    down.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="as given to `hopsmgr up`")
    down.set_defaults(func=cmd_down)
