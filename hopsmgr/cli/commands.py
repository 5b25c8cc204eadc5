"""The `hopsmgr` commands that talk to a running master (submit, queue, show, cancel, logs, explain,
nodes, drain, undrain, quota, cluster, token create), each a thin client of the REST API (docs/api.md).

`hopsmgr.cli.wiring.register(subparsers)` adds them to the CLI's parser, with their options (their
argument types: hopsmgr.cli.argtypes). Every command takes `--url`, `--token`,
`--client-config` and `--json` (print the API's JSON instead of a table). Exit status: 0 ok, 1 the
master refused the request or could not be reached ("error: <field>: <message>" on stderr), 2 bad
command-line input (nothing is sent).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from hopsmgr.cli import render
from hopsmgr.cli.argtypes import (
    GpusArg,
)
from hopsmgr.cli.arrays import array_bodies
from hopsmgr.cli.client import ApiClient, ApiError, MasterUnreachable
from hopsmgr.cli.scripts import (
    UsageError,
    script_command,
)
from hopsmgr.core.model import ModelError, RequirementSet
from hopsmgr.protocol import Submission, WireError, parse_submission

API = "/api/v1"
DEFAULT_RNUM = 4
FOLLOW_INTERVAL_S = 1.0

Command = Callable[[argparse.Namespace, ApiClient], int]


# ----------------------------------------------------------------------------- argument


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
