"""The main part of each dashboard page, rendered from the API's answers (hopsmgr.master.dashboard.data).

Each function takes the page's data, the viewer, the session's CSRF secret (None for a script using
`Authorization: Bearer`: no forms then) and the time now, and returns escaped HTML.
"""

from __future__ import annotations

from typing import Any

from hopsmgr.master.access import Principal
from hopsmgr.master.dashboard.history import History
from hopsmgr.master.dashboard.render import (
    WAITING,
    action,
    badge,
    clock,
    duration,
    e,
    num,
    sparkline,
    state_badge,
    table,
    tenant_classes,
)

Data = dict[str, Any]


def _job_link(job_id: str) -> str:
    return f'<a href="/ui/jobs/{e(job_id)}">{e(job_id)}</a>'


def _legend(classes: dict[str, str]) -> str:
    items = "".join(f'<li><span class="swatch {c}"></span>{e(t)}</li>' for t, c in classes.items())
    return (
        f'<ul class="legend">{items}<li><span class="swatch other"></span>another tenant</li>'
        '<li><span class="swatch prof"></span>profiling</li><li><span class="swatch free"></span>free</li></ul>'
    )


def cluster(data: Data, who: Principal, csrf: str | None, now: float) -> str:
    jobs: dict[str, Any] = data["jobs"]
    classes = tenant_classes([t["name"] for t in data["tenants"]] + [j["tenant"] for j in jobs.values()])
    c = data["cluster"]
    summary = (
        f'<p class="summary"><b>{c["used_gpus"]}</b> of <b>{c["gpus"]}</b> GPUs in use · '
        f"{c['running']} running · {c['queued']} queued · {c['pending']} pending · "
        f"RAQLR {num(c['raqlr'])}</p>"
    )
    cards = []
    for node in data["nodes"]:
        cells = []
        for run in node["running"]:
            job = jobs.get(run["job"])
            if run["profiling"]:
                cls, label = "prof", "profiling" + (f" {run['job']}" if job else "")
            elif job is not None:
                cls, label = classes.get(job["tenant"], "other"), f"{run['job']} ({job['tenant']})"
            else:
                cls, label = "other", "another tenant's job"
            for _ in range(run["gpus"]):
                inner = _job_link(run["job"]) if job is not None else ""
                cells.append(f'<li class="gpu {cls}" title="{e(label)}">{inner}</li>')
        used = sum(r["gpus"] for r in node["running"])
        cells += ['<li class="gpu free" title="free"></li>'] * max(0, node["gpus"] - used)
        badges = [badge(node["health"], f"h-{node['health'].lower()}")]
        if node["drained"]:
            badges.append(badge("drained", "drained"))
        if node["emulated"]:
            badges.append(badge("emulated devices", "emulated"))
        if node["command_error"]:
            badges.append(badge("unreachable", "h-lost"))
        actions = ""
        if who.admin:
            verb = "undrain" if node["drained"] else "drain"
            actions = action(f"/ui/nodes/{node['id']}/{verb}", verb.capitalize(), csrf, "admin")
        beat = "never" if node["last_beat_s"] is None else f"{duration(node['last_beat_s'])} ago"
        cards.append(
            f'<article class="node" id="node-{e(node["id"])}" data-health="{e(node["health"])}">'
            f"<h3>{e(node['id'])} <small>{e(node['gpu_type'])} × {node['gpus']}</small></h3>"
            f'<p class="badges">{"".join(badges)}</p><ul class="gpus">{"".join(cells)}</ul>'
            f'<p class="meta">{node["free_gpus"]} free · last heartbeat {e(beat)}</p>{actions}</article>'
        )
    return f'<h1>Cluster</h1>{summary}{_legend(classes)}<section class="nodes">{"".join(cards)}</section>'


