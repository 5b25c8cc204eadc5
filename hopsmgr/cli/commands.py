"""The `hopsmgr` commands that talk to a running master (submit, queue, show, cancel, logs, explain,
nodes, drain, undrain, quota, cluster, token create), each a thin client of the REST API (docs/api.md).

`register(subparsers)` adds them to the CLI's parser. Every command takes `--url`, `--token`,
`--client-config` and `--json` (print the API's JSON instead of a table). Exit status: 0 ok, 1 the
master refused the request or could not be reached ("error: <field>: <message>" on stderr), 2 bad
command-line input (nothing is sent).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopsmgr.cli import render, users
from hopsmgr.cli.arrays import array_bodies, parse_array
from hopsmgr.cli.client import ApiClient, ApiError, ClientConfigError, MasterUnreachable, resolve_connection
from hopsmgr.cli.scripts import (
    UsageError,
    job_ids,
    parse_duration,
    script_command,
)
from hopsmgr.core.lifecycle import JobState
from hopsmgr.core.model import ModelError, RequirementSet
from hopsmgr.protocol import CHECKPOINT_SIGNALS, Submission, WireError, parse_submission

API = "/api/v1"
DEFAULT_RNUM = 4
FOLLOW_INTERVAL_S = 1.0
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
GPUS_FORMS = "N, N,N,... or LOW-HIGH"

Command = Callable[[argparse.Namespace, ApiClient], int]


# ----------------------------------------------------------------------------- argument types


@dataclass(frozen=True)
class GpusArg:
    """A parsed `--gpus`: explicit counts, or a range LOW-HIGH expanded later with `--rnum`."""

    text: str
    counts: tuple[int, ...] = ()
    span: tuple[int, int] | None = None


def parse_gpus(text: str) -> GpusArg:
    """`--gpus`: "4" or "1,2,4" -> the counts; "2-8" -> the range (2, 8)."""
    value = text.strip()
    if re.fullmatch(r"\d+-\d+", value):
        low, high = (int(x) for x in value.split("-"))
        if low <= 0:
            raise argparse.ArgumentTypeError(f"a GPU count must be a positive integer, got {text!r}")
        if high < low:
            raise argparse.ArgumentTypeError(f"range LOW-HIGH needs LOW <= HIGH, got {text!r}")
        return GpusArg(text, span=(low, high))
    items = value.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"empty GPU count in {text!r} (expected {GPUS_FORMS})")
    counts: list[int] = []
    for item in items:
        if not item.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected {GPUS_FORMS} with positive integers, got {text!r}")
        count = int(item)
        if count <= 0:
            raise argparse.ArgumentTypeError(f"every GPU count must be a positive integer, got {text!r}")
        counts.append(count)
    return GpusArg(text, counts=tuple(sorted(set(counts))))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_number(text: str) -> int | float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _work_amount(text: str) -> int | float:
    """--iters and --samples: a number of at least 1 (a job of no work is a mistake, not a job)."""
    value = _positive_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return value


_MEM_UNITS = {"M": 1, "G": 1024, "T": 1024 * 1024}


def parse_mem(text: str) -> int:
    """A memory size as MiB: 512M, 8G, 1T (a bare number is MiB)."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([MGT]?)i?B?", text.strip(), re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size like 512M, 8G or 1T, got {text!r}")
    mib = float(match.group(1)) * _MEM_UNITS[match.group(2).upper() or "M"]
    if not 1 <= mib <= 1 << 30:
        raise argparse.ArgumentTypeError(f"must be between 1M and 1024T, got {text!r}")
    return int(mib)


def _nonnegative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if not ENV_KEY.match(key):
        raise argparse.ArgumentTypeError(f"KEY must match [A-Za-z_][A-Za-z0-9_]*, got {text!r}")
    return key, value


def _absolute_dir(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"expected an absolute path on the node, got {text!r}")
    return text


def _state(text: str) -> str:
    value = text.strip().upper()
    if value not in JobState.__members__:
        known = ", ".join(JobState.__members__)
        raise argparse.ArgumentTypeError(f"unknown state {text!r} (known: {known})")
    return value


# ----------------------------------------------------------------------------- helpers


def _job_path(job: str, suffix: str = "") -> str:
    return f"{API}/jobs/{urllib.parse.quote(job, safe='')}{suffix}"


