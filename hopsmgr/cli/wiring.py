"""The argparse wiring of the commands that talk to a running master (hopsmgr.cli.commands): their
options, the connection options every one of them takes, and `run_command`, which resolves the
connection, runs a command and maps its failures to exit statuses (1: the master refused or could not
be reached; 2: bad command-line input, nothing sent)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hopsmgr.cli import users
from hopsmgr.cli.argtypes import (
    absolute_dir,
    env_pair,
    gpu_counts,
    job_state,
    nonnegative_number,
    parse_gpus,
    parse_mem,
    positive_int,
    positive_number,
    work_amount,
)
from hopsmgr.cli.arrays import parse_array
from hopsmgr.cli.client import ApiClient, ApiError, ClientConfigError, resolve_connection
from hopsmgr.cli.commands import (
    DEFAULT_RNUM,
    Command,
    cmd_cancel,
    cmd_cluster,
    cmd_drain,
    cmd_explain,
    cmd_logs,
    cmd_nodes,
    cmd_queue,
    cmd_quota,
    cmd_show,
    cmd_status,
    cmd_submit,
    cmd_token_create,
    cmd_undrain,
    submit_body,
)
from hopsmgr.cli.scripts import UsageError, job_ids, parse_duration
from hopsmgr.protocol import CHECKPOINT_SIGNALS


def run_command(args: argparse.Namespace) -> int:
    """Resolve the connection, run the command, and map failures to exit statuses 1 and 2."""
    parser: argparse.ArgumentParser = args.api_parser
    try:
        if args.api_check is not None:
            args.api_check(args)  # local validation before anything else, so nothing is sent
        conn = resolve_connection(args.url, args.token, args.client_config, ca=args.ca)
        return args.api_func(args, ApiClient(conn.url, conn.token, context=conn.ssl_context()))
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except ClientConfigError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _nodes_entry(args: argparse.Namespace) -> int:
    if args.action == "add":
        from hopsmgr.cli.nodekeys import add_node_key

        return add_node_key(args)
    return run_command(args)


def _check_nodes(args: argparse.Namespace) -> None:
    if args.action is not None and not args.node:
        raise UsageError(f"nodes {args.action}: a node id is required")
    if args.action is None and args.node:
        raise UsageError(f"nodes: unexpected argument {args.node!r} (use `nodes show NODE`)")


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "--url", help="the master's URL (else $HOPSMGR_URL, client.toml, http://127.0.0.1:8470)"
    )
    group.add_argument("--token", help="API token (else $HOPSMGR_TOKEN, client.toml token or token_file)")
    group.add_argument(
        "--client-config",
        metavar="FILE",
        help="client TOML with url and token or token_file (default ~/.config/hopsmgr/client.toml)",
    )
    group.add_argument(
        "--ca",
        metavar="FILE",
        help="CA certificate to verify an https:// master with (else $HOPSMGR_CA, client.toml ca_file, "
        "the system's trust store)",
    )
    group.add_argument("--json", action="store_true", help="print the API's JSON answer")
    return common


def _add(
    sub: Any,
    name: str,
    func: Command,
    help_text: str,
    common: argparse.ArgumentParser,
    check: Callable[[argparse.Namespace], object] | None = None,
    **kw: Any,
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, parents=[common], **kw)
    parser.set_defaults(func=run_command, api_func=func, api_parser=parser, api_check=check)
    return parser


def register(subparsers: Any) -> None:
    """Add the master's commands to the `hopsmgr` parser's subparsers."""
    common = _common_options()

    submit = _add(
        subparsers,
        "submit",
        cmd_submit,
        "submit a job; prints its id",
        common,
        check=submit_body,
        usage="%(prog)s --gpus SPEC (--batch-size B (--iters N | --samples N) | --no-runtime) [options]"
        " (-- CMD [ARGS ...] | SCRIPT [ARGS ...])",
        description="Submit a job. The command after -- runs as an argv list (never through a shell). "
        "A script given as the command may hold options in '#HOPS ...' lines at its head (after the #! line, "
        "before the first line that is not a comment); options on the command line win.",
    )
    submit.add_argument(
        "--gpus",
        type=parse_gpus,
        metavar="SPEC",
        help="GPU counts the job accepts: 4, or a list 1,2,4, or a range 2-8 expanded to --rnum counts",
    )
    submit.add_argument(
        "--rnum",
        type=positive_int,
        metavar="N",
        help=f"how many counts a range --gpus LOW-HIGH expands to, at equal steps (default {DEFAULT_RNUM})",
    )
    submit.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="B",
        help="per-GPU batch size: an iteration on G GPUs processes B x G samples (B x R1 at the smallest "
        "count R1, the unit of --iters)",
    )
    work = submit.add_mutually_exclusive_group()
    work.add_argument("--iters", type=work_amount, metavar="N", help="iterations at the smallest GPU count")
    work.add_argument("--samples", type=work_amount, metavar="N", help="total samples of work")
    submit.add_argument(
        "--no-runtime",
        action="store_true",
        help="the command does not use hopsmgr.runtime: no profiling run, placed from the servers' "
        "calibration; never preempted unless --checkpoint-signal",
    )
    submit.add_argument(
        "--time",
        type=parse_duration,
        metavar="DURATION",
        help="time limit (2h, 30m, 1-12:00, ...): the job fails past it; with --no-runtime also its "
        "expected run time (default: the cluster's scheduler.default_run_s)",
    )
    submit.add_argument(
        "--checkpoint-signal",
        choices=list(CHECKPOINT_SIGNALS),
        help="with --no-runtime: the signal on which the script saves its own checkpoint and exits; "
        "the job may then be preempted",
    )
    submit.add_argument(
        "--grace",
        type=nonnegative_number,
        metavar="SECONDS",
        help="with --checkpoint-signal: how long the script may take to exit before SIGTERM",
    )
    submit.add_argument(
        "--after",
        type=job_ids,
        action="append",
        metavar="JOB[,JOB...]",
        help="start only once these jobs completed (repeatable); one that fails or is cancelled cancels this job",
    )
    submit.add_argument("--tenant", help="tenant (default: the token's)")
    submit.add_argument("--name", help="label (default: the command's basename)")
    submit.add_argument("--params", type=positive_number, metavar="P", help="model parameters (e.g. 25e6)")
    submit.add_argument(
        "--workdir", type=absolute_dir, metavar="DIR", help="absolute working directory on the node"
    )
    submit.add_argument(
        "--env",
        type=env_pair,
        action="append",
        metavar="KEY=VALUE",
        help="environment variable (repeatable)",
    )
    submit.add_argument(
        "--launcher",
        choices=["plain", "torchrun"],
        help="plain (default): the command runs as given, once per server of the placement; torchrun: "
        "one torchrun per server",
    )
    submit.add_argument(
        "--one-server",
        action="store_true",
        help="place every attempt on one server (a script that runs as one process and cannot meet "
        "peers on other servers; with the plain launcher a placement over two servers would run it twice)",
    )
    submit.add_argument(
        "--mem", type=parse_mem, metavar="SIZE", help="memory limit of each attempt on a node: 512M, 8G, 1T"
    )
    submit.add_argument(
        "--cpus", type=positive_number, metavar="N", help="CPU limit of each attempt on a node (e.g. 4, 0.5)"
    )
    submit.add_argument(
        "--array",
        type=parse_array,
        metavar="INDICES",
        help="a job per index (0-9, 1,3,5, 0-15:4), named NAME[INDEX], with HOPS_ARRAY_INDEX set",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="check the job and forecast its start and end as if submitted now; nothing is submitted",
    )
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")

    queue = _add(subparsers, "queue", cmd_queue, "list jobs in queue order", common)
    queue.add_argument("--tenant", help="only this tenant's jobs")
    queue.add_argument("--user", help="only this user's jobs")
    which = queue.add_mutually_exclusive_group()
    which.add_argument(
        "--state",
        type=job_state,
        action="append",
        help="only jobs in this state (repeatable; default: all but COMPLETED, FAILED, CANCELLED)",
    )
    which.add_argument("--all", action="store_true", help="jobs in every state, finished ones too")

    _add(subparsers, "show", cmd_show, "a job's details, history and attempts", common).add_argument(
        "job", help="job id, e.g. j-000001"
    )
    _add(subparsers, "cancel", cmd_cancel, "cancel jobs (a running attempt is stopped)", common).add_argument(
        "jobs", nargs="+", metavar="job", help="job ids, e.g. j-000001 j-000002"
    )
    explain = _add(subparsers, "explain", cmd_explain, "why a job waits, or runs where it does", common)
    explain.add_argument("job", help="job id, e.g. j-000001")
    explain.add_argument(
        "--gpus",
        type=gpu_counts,
        metavar="COUNTS",
        help="also forecast the waiting job had it asked for these GPU counts (2,4)",
    )

    logs = _add(subparsers, "logs", cmd_logs, "the output of a job's latest attempt", common)
    logs.add_argument("job", help="job id")
    logs.add_argument("--tail", type=positive_int, metavar="BYTES", help="only the last BYTES bytes")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new output until the job ends"
    )

    nodes = _add(
        subparsers,
        "nodes",
        cmd_nodes,
        "list the nodes; `nodes show NODE`, `nodes calibrate NODE`, `nodes add NODE` (admin: trust its SSH host key)",
        common,
        check=_check_nodes,
    )
    nodes.add_argument("action", nargs="?", choices=["show", "calibrate", "add"], help="act on one node")
    nodes.add_argument("node", nargs="?", help="node id (with show, calibrate or add)")
    nodes.add_argument("--config", help="with add: the cluster TOML file (the node's address and SSH port)")
    nodes.add_argument(
        "--state-dir", type=Path, help="with add: the master's state directory (its known_hosts)"
    )
    nodes.add_argument("--fingerprint", help="with add: trust the key only if it has this SHA256 fingerprint")
    nodes.set_defaults(func=_nodes_entry)
    drain = _add(subparsers, "drain", cmd_drain, "stop placing jobs on a node (admin)", common)
    drain.add_argument("node", help="node id")
    drain.add_argument("--reason", help="why (shown by `nodes`, e.g. 'GPU 2 ECC errors')")
    undrain = _add(subparsers, "undrain", cmd_undrain, "place jobs on a drained node again (admin)", common)
    undrain.add_argument("node", help="node id")
    quota = _add(subparsers, "quota", cmd_quota, "tenants' guarantees, caps, use and fair share", common)
    quota.add_argument("--history", action="store_true", help="also each tenant's decayed use over time")
    _add(subparsers, "cluster", cmd_cluster, "cluster summary", common)
    _add(subparsers, "status", cmd_status, "which master leads, since when, with which epoch", common)

    token = subparsers.add_parser("token", help="API tokens: create (admin), list, revoke")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = _add(token_sub, "create", cmd_token_create, "create a token; prints it (shown once)", common)
    create.add_argument("--user", required=True, help="the user the token speaks for")
    create.add_argument("--tenant", help="the user's tenant (needed only to add a new user)")
    create.add_argument("--admin", action="store_true", help="an admin token (the user's role is admin)")
    users.register(subparsers, token_sub, lambda sub, name, func, text: _add(sub, name, func, text, common))