def _forecast_cells(job: Data, now: float) -> tuple[str, str]:
    f = job.get("forecast")
    if not f:
        return "–", "–"
    cells = []
    for what in ("start", "finish"):
        waits = what == "finish" or job.get("state") in WAITING  # else it has no start to forecast
        if waits and f[f"{what}_p50"] is None and f.get("horizon") is not None:  # most futures did not
            within = f.get("start_within") if what == "start" else None
            sooner = round(float(within) * f["futures"]) if within else 0
            note = f" <small>{sooner} of {f['futures']} futures sooner</small>" if sooner else ""
            cells.append(f"after {_until(f['horizon'], now)}{note}")
        else:
            cells.append(f"in {_until(f[f'{what}_p50'], now)} <small>P90 {_p90(f, what, now)}</small>")
    return cells[0], cells[1]


def _p90(f: Data, what: str, now: float) -> str:
    """A P90 the forecast leaves open beside a P50 it has ("open": past the horizon, or unbounded by
    the calibration), else as `_until`."""
    if f[f"{what}_p90"] is None and f[f"{what}_p50"] is not None:
        return "open"
    return _until(f[f"{what}_p90"], now)


def _until(at: float | None, now: float) -> str:
    """How long from `now` until `at`; "–" for a quantile the forecast has none of (None: no future
    started the job within its horizon; a P90 left open beside a P50 is `_p90`'s "open")."""
    return duration(None if at is None else at - now)


def queue(data: Data, who: Principal, csrf: str | None, now: float) -> str:
    rows = []
    for job in data["jobs"]:
        start, finish = _forecast_cells(job, now)
        rows.append(
            (
                e(job["position"] if job["position"] is not None else "–"),
                _job_link(job["id"]),
                e(job["name"]),
                e(job["tenant"]),
                state_badge(job["state"]),
                e(",".join(str(g) for g in job["gpus"])),
                num(job["latency_ratio"]),
                # the rough estimate only for a job the forecasts have not reached (beside a start
                # forecast it only contradicted it)
                duration(None if (job.get("forecast") or {}).get("start_p50") else job["est_wait_s"]),
                start,
                finish,
                e(data["reasons"].get(job["id"], "")),
            )
        )
    headers = (
        "Pos",
        "Job",
        "Name",
        "Tenant",
        "State",
        "GPUs",
        "LR",
        "Est. wait",
        "Start (P50)",
        "Finish (P50)",
        "Why it waits",
    )
    return f'<h1>Queue</h1><p class="summary">{len(rows)} waiting</p>{table(headers, rows, "queue")}'


def _timeline(job: Data, now: float) -> str:
    attempts = job["attempts"]
    t0 = job["submitted"]
    ends = [a["ended"] for a in attempts if a["ended"] is not None]
    t1 = (
        max([now, *ends])
        if job["state"] not in ("COMPLETED", "FAILED", "CANCELLED")
        else max([t0 + 1, *ends])
    )
    span = max(1e-6, t1 - t0)
    bars = []
    for i, a in enumerate(attempts):
        start = a["started"] if a["started"] is not None else t1
        end = a["ended"] if a["ended"] is not None else t1
        x = (start - t0) / span * 100
        w = max(0.5, (end - start) / span * 100)
        cls = "prof" if a["profiling"] else ("open" if a["ended"] is None else "run")
        where = ", ".join(f"{k}×{v}" for k, v in a["placement"].items())
        label = f"{a['id']} on {where}: {clock(a['started'])} – {clock(a['ended'])} {a['end_reason'] or 'running'}"
        bars.append(
            f'<rect class="{cls}" x="{x:.2f}" y="{i * 12 + 1}" width="{w:.2f}" height="10"><title>{e(label)}</title></rect>'
        )
    height = max(12, len(attempts) * 12 + 2)
    return (
        f'<svg class="timeline" viewBox="0 0 100 {height}" height="{height * 2}" preserveAspectRatio="none" role="img" '
        f'aria-label="attempts from {e(clock(t0))} to {e(clock(t1))}">{"".join(bars)}</svg>'
        f'<p class="meta">{e(clock(t0))} → {e(clock(t1))} ({duration(span)})</p>'
    )