def _node_path(node: str, suffix: str = "") -> str:
    return f"{API}/nodes/{urllib.parse.quote(node, safe='')}{suffix}"


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2))


def _emit(args: argparse.Namespace, doc: Any, text: Callable[[Any], str]) -> int:
    if args.json:
        _print_json(doc)
    else:
        print(text(doc))
    return 0


# ----------------------------------------------------------------------------- commands


def submit_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /jobs body from parsed `submit` arguments; raises UsageError on bad combinations."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError(
            "argument command: missing the command to run, give it after --, e.g. -- python train.py"
        )
    if args.gpus is None:
        raise UsageError("argument --gpus: required (on the command line or in a #HOPS line of the script)")
    spec: GpusArg = args.gpus
    if spec.span is None:
        if args.rnum is not None:
            raise UsageError(
                f"argument --rnum: applies only to a range --gpus LOW-HIGH, got --gpus {spec.text} --rnum {args.rnum}"
            )
        counts = list(spec.counts)
    else:
        try:
            counts = list(RequirementSet.span(*spec.span, args.rnum or DEFAULT_RNUM).counts)
        except ModelError as exc:
            raise UsageError(f"argument --gpus: {exc} (got {spec.text!r})") from None
    if args.no_runtime:
        for given_flag, value in (
            ("--batch-size", args.batch_size),
            ("--iters", args.iters),
            ("--samples", args.samples),
        ):
            if value is not None:
                raise UsageError(
                    f"argument {given_flag}: a --no-runtime job takes no {given_flag}: its work is its run time"
                    " (--time, else the cluster's scheduler.default_run_s)"
                )
    else:
        if args.batch_size is None:
            raise UsageError("argument --batch-size: required (unless --no-runtime)")
        if args.iters is None and args.samples is None:
            raise UsageError("one of the arguments --iters --samples is required (unless --no-runtime)")
        for given_flag, value in (("--checkpoint-signal", args.checkpoint_signal), ("--grace", args.grace)):
            if value is not None:
                raise UsageError(
                    f"argument {given_flag}: applies only with --no-runtime (the runtime checkpoints itself)"
                )
    if getattr(args, "array", None) and getattr(args, "dry_run", False):
        raise UsageError("argument --dry-run: forecasts one job; give it without --array")
    if args.grace is not None and args.checkpoint_signal is None:
        raise UsageError("argument --grace: needs --checkpoint-signal (the signal the grace period follows)")
    workdir = args.workdir
    if getattr(args, "directives", None) is not None:
        command = script_command(command)
        if workdir is None:
            workdir = os.getcwd()  # a script with #HOPS lines runs where it was submitted, as sbatch does
    given: dict[str, Any] = {
        key: value
        for key, value in (
            ("batch_size", args.batch_size),
            ("runtime", False if args.no_runtime else None),
            ("time_s", args.time),
            ("checkpoint_signal", args.checkpoint_signal),
            ("grace_s", args.grace),
            ("after", tuple(dict.fromkeys(j for group in args.after for j in group)) if args.after else None),
            ("iterations", args.iters),
            ("samples", args.samples if args.iters is None else None),
            ("name", args.name),
            ("tenant", args.tenant),
            ("params", args.params),
            ("workdir", workdir),
            ("launcher", args.launcher),
            ("one_server", True if args.one_server else None),
            ("mem_mb", args.mem),
            ("cpus", args.cpus),
            ("env", dict(args.env) if args.env else None),
        )
        if value is not None
    }
    if workdir is None and command and "/" in command[0] and not os.path.isabs(command[0]):
        print(
            f"warning: {command[0]!r} is a relative path and no --workdir is given: the job runs in its"
            ' attempt directory on the node, where it will not be found (give --workdir "$PWD" or an'
            " absolute path)",
            file=sys.stderr,
        )
    sub = Submission(command=tuple(command), gpus=tuple(counts), **given)
    body = sub.to_json()
    try:  # the master's own schema: refuse here what it would refuse, naming the field
        parse_submission(body)
    except WireError as exc:
        raise UsageError(f"{exc.field}: {exc.message}") from None
    return body


