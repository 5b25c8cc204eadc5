"""PNG plots of simulation results: JCT and latency-ratio CDFs, throughput and fragments over time, and
the estimator's error over time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hopsmgr.core import metrics
from hopsmgr.sim.outcome import SimResult, error_over_time


def draw_all(out: Path, results: Mapping[str, SimResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def cdf_plot(name: str, title: str, xlabel: str, values: Mapping[str, list[float]], log: bool) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy, vals in values.items():
            points = metrics.cdf(vals)
            if points:
                ax.step([p[0] for p in points], [p[1] for p in points], where="post", label=policy)
        if log:
            ax.set_xscale("symlog", linthresh=0.01)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of jobs")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    cdf_plot(
        "jct_cdf.png",
        "Job completion time",
        "JCT (h)",
        {p: [v / 3600 for v in metrics.jct_s(r.jobs)] for p, r in results.items()},
        log=True,
    )
    cdf_plot(
        "lr_cdf.png",
        "Latency ratio (wait / expected run time)",
        "latency ratio",
        {p: metrics.latency_ratios(r.jobs) for p, r in results.items()},
        log=True,
    )

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for policy, r in results.items():
        times = [(t - r.timeline[0][0]) / 3600 for t, _, _ in r.timeline] if r.timeline else []
        top.plot(times, [x for _, x, _ in r.timeline], label=policy, lw=1)
        bottom.plot(times, [f for _, _, f in r.timeline], label=policy, lw=1)
    top.set_ylabel("throughput (1-GPU equivalents)")
    top.set_title("Cluster throughput and fragments over time")
    bottom.set_ylabel("idle GPUs while jobs wait")
    bottom.set_xlabel("time (h)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out / "throughput_fragments.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4))
    for n, (policy, r) in enumerate(results.items()):
        points = error_over_time(r)
        color = f"C{n % 10}"
        for key, style in (("seen", "-"), ("unseen", "--")):
            xy = [(h, 100 * e) for p in points if (h := p["hour"]) is not None and (e := p[key]) is not None]
            if xy:
                ax.plot(
                    [h for h, _ in xy], [e for _, e in xy], style, color=color, lw=1, label=f"{policy} {key}"
                )
    ax.set_title("Estimator error over time (seen: configurations the job ran on)")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("MAPE (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "estimator_error.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
