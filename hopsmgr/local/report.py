"""Metrics and the timeline plot of a live run, computed from the API's job details.

JCT is completion minus submission; wait is JCT minus the time the job's run attempts held GPUs; the
latency ratio is JCT over the job's run time on the fastest server, estimated from its attempts (each
attempt's duration times its slowest server's speed over the fastest speed). Fragments are the mean idle
GPUs sampled while work waited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hopsmgr.config import ClusterConfig
from hopsmgr.core.metrics import mean, percentile


def _runs(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in job["attempts"] if not a["profiling"] and a["started"] is not None]


def _end(job: dict[str, Any]) -> float | None:
    ends = [h["time"] for h in job["history"] if h["state"] in ("COMPLETED", "FAILED", "CANCELLED")]
    return ends[-1] if ends else None


def job_metrics(
    jobs: list[dict[str, Any]], speeds: dict[str, float], idle_samples: list[int]
) -> dict[str, Any]:
    fastest = max(speeds.values(), default=1.0)
    jct: list[float] = []
    waits: list[float] = []
    ratios: list[float] = []
    preempted = resumed = 0
    for job in jobs:
        kinds = [h["kind"] for h in job["history"]]
        stops = [k for k, kind in enumerate(kinds) if kind in ("preempted", "migrated")]
        if stops:  # checkpointed and stopped by the scheduler (to give GPUs away, or to move)
            preempted += 1
            if "started" in kinds[stops[0] :] or "adopted" in kinds[stops[0] :]:
                resumed += 1
        end = _end(job)
        if job["state"] != "COMPLETED" or end is None:
            continue
        total = end - job["submitted"]
        held = ideal = 0.0
        for a in _runs(job):
            span = (a["ended"] or end) - a["started"]
            held += span
            ideal += span * min(speeds.get(n, 1.0) for n in a["placement"]) / fastest
        jct.append(total)
        waits.append(max(0.0, total - held))
        if ideal > 0:
            ratios.append(total / ideal)
    ends = [e for j in jobs if (e := _end(j)) is not None]
    starts = [j["submitted"] for j in jobs]
    return {
        "jobs": len(jobs),
        "completed": sum(1 for j in jobs if j["state"] == "COMPLETED"),
        "failed": sum(1 for j in jobs if j["state"] == "FAILED"),
        "preempted": preempted,
        "resumed": resumed,
        "makespan_s": (max(ends) - min(starts)) if ends and starts else None,
        "jct_mean_s": mean(jct),
        "jct_p95_s": percentile(jct, 95),
        "wait_mean_s": mean(waits),
        "latency_ratio_max": max(ratios) if ratios else None,
        "latency_ratio_mean": mean(ratios),
        "fragment_gpus_mean": mean(float(x) for x in idle_samples),
    }


def summary_table(metrics: dict[str, Any]) -> str:
    rows = [
        ("jobs (completed / failed)", f"{metrics['jobs']} ({metrics['completed']} / {metrics['failed']})"),
        ("preempted / resumed", f"{metrics['preempted']} / {metrics['resumed']}"),
        ("makespan", _s(metrics["makespan_s"])),
        ("JCT mean / p95", f"{_s(metrics['jct_mean_s'])} / {_s(metrics['jct_p95_s'])}"),
        ("wait mean", _s(metrics["wait_mean_s"])),
        (
            "latency ratio mean / max",
            f"{_f(metrics['latency_ratio_mean'])} / {_f(metrics['latency_ratio_max'])}",
        ),
        ("idle GPUs while work waited", _f(metrics["fragment_gpus_mean"])),
        ("executor", str(metrics.get("executor", "-"))),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def timeline_png(jobs: list[dict[str, Any]], config: ClusterConfig, path: Path) -> Path:
    """One row per GPU (server:index), one bar per attempt on it, coloured by job; profiling hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [f"{s.id}:{i}" for s in config.servers for i in range(s.gpus)]
    index = {r: k for k, r in enumerate(rows)}
    t0 = min((j["submitted"] for j in jobs), default=0.0)
    colours = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(rows) + 1.5))
    for k, job in enumerate(sorted(jobs, key=lambda j: j["id"])):
        end = _end(job)
        for a in job["attempts"]:
            if a["started"] is None:
                continue
            stop = a["ended"] or end or a["started"]
            for node, devices in (a.get("devices") or {}).items():
                for d in devices:
                    row = index.get(f"{node}:{d}")
                    if row is None:
                        continue
                    ax.broken_barh(
                        [(a["started"] - t0, max(stop - a["started"], 0.2))],
                        (row - 0.4, 0.8),
                        facecolors=colours(k % 20),
                        hatch="//" if a["profiling"] else None,
                        edgecolor="black",
                        linewidth=0.3,
                    )
                    if not a["profiling"] and stop - a["started"] > 4:
                        ax.text(a["started"] - t0 + 0.3, row, job["id"], va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("seconds since the first submission (hatched: profiling runs)")
    ax.set_title("hopsmgr demo: which job ran on which GPU when")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