def cmd_submit(args: argparse.Namespace, client: ApiClient) -> int:
    if args.dry_run:  # checked as a submission, forecast as if submitted now, nothing stored
        return _emit(args, client.post(f"{API}/forecasts", submit_body(args)), render.dry_run_text)
    if args.array:  # one job per index, each id printed as soon as it is stored
        stored = []
        for body in array_bodies(submit_body(args), args.array):
            stored.append(client.post(f"{API}/jobs", body))
            if not args.json:
                print(stored[-1].get("id"), flush=True)
        if args.json:
            _print_json({"jobs": stored})
        return 0
    doc = client.post(f"{API}/jobs", submit_body(args))
    return _emit(args, doc, lambda d: str(d.get("id")))


def cmd_queue(args: argparse.Namespace, client: ApiClient) -> int:
    states: list[str] | None = None if args.all else (args.state or list(render.ACTIVE_STATES))
    doc = client.get(f"{API}/jobs", {"tenant": args.tenant, "user": args.user, "state": states})
    return _emit(args, doc, lambda d: render.queue_table(d.get("jobs") or []))


def cmd_show(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.get(_job_path(args.job)), render.job_detail)


def _cancelled_line(job: str, doc: Mapping[str, Any]) -> str:
    return f"{doc.get('id', job)}: {doc.get('state', '-')}"


def cmd_cancel(args: argparse.Namespace, client: ApiClient) -> int:
    """Cancel each job named, in order; one the master refuses is reported and the rest still go
    (exit 1 if any was refused). With --json: the answer for one job, a list of them for several."""
    jobs = list(dict.fromkeys(args.jobs))
    answers = []
    for job in jobs:
        try:
            doc = client.post(_job_path(job, "/cancel"))
        except MasterUnreachable:
            raise
        except ApiError as exc:
            print(f"error: {exc}" if job in str(exc) else f"error: {job}: {exc}", file=sys.stderr)
            continue
        answers.append(doc)
        if not args.json:
            print(_cancelled_line(job, doc))
    if args.json and answers:
        _print_json(answers[0] if len(jobs) == 1 else answers)
    return 0 if len(answers) == len(jobs) else 1


def cmd_explain(args: argparse.Namespace, client: ApiClient) -> int:
    doc = client.get(_job_path(args.job, "/explain"), {"gpus": args.gpus})
    return _emit(args, doc, render.explain_text)


def _gpu_counts(text: str) -> str:
    """`explain --gpus`: GPU counts separated by commas ("2,4"), each a positive integer."""
    items = [item.strip() for item in text.split(",")]
    if not items or any(not item.isdigit() or int(item) <= 0 for item in items):
        raise argparse.ArgumentTypeError(
            f"expected positive GPU counts separated by commas (2,4), got {text!r}"
        )
    return ",".join(items)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _tail(text: str, tail: int | None) -> str:
    if tail is None:
        return text
    data = text.encode("utf-8")
    return data[-tail:].decode("utf-8", "ignore") if len(data) > tail else text


def follow_logs(args: argparse.Namespace, client: ApiClient) -> int:
    """Poll every FOLLOW_INTERVAL_S, printing only new output, until the job ends (Ctrl-C exits 0).

    The API has no offset parameter, so each poll reads the latest attempt's whole log and prints what
    follows the part already shown; a new attempt starts over (announced on stderr).
    """
    shown_attempt: Any = None
    shown = 0
    first = True
    try:
        while True:
            state = client.get(_job_path(args.job)).get("state")
            try:
                doc = client.get(_job_path(args.job, "/logs"))
            except ApiError as exc:
                if exc.status != 404:
                    raise
                doc = {"id": args.job, "attempt": None, "log": ""}
            log = doc.get("log") or ""
            attempt = doc.get("attempt")
            if first:
                new = _tail(log, args.tail)
            elif attempt != shown_attempt or len(log) < shown:
                print(f"--- {args.job}: attempt {attempt} ---", file=sys.stderr)
                new = log
            else:
                new = log[shown:]
            first = False
            shown_attempt, shown = attempt, len(log)
            if new:
                if args.json:
                    print(json.dumps({"id": doc.get("id", args.job), "attempt": attempt, "log": new}))
                    sys.stdout.flush()
                else:
                    _write(new)
            if state in render.TERMINAL_STATES:
                return 0
            time.sleep(FOLLOW_INTERVAL_S)
    except KeyboardInterrupt:
        return 0