def _throughput(job: Data, explained: Data) -> str:
    """The job detail's throughput per placement measured (API `throughput`: measured, what the
    estimator expected just before the latest measurement, what it estimates now), then the
    estimates of where it has not been measured: the placement it holds, each node at its smallest
    count."""
    rows = []
    shown = set()
    for t in job.get("throughput") or []:
        key = _placement_key(t["placement"])
        shown.add(key)
        rows.append(
            (
                e(key),
                num(t["measured_last"], 1),
                num(t["measured_mean"], 1),
                str(t["measurements"]),
                num(t["expected_last"], 1),
                num(t["estimate_now"], 1),
            )
        )
    held = _placement_key(job.get("placement") or {})
    estimate = explained.get("placement_estimate")
    if held and held not in shown and estimate is not None:
        rows.append((e(held), "–", "–", "0", "–", num(estimate, 1)))
        shown.add(held)
    least = min(job["gpus"])
    for node, rate in sorted((explained.get("estimates") or {}).items()):
        if f"{node}×{least}" not in shown:
            rows.append((e(f"{node}×{least}"), "–", "–", "0", "–", num(rate, 1)))
    headers = ("Placement", "Measured now", "Measured mean", "Measurements", "Expected then", "Estimated now")
    return table(headers, rows, "throughput")


def _placement_key(placement: dict[str, int]) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(placement.items()))


def job(data: Data, who: Principal, csrf: str | None, now: float) -> str:
    j = data["job"]
    live = j["state"] not in ("COMPLETED", "FAILED", "CANCELLED")
    cancel = action(f"/ui/jobs/{j['id']}/cancel", "Cancel job", csrf, "danger") if live else ""
    where = ", ".join(f"{k}×{v}" for k, v in (j["placement"] or {}).items()) or "–"
    start, finish = _forecast_cells(j, now)
    facts = (
        ("Tenant", e(j["tenant"])),
        ("User", e(j["user"])),
        ("GPUs", e(",".join(str(g) for g in j["gpus"]))),
        ("Placement", e(where)),
        ("Submitted", e(clock(j["submitted"]))),
        (
            "Progress",
            f'<meter min="0" max="1" value="{j["progress"]:.4f}"></meter> {j["progress"] * 100:.1f}%',
        ),
        ("Samples", f"{j['done_samples']:.0f} of {j['total_samples']:.0f}"),
        ("Queue position", e(j["position"] if j["position"] is not None else "–")),
        ("Latency ratio", num(j["latency_ratio"])),
        ("Forecast start", start),
        ("Forecast finish", finish),
        ("Restarts", str(j["counters"]["restarts"])),
        ("Preemptions", str(j["counters"]["preemptions"])),
        ("Reason", e(j["reason"] or "–")),
    )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    history = table(
        ("Time", "Event", "State", "Message"),
        (
            (e(clock(h["time"])), e(h["kind"]), e(h["state"] or ""), e(h["message"] or ""))
            for h in j["history"]
        ),
        "history",
    )
    attempts = table(
        ("Attempt", "Placement", "Kind", "Started", "Ended", "End", "Exit"),
        (
            (
                e(a["id"]),
                e(", ".join(f"{k}×{v}" for k, v in a["placement"].items())),
                "profiling" if a["profiling"] else "run",
                e(clock(a["started"])),
                e(clock(a["ended"])),
                e(a["end_reason"] or ("running" if a["ended"] is None else "")),
                e(a["exit_code"] if a["exit_code"] is not None else ""),
            )
            for a in j["attempts"]
        ),
        "attempts",
    )
    checkpoints = [
        (e(clock(h["time"])), e(h["kind"]), e(h["message"] or ""))
        for h in j["history"]
        if "checkpoint" in f"{h['kind']} {h['message'] or ''}"
    ]
    logs = data["logs"]
    return (
        f"<h1>{e(j['id'])} <small>{e(j['name'])}</small> {state_badge(j['state'])}</h1>{cancel}"
        f'<dl class="facts">{dl}</dl>'
        f"<h2>Attempts</h2>{_timeline(j, now)}{attempts}"
        f"<h2>Throughput (samples/s)</h2>{_throughput(j, data['explain'])}"
        f"<h2>Checkpoints</h2>{table(('Time', 'Event', 'Message'), checkpoints, 'checkpoints')}"
        f"<h2>State history</h2>{history}"
        f'<h2>Log <small>{e(logs["attempt"] or "no attempt yet")}</small></h2><pre id="log" class="log">{e(logs["log"])}</pre>'
    )


