"""Plain-text rendering of the master's API answers: aligned tables and `key: value` blocks.

Every function takes the decoded JSON of one answer (docs/api.md) and returns the text to print, without
a trailing newline. Missing or null values print as "-"; unknown extra keys are ignored by the tables.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hopsmgr.cli.text import (
    DASH,
    duration,
    gpus,
    key_values,
    number,
    percent,
    placement,
    table,
    timestamp,
    value_text,
    yes_no,
)

ACTIVE_STATES = ("PENDING", "PROFILING", "QUEUED", "LAUNCHING", "RUNNING", "CHECKPOINTING")
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED")


def _queue_key(job: Mapping[str, Any]) -> tuple[int, float, float]:
    position = job.get("position")
    submitted = job.get("submitted") or 0.0
    if position is None:
        return (1, 0.0, float(submitted))
    return (0, float(position), float(submitted))


def forecast_span(
    forecast: Mapping[str, Any] | None, what: str, quantiles: Sequence[str] = ("p50", "p90")
) -> str:
    """A forecast's `what` ("start" or "finish") quantiles as waits from when it was made: "5m/12m"."""
    if not forecast:
        return DASH
    made = float(forecast.get("made") or 0.0)
    known = forecast.get(f"{what}_p50") is not None
    beyond = _beyond(forecast, made)
    # a P90 left open beside a P50 (past the horizon, or one the calibration cannot bound) is "open";
    # a quantile no future reached within its horizon is ">14d"
    values = [(forecast.get(f"{what}_{q}"), q) for q in quantiles]
    return "/".join(
        ("open" if q == "p90" and known else beyond) if v is None else duration(max(0.0, float(v) - made))
        for v, q in values
    )


def _beyond(forecast: Mapping[str, Any], since: float) -> str:
    """A quantile past every future's horizon: ">14d" (from `since`), or "-" where none is given."""
    horizon = forecast.get("horizon")
    return DASH if horizon is None else f">{duration(max(0.0, float(horizon) - since))}"


def queue_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    """The queue: jobs with a queue position first (1 = next), then the others oldest first."""
    headers = (
        "POS", "ID", "NAME", "USER", "TENANT", "STATE", "GPUS", "PLACEMENT", "LR", "EST.WAIT", "START.P50/P90",
        "PROGRESS",
    )  # fmt: skip
    rows = [_queue_row(job) for job in sorted(jobs, key=_queue_key)]
    return table(headers, rows)


WAITING = frozenset({"PENDING", "PROFILING", "QUEUED"})


def _queue_row(job: Mapping[str, Any]) -> tuple[str, ...]:
    # a job that no longer waits keeps the forecast made while it waited until the next one (an older
    # master sends its start quantiles): shown for waiting jobs only
    forecast = job.get("forecast") if job.get("state") in WAITING else None
    has_start = (forecast or {}).get("start_p50") is not None
    return (
        number(job.get("position")),
        str(job.get("id", DASH)),
        str(job.get("name") or DASH),
        str(job.get("user") or DASH),
        str(job.get("tenant") or DASH),
        str(job.get("state", DASH)),
        gpus(job.get("gpus")),
        placement(job.get("placement")),
        number(job.get("latency_ratio"), 2),
        # the rough estimate from the recent average latency ratio, for a job the forecasts have not
        # reached yet (beside a start forecast it only contradicted it)
        duration(None if has_start else job.get("est_wait_s")),
        forecast_span(forecast, "start"),
        percent(job.get("progress")),
    )