def cmd_logs(args: argparse.Namespace, client: ApiClient) -> int:
    if args.follow:
        return follow_logs(args, client)
    doc = client.get(_job_path(args.job, "/logs"), {"tail": args.tail})
    if args.json:
        _print_json(doc)
    else:
        _write(doc.get("log") or "")
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


def cmd_nodes(args: argparse.Namespace, client: ApiClient) -> int:
    if args.action is None:
        return _emit(args, client.get(f"{API}/nodes"), lambda d: render.nodes_table(d.get("nodes") or []))
    if args.action == "show":
        return _emit(args, client.get(_node_path(args.node, "")), lambda d: render.nodes_table([d]))
    doc = client.post(_node_path(args.node, "/calibrate"))
    return _emit(args, doc, lambda d: f"{d.get('id')}: calibration requested (runs at its next heartbeat)")


def _drain_text(doc: dict[str, Any]) -> str:
    reason = f" ({doc['drain_reason']})" if doc.get("drained") and doc.get("drain_reason") else ""
    return f"{doc.get('id')}: {'drained' if doc.get('drained') else 'not drained'}{reason}"


def cmd_drain(args: argparse.Namespace, client: ApiClient) -> int:
    body = {"reason": args.reason} if args.reason else {}
    return _emit(args, client.post(_node_path(args.node, "/drain"), body), _drain_text)


def cmd_undrain(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.post(_node_path(args.node, "/undrain")), _drain_text)


def cmd_quota(args: argparse.Namespace, client: ApiClient) -> int:
    def text(doc: dict[str, Any]) -> str:
        tenants = doc.get("tenants") or []
        out = render.tenants_table(tenants)
        return out + "\n\n" + render.usage_history_text(tenants) if args.history else out

    return _emit(args, client.get(f"{API}/tenants"), text)


def cmd_cluster(args: argparse.Namespace, client: ApiClient) -> int:
    return _emit(args, client.get(f"{API}/cluster"), render.cluster_text)


def cmd_status(args: argparse.Namespace, client: ApiClient) -> int:
    """Every configured master's /healthz: its role, and who leads since when with which epoch."""
    masters = []
    for url in client.urls:
        one = ApiClient(url, None, timeout=min(client.timeout, 5.0))
        try:
            masters.append({"url": url, **one.get("/healthz")})
        except ApiError as exc:
            masters.append({"url": url, "status": "unreachable", "error": exc.message})
    doc = {"masters": masters}
    _emit(args, doc, render.status_text)
    return 0 if any(m.get("role") == "leader" for m in masters) else 1


def cmd_token_create(args: argparse.Namespace, client: ApiClient) -> int:
    body = {"user": args.user, "admin": args.admin}
    if args.tenant is not None:
        body["tenant"] = args.tenant
    return _emit(args, client.post(f"{API}/tokens", body), lambda d: str(d.get("token")))


# ----------------------------------------------------------------------------- wiring


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
        type=_positive_int,
        metavar="N",
        help=f"how many counts a range --gpus LOW-HIGH expands to, at equal steps (default {DEFAULT_RNUM})",
    )
    submit.add_argument(
        "--batch-size",
        type=_positive_int,
        metavar="B",
        help="per-GPU batch size: an iteration on G GPUs processes B x G samples (B x R1 at the smallest "
        "count R1, the unit of --iters)",
    )
    work = submit.add_mutually_exclusive_group()
    work.add_argument("--iters", type=_work_amount, metavar="N", help="iterations at the smallest GPU count")
    work.add_argument("--samples", type=_work_amount, metavar="N", help="total samples of work")
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
        type=_nonnegative_number,
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
    submit.add_argument("--params", type=_positive_number, metavar="P", help="model parameters (e.g. 25e6)")
    submit.add_argument(
        "--workdir", type=_absolute_dir, metavar="DIR", help="absolute working directory on the node"
    )
    submit.add_argument(
        "--env",
        type=_env_pair,
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
        "--cpus", type=_positive_number, metavar="N", help="CPU limit of each attempt on a node (e.g. 4, 0.5)"
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
        type=_state,
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
        type=_gpu_counts,
        metavar="COUNTS",
        help="also forecast the waiting job had it asked for these GPU counts (2,4)",
    )

    logs = _add(subparsers, "logs", cmd_logs, "the output of a job's latest attempt", common)
    logs.add_argument("job", help="job id")
    logs.add_argument("--tail", type=_positive_int, metavar="BYTES", help="only the last BYTES bytes")
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