def tenants(data: Data, who: Principal, csrf: str | None, now: float, history: History) -> str:
    classes = tenant_classes(t["name"] for t in data["tenants"])
    rows = []
    charts = []
    for t in data["tenants"]:
        cap = t["cap_gpus"]
        rows.append(
            (
                f'<span class="swatch {classes[t["name"]]}"></span>{e(t["name"])}',
                str(t["guaranteed_gpus"]),
                "none" if cap is None else str(cap),
                num(t["weight"]),
                str(t["used_gpus"]),
                str(t["borrowed_gpus"]),
                str(t["queued"]),
                str(t["running"]),
                _per_type(t),
            )
        )
        charts.append(sparkline(history.series(t["name"]), f"{t['name']}: GPUs used"))
    headers = (
        "Tenant",
        "Guaranteed",
        "Cap",
        "Weight",
        "Used",
        "Borrowed",
        "Queued",
        "Running",
        "Per GPU type",
    )
    return f"<h1>Tenants</h1>{table(headers, rows, 'tenants')}<h2>Usage over time</h2>{''.join(charts)}"


def _per_type(t: Data) -> str:
    """[ours] A tenant's guarantees and caps per GPU type with what it holds of each: "v100 1 used,
    guaranteed 2, cap 4"; "–" without any."""
    owed, caps = t.get("guaranteed_gpus_by_type") or {}, t.get("cap_gpus_by_type") or {}
    used = t.get("used_gpus_by_type") or {}
    parts = []
    for gpu_type in sorted(set(owed) | set(caps)):
        text = f"{gpu_type} {used.get(gpu_type, 0)} used"
        text += f", guaranteed {owed[gpu_type]}" if gpu_type in owed else ""
        text += f", cap {caps[gpu_type]}" if gpu_type in caps else ""
        parts.append(e(text))
    return "; ".join(parts) or "–"


def scheduler(data: Data, who: Principal, csrf: str | None, now: float, history: History) -> str:
    c = data["cluster"]
    last = c["last_round"] or {}
    rounds: list[Data] = list(reversed(data["rounds"]))  # oldest first
    facts = (
        ("Rounds", str(data["rounds_total"])),
        ("Last round", e(clock(last.get("time")))),
        ("Method", e(last.get("method", "–"))),
        ("Proven", "–" if not last else ("yes" if last.get("proven") else "no")),
        ("Round time", "–" if not last else f"{last['duration_s'] * 1000:.0f} ms"),
        ("Solver time", "–" if not last else f"{last['solve_s'] * 1000:.0f} ms"),
        (
            "Fragments",
            "–"
            if not last
            else f"{last['idle_gpus'] if last.get('queued') else 0} idle GPUs while work waits",
        ),
        ("RAQLR", num(c["raqlr"])),
    )
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    charts = (
        sparkline([(r["time"], r["duration_s"] * 1000) for r in rounds], "round time (ms)")
        + sparkline([(r["time"], r["solve_s"] * 1000) for r in rounds], "solver time (ms)")
        + sparkline(history.raqlr(), "RAQLR")
    )
    rows = (
        (
            e(clock(r["time"])),
            e(r["kind"]),
            f"{r['duration_s'] * 1000:.0f}",
            f"{r['solve_s'] * 1000:.0f}",
            e(r["method"]),
            "yes" if r["proven"] else "no",
            str(r["launches"]),
            str(r["stops"]),
            str(r["queued"]),
            str(r["running"]),
            str(r["idle_gpus"] if r["queued"] else 0),
        )
        for r in data["rounds"][:30]
    )
    headers = (
        "Time",
        "Kind",
        "Round ms",
        "Solver ms",
        "Method",
        "Proven",
        "Launches",
        "Stops",
        "Queued",
        "Running",
        "Fragments",
    )
    return f'<h1>Scheduler</h1><dl class="facts">{dl}</dl>{charts}<h2>Recent rounds</h2>{table(headers, rows, "rounds")}'