def job_detail(job: Mapping[str, Any]) -> str:
    """`show`: the summary, the history (oldest first) and the attempts."""
    command = job.get("command")
    total, done = job.get("total_samples"), job.get("done_samples")
    env = job.get("env") or {}
    attempts = job.get("attempts")
    # The detail's `attempts` is the list of attempts; the plain summary's is their count.
    count = len(attempts) if isinstance(attempts, list) else attempts
    pairs = [
        ("id", str(job.get("id", DASH))),
        ("name", str(job.get("name") or DASH)),
        ("tenant", str(job.get("tenant") or DASH)),
        ("user", str(job.get("user") or DASH)),
        ("state", str(job.get("state", DASH))),
        ("reason", str(job.get("reason") or DASH)),
        ("gpus", gpus(job.get("gpus"))),
        ("placement", placement(job.get("placement"))),
        ("submitted", timestamp(job.get("submitted"))),
        ("position", number(job.get("position"))),
        ("priority", number(job.get("priority"), 2)),
        ("latency ratio", number(job.get("latency_ratio"), 2)),
        ("est. wait", duration(job.get("est_wait_s"))),
        ("progress", percent(job.get("progress"))),
        ("samples", f"{value_text(done)} of {value_text(total)}"),
        ("batch size", number(job.get("batch_size"))),
        ("attempts", f"{number(count)} ({number(job.get('restarts'))} restarts)"),
        ("command", shlex.join(command) if isinstance(command, list) else DASH),
        ("workdir", str(job.get("workdir") or DASH)),
        ("launcher", str(job.get("launcher") or DASH) + (", one server" if job.get("one_server") else "")),
        ("env", " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) or DASH),
    ]
    parts = [key_values(pairs)]
    history = job.get("history") or []
    parts.append("\nhistory:")
    if history:
        events = [
            (
                timestamp(h.get("time")),
                str(h.get("kind") or DASH),
                str(h.get("state") or DASH),
                str(h.get("message") or ""),
            )
            for h in history
        ]
        parts.append(table(("TIME", "KIND", "STATE", "MESSAGE"), events, indent="  "))
    else:
        parts.append("  (none)")
    parts.append("\nattempts:")
    if isinstance(attempts, list) and attempts:
        rows = [
            (
                str(a.get("id", DASH)),
                placement(a.get("placement")),
                yes_no(a.get("profiling")),
                timestamp(a.get("started")),
                timestamp(a.get("ended")),
                str(a.get("end_reason") or DASH),
                number(a.get("exit_code")),
            )
            for a in attempts
        ]
        headers = ("ID", "PLACEMENT", "PROFILING", "STARTED", "ENDED", "END REASON", "EXIT")
        parts.append(table(headers, rows, indent="  "))
    else:
        parts.append("  (none)")
    measured = job.get("throughput") or []
    if measured:  # samples/s per placement: measured, and what the estimator expected
        parts.append("\nthroughput (samples/s):")
        measured_rows = [
            (
                placement(t.get("placement")),
                number(t.get("measured_last"), 1),
                number(t.get("measured_mean"), 1),
                number(t.get("measurements")),
                number(t.get("expected_last"), 1),
                number(t.get("estimate_now"), 1),
            )
            for t in measured
        ]
        columns = ("PLACEMENT", "LAST", "MEAN", "MEASUREMENTS", "EXPECTED THEN", "ESTIMATE NOW")
        parts.append(table(columns, measured_rows, indent="  "))
    return "\n".join(parts)


def _forecast_line(forecast: Mapping[str, Any] | None, what: str, *, aged: bool = False) -> str:
    """`aged`: say how long ago the forecast was made (its waits count from then, and a live job's
    forecast is renewed only while some job waits)."""
    if not forecast:
        return DASH
    made = forecast.get("made")
    now = time.time()
    if forecast.get(f"{what}_p50") is None and forecast.get(f"{what}_p90") is None:
        if forecast.get("horizon") is None or not forecast.get("futures"):
            return DASH
        since = now if aged else float(made or now)
        shown = {**forecast, "made": now} if aged else forecast
        return f"not within {_beyond(forecast, since)[1:]} ({_within(shown, what)})"
    if aged:  # waits from now, not from when it was made (a round's forecast reads as current)
        forecast = {**forecast, "made": now}
    p10, p50, p90 = (forecast_span(forecast, what, (q,)) for q in ("p10", "p50", "p90"))
    age = f", made {duration(max(0.0, now - float(made)))} ago" if aged and made else ""
    passed = forecast.get(f"{what}_p50")
    late = f"; its P50 passed {duration(now - float(passed))} ago" if aged and passed and passed < now else ""
    return f"in {p50} (P10 {p10}, P90 {p90}; {number(forecast.get('futures'))} sampled futures{age}{late})"


def _within(forecast: Mapping[str, Any], what: str) -> str:
    """How many of the sampled futures reached the job's start (or end) within their horizon."""
    futures = int(forecast.get("futures") or 0)
    share = forecast.get("start_within") if what == "start" else None
    if share is None:
        return f"in none of {futures} sampled futures, or too few of them, within their horizon"
    sooner = round(float(share) * futures)
    if not sooner:
        return f"in none of {futures} sampled futures within their horizon"
    early = forecast_span(forecast, what, ("p10",)) if forecast.get(f"{what}_p10") is not None else None
    return f"{futures - sooner} of {futures} sampled futures; the other {sooner} started it sooner" + (
        f", P10 {early}" if early else ""
    )


def _what_if_lines(what_if: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not what_if:
        return []
    gpus = ",".join(str(g) for g in what_if.get("gpus") or [])
    forecast = what_if.get("forecast")
    if not forecast:
        return [(f"with {gpus} GPUs", str(what_if.get("note") or DASH))]
    return [
        (f"with {gpus} GPUs: start", _forecast_line(forecast, "start")),
        (f"with {gpus} GPUs: end", _forecast_line(forecast, "finish")),
    ]


def dry_run_text(doc: Mapping[str, Any]) -> str:
    """`submit --dry-run`: the job as the master would take it, and its forecast; nothing submitted."""
    gpus = ",".join(str(g) for g in doc.get("gpus") or [])
    forecast = doc.get("forecast")
    pairs = [
        ("tenant", str(doc.get("tenant", DASH))),
        ("user", str(doc.get("user", DASH))),
        ("gpus", gpus or DASH),
        ("forecast start", _forecast_line(forecast, "start")),
        ("forecast end", _forecast_line(forecast, "finish")),
    ]
    if doc.get("note"):
        pairs.append(("note", str(doc["note"])))
    return "\n".join(
        ["dry run: the master would accept this job (nothing was submitted)", key_values(pairs, indent="  ")]
    )


def explain_text(doc: Mapping[str, Any]) -> str:
    """`explain`: why a job waits or runs where it does."""
    window = doc.get("window")
    in_window = doc.get("in_window")
    membership = DASH if in_window is None else ("in the service window" if in_window else "outside it")
    if window is not None:  # the window counts the running jobs it holds too, the position does not
        membership += f" (the window holds {value_text(window)} jobs, running ones included)"
    quota = doc.get("quota") or {}
    quota_line = DASH
    if quota:
        quota_line = (
            f"tenant {quota.get('tenant', DASH)}: uses {number(quota.get('used_gpus'))} GPUs, "
            f"guaranteed {number(quota.get('guaranteed_gpus'))}, cap {number(quota.get('cap_gpus'))}, "
            f"borrowed {number(quota.get('borrowed_gpus'))}"
        )
        used = quota.get("used_gpus_by_type") or {}
        for field, word in (("guaranteed_gpus_by_type", "guaranteed"), ("cap_gpus_by_type", "cap")):
            limits = quota.get(field) or {}
            if limits:  # [ours] per GPU type: what the tenant holds of each against its limit
                quota_line += f"; {word} per type " + ", ".join(
                    f"{t} {number(used.get(t, 0))}/{number(limits[t])}" for t in sorted(limits)
                )
    last = doc.get("round") or {}
    round_line = DASH
    if last:
        proven = last.get("proven")
        proof = "" if proven is None else (", proven optimal" if proven else ", not proven optimal")
        round_line = (
            f"{timestamp(last.get('time'))} ({last.get('kind', DASH)}, {last.get('method', DASH)}{proof})"
        )
    forecast = doc.get("forecast")
    pairs = [
        ("state", str(doc.get("state", DASH))),
        ("queue position", number(doc.get("position"))),
        ("priority", number(doc.get("priority"), 2)),
        ("latency ratio", number(doc.get("latency_ratio"), 2)),
        ("window", membership),
        ("sensitivity", number(doc.get("sensitivity"), 2)),
        ("may span", yes_no(doc.get("may_span"))),
        ("quota", quota_line),
        ("placement", value_text(doc.get("placement"))),
        ("planner note", value_text(doc.get("note"))),
        ("unplaceable", value_text(doc.get("unplaceable"))),
        ("profiled on", ", ".join(doc.get("profiled_types") or []) or DASH),
        ("no runtime", value_text(doc.get("without_runtime"))),
        ("waits for", ", ".join(doc.get("waits_for") or []) or DASH),
        # (a job that no longer waits has no start to forecast)
        (
            "forecast start",
            _forecast_line(
                None if doc.get("state") not in (*WAITING, None) else forecast, "start", aged=True
            ),
        ),
        ("forecast end", _forecast_line(forecast, "finish", aged=True)),
        *_what_if_lines(doc.get("what_if")),
        ("last round", round_line),
    ]
    parts = [f"job {doc.get('id', DASH)}", key_values(pairs, indent="  ")]
    candidates = doc.get("candidates") or []
    chosen = doc.get("chosen")
    # the plan's figures, as of its round: the estimates learn between rounds
    parts.append("  candidates (as the last round weighed them):")
    if candidates:
        rows = [
            (
                "*" if chosen is not None and c.get("config") == chosen else "",
                value_text(c.get("config")),
                number(c.get("rate"), 2),
                number(c.get("value"), 3),
            )
            for c in candidates
        ]
        parts.append(table(("", "CONFIG", "RATE", "VALUE"), rows, indent="    "))
    else:
        parts.append("    (none)")
    return "\n".join(parts)


def calibration(value: Mapping[str, Any] | None) -> str:
    if not value or value.get("compute_factor") is None:
        return DASH
    text = number(value.get("compute_factor"), 2)
    return f"{text} ({value['source']})" if value.get("source") else text


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    headers = ("ID", "TYPE", "GPUS", "FREE", "HEALTH", "DRAINED", "EMULATED", "CALIBRATION", "RUNNING")
    rows = []
    for node in nodes:
        running = list(dict.fromkeys(str(r.get("job")) for r in node.get("running") or []))
        rows.append(
            (
                str(node.get("id", DASH)),
                str(node.get("gpu_type") or DASH),
                number(node.get("gpus")),
                number(node.get("free_gpus")),
                str(node.get("health") or DASH),
                yes_no(node.get("drained")),
                yes_no(node.get("emulated")),
                calibration(node.get("calibration")),
                ",".join(running) or DASH,
            )
        )
    out = table(headers, rows)
    reasons = [
        f"{n.get('id')}: {n['drain_reason']}" for n in nodes if n.get("drained") and n.get("drain_reason")
    ]
    if reasons:
        out += "\n\ndrained:\n" + "\n".join(f"  {r}" for r in reasons)
    errors = [f"{n.get('id')}: {n['command_error']}" for n in nodes if n.get("command_error")]
    if errors:  # a node the master could not reach takes no new work for a while
        out += "\n\ncommand errors:\n" + "\n".join(f"  {e}" for e in errors)
    return out


def tenants_table(tenants: Sequence[Mapping[str, Any]]) -> str:
    headers = (
        "TENANT",
        "GUARANTEED",
        "CAP",
        "WEIGHT",
        "USED",
        "BORROWED",
        "QUEUED",
        "RUNNING",
        "USE(REF-GPU-H)",
        "SHARE",
        "FACTOR",
    )
    rows = [
        (
            str(t.get("name", DASH)),
            number(t.get("guaranteed_gpus")),
            number(t.get("cap_gpus")),
            value_text(t.get("weight")),
            number(t.get("used_gpus")),
            number(t.get("borrowed_gpus")),
            number(t.get("queued")),
            number(t.get("running")),
            number(t.get("usage_ref_gpu_h"), 2),
            number(t.get("usage_share"), 2),
            number(t.get("fairshare_factor"), 2),
        )
        for t in tenants
    ]
    out = table(headers, rows)
    for field, title in (("guaranteed_gpus_by_type", "guarantee"), ("cap_gpus_by_type", "cap")):
        limited = [t for t in tenants if t.get(field)]
        if limited:  # [ours] per GPU type: what each guarantees or allows and what the tenant holds of it
            lines = ["", "", f"{title}s per GPU type (used / {title}):"]
            for t in limited:
                used, limit = t.get("used_gpus_by_type") or {}, t[field]
                parts = ", ".join(f"{k} {number(used.get(k, 0))} / {number(limit[k])}" for k in sorted(limit))
                lines.append(f"  {t.get('name', DASH)}: {parts}")
            out += "\n".join(lines)
    return out


def usage_history_text(tenants: Sequence[Mapping[str, Any]]) -> str:
    """`quota --history`: each tenant's decayed use over time, one `time  ref-GPU-h` line a sample."""
    lines: list[str] = []
    for t in tenants:
        lines.append(f"{t.get('name', DASH)}:")
        samples = t.get("usage_history") or []
        if not samples:
            lines.append("  (no samples yet)")
        for sample in samples:
            lines.append(f"  {timestamp(sample.get('time'))}  {number(sample.get('ref_gpu_h'), 2)} ref-GPU-h")
    return "\n".join(lines)


CLUSTER_KEYS = ("gpus", "gpus_by_type", "used_gpus", "idle_gpus", "pending", "queued", "running", "nodes")


def cluster_text(doc: Mapping[str, Any]) -> str:
    """`cluster`: one `key: value` line per field, the last round spelled out, unknown keys at the end."""
    pairs = [(key, value_text(doc.get(key))) for key in CLUSTER_KEYS]
    pairs.append(("raqlr", number(doc.get("raqlr"), 2)))
    pairs.append(("epoch", value_text(doc.get("epoch"))))
    last = doc.get("last_round")
    if isinstance(last, Mapping) and last:
        rest = {k: v for k, v in last.items() if k != "time"}
        when = timestamp(last.get("time")) if "time" in last else ""
        pairs.append(("last_round", " ".join(p for p in (when, value_text(rest) if rest else "") if p)))
    else:
        pairs.append(("last_round", DASH))
    known = {*CLUSTER_KEYS, "raqlr", "epoch", "last_round"}
    pairs.extend((k, value_text(v)) for k, v in doc.items() if k not in known)
    return key_values(pairs)


def status_text(doc: dict[str, Any]) -> str:
    """`hopsmgr status`: one line per master, then who leads."""
    lines = []
    leader = None
    for m in doc.get("masters") or []:
        if m.get("status") != "ok":
            lines.append(f"{m.get('url')}  unreachable: {m.get('error', '')}")
            continue
        lines.append(f"{m.get('url')}  {m.get('role')}  epoch {m.get('epoch')}")
        if m.get("leader"):
            leader = leader if leader and leader.get("first_plan") else m["leader"]
    if leader:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(leader["since"])))
        lines.append(f"leader: {leader['url']} since {since} (epoch {leader['epoch']})")
    else:
        lines.append("leader: none known")
    return "\n".join(lines)
