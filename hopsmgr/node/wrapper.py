"""`python -m hopsmgr.node.wrapper <command>`: the on-node job wrapper the master runs (locally or SSH).

Commands: launch, checkpoint, stop, status, logs, forget. Each prints one JSON object on stdout and
exits 0; on error it prints {"error": "..."} and exits 1 (failure), 2 (bad arguments), 3 (stale epoch),
4 (unknown attempt) or 5 (conflict: forget of a running attempt). The same operations are importable
from `hopsmgr.node` (see `hopsmgr.node.ops`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hopsmgr.node.layout import BadRequest, WrapperError, validate_id
from hopsmgr.node.monitor import run_monitor
from hopsmgr.node.ops import (
    DEFAULT_CHECKPOINT_GRACE_S,
    DEFAULT_STOP_GRACE_S,
    DEFAULT_TAIL,
    MODES,
    checkpoint,
    forget,
    launch,
    logs,
    status,
    stop,
)

__all__ = ["build_parser", "checkpoint", "forget", "launch", "logs", "main", "status", "stop"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become BadRequest (so they print as JSON with exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise BadRequest(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m hopsmgr.node.wrapper", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str, *, epoch: bool = False, attempt: bool = True) -> _Parser:
        p: _Parser = sub.add_parser(name, help=help_text)
        p.add_argument("--workdir", required=True, type=Path)
        if attempt:
            p.add_argument("--attempt", required=True)
        if epoch:
            p.add_argument("--epoch", required=True, type=int)
        return p

    p = command("launch", "start a job attempt: launch ... -- ARGV...", epoch=True)
    p.add_argument("--job", required=True)
    p.add_argument("--mode", choices=MODES, default="run")
    p.add_argument("--gpus", type=int)
    p.add_argument("--visible-devices")
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--cwd", type=Path)
    p.add_argument("--env", action="extend", nargs="+", default=[], metavar="K=V")
    p.add_argument("--profile-iters", type=int, default=20)
    p.add_argument("--emulated-speed", type=float)
    p.add_argument("--run-as", metavar="ACCOUNT", help="run the job as this Unix account (isolated)")
    p.add_argument("--mem-mb", type=int, help="memory limit of the attempt's cgroup (MiB; with --run-as)")
    p.add_argument("--cpus", type=float, help="CPU limit of the attempt's cgroup (with --run-as)")
    p.add_argument(
        "--sigusr1-unblocked",
        action="store_true",
        help="start the job without SIGUSR1 blocked (its own handler)",
    )

    p = command("checkpoint", "ask an attempt to checkpoint and exit", epoch=True)
    p.add_argument("--wait", type=float)
    p.add_argument("--grace", type=float, default=DEFAULT_CHECKPOINT_GRACE_S)
    p.add_argument("--signal", default="SIGUSR1", help="the checkpoint signal (default SIGUSR1)")

    p = command("stop", "terminate an attempt (SIGTERM, then SIGKILL after --grace)", epoch=True)
    p.add_argument("--grace", type=float, default=DEFAULT_STOP_GRACE_S)

    p = command("status", "state of one or all attempts", attempt=False)
    p.add_argument("--attempt")

    p = command("logs", "the tail of an attempt's log")
    p.add_argument("--tail", type=int, default=DEFAULT_TAIL)

    command("forget", "remove an exited attempt's directory")
    command("_monitor", argparse.SUPPRESS)
    return parser


def _env_pairs(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadRequest(f"env {pair!r} must be KEY=VALUE")
        env[key] = value
    return env


def _dispatch(args: list[str]) -> dict[str, Any] | None:
    child_argv: list[str] = []
    if args[:1] == ["launch"]:
        if "--" not in args:
            raise BadRequest("argv missing: launch needs '-- ARGV...' after its options")
        cut = args.index("--")
        args, child_argv = args[:cut], args[cut + 1 :]
    ns = build_parser().parse_args(args)
    if ns.command == "launch":
        return launch(
            ns.workdir,
            ns.attempt,
            ns.job,
            ns.epoch,
            child_argv,
            mode=ns.mode,
            gpus=ns.gpus,
            visible_devices=ns.visible_devices,
            checkpoint_dir=ns.checkpoint_dir,
            cwd=ns.cwd,
            env=_env_pairs(ns.env),
            profile_iters=ns.profile_iters,
            emulated_speed=ns.emulated_speed,
            run_as=ns.run_as,
            mem_mb=ns.mem_mb,
            cpus=ns.cpus,
            block_sigusr1=not ns.sigusr1_unblocked,
        )
    if ns.command == "checkpoint":
        return checkpoint(
            ns.workdir, ns.attempt, ns.epoch, wait=ns.wait, grace=ns.grace, signal_name=ns.signal
        )
    if ns.command == "stop":
        return stop(ns.workdir, ns.attempt, ns.epoch, grace=ns.grace)
    if ns.command == "status":
        return status(ns.workdir, ns.attempt)
    if ns.command == "logs":
        return logs(ns.workdir, ns.attempt, ns.tail)
    if ns.command == "forget":
        return forget(ns.workdir, ns.attempt)
    # _monitor: internal, detaches itself and prints nothing
    run_monitor(Path(ns.workdir).absolute(), validate_id("attempt", ns.attempt))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; prints its JSON result and returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = _dispatch(args)
    except WrapperError as exc:
        result, code = {"error": str(exc)}, exc.exit_code
    except OSError as exc:
        result, code = {"error": str(exc)}, 1
    else:
        code = 0
    if result is not None:
        print(json.dumps(result, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
