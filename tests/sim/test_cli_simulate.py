"""Tests of `hopsmgr simulate` and `hopsmgr demo`, run in-process through `hopsmgr.cli.main.main`: the runs
that succeed and what they write, and demo's bad input.

Runs with Gavel's job types need the shared data (Gavel's throughput table) and are skipped without it;
the paper world needs none. Every bad input must give exit status 2, a message on stderr naming the bad
value, and nothing written to --out; simulate's bad input: tests/sim/test_cli_simulate_bad_input.py.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from hopsmgr.cli.main import main
from hopsmgr.sim import runner
from hopsmgr.sim.runner import COLUMNS
from tests.sim._cli_simulate_helpers import PAPER_CLUSTER, SMALL, gavel_line, run, write_trace

DATA = Path(
    os.environ.get("HOPSMGR_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data")
)
THROUGHPUTS = DATA / "gavel" / "simulation_throughputs.json"
needs_data = pytest.mark.skipif(
    not THROUGHPUTS.is_file(), reason=f"shared data not found at {DATA} (set HOPSMGR_SHARED_DATA)"
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("jct_cdf.png", "lr_cdf.png", "throughput_fragments.png", "estimator_error.png")
ROW_KEYS = (
    "avg_jct_h",
    "p99_jct_h",
    "makespan_h",
    "avg_wait_h",
    "max_lr",
    "mean_lr",
    "max_ftf",
    "frags_per_round",
    "frags_per_waiting_round",
    "placeable_idle_per_round",
    "utilisation",
    "completed",
    "solver_p95_s",
    "estimator_mape",
    "wall_s",
    "peak_rss_mb",
)


def results(out: Path) -> dict[str, object]:
    doc = json.loads((out / "results.json").read_text())
    assert isinstance(doc, dict)
    return doc


def assert_plots(out: Path) -> None:
    for name in PLOTS:
        path = out / name
        assert path.is_file(), name
        data = path.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), name


def table_rows(stdout: str) -> dict[str, list[str]]:
    """Table lines by their first cell (the policy), after the header and its rule."""
    lines = stdout.splitlines()
    rule = next(i for i, line in enumerate(lines) if line and set(line) == {"-"})
    # every column's name whole (they were cut to the column's width: "makespan_", "estimato")
    assert lines[rule - 1].split() == [name for name, _, _ in COLUMNS]
    rows: dict[str, list[str]] = {}
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


# ------------------------------------------------------------------------------ simulate: success


@needs_data
def test_simulate_writes_table_results_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        "v100=1x4,p100=1x4",
        "--workload",
        "poisson:jobs=8,rate=30",
        "--policies",
        "hops,fifo",
        "--seed",
        "3",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    rows = table_rows(stdout)
    assert set(rows) == {"hops", "fifo"}
    assert "8 jobs on 8 GPUs" in stderr and "world=gavel" in stderr
    doc = results(out)
    assert doc["world"] == "gavel" and doc["jobs"] == 8 and doc["gpus"] == 8 and doc["seed"] == 3
    assert doc["gavel_compat"] is False
    policies = doc["policies"]
    assert isinstance(policies, dict) and set(policies) == {"hops", "fifo"}
    for name in ("hops", "fifo"):
        row = policies[name]
        missing = [k for k in ROW_KEYS if k not in row]
        assert not missing, (name, missing)
        assert row["completed"] == 8
        assert row["avg_jct_h"] > 0 and row["makespan_h"] >= row["p99_jct_h"] > 0
        assert 0 < row["utilisation"] <= 1 + 1e-9
        assert row["wall_s"] >= 0 and row["peak_rss_mb"] > 0
        assert 0 <= row["placeable_idle_per_round"] <= row["frags_per_round"]
        assert (
            row["frags_per_waiting_round"] is None or row["frags_per_waiting_round"] >= row["frags_per_round"]
        )
    assert policies["fifo"]["preemptions"] == 0
    assert_plots(out)
    with (out / "jobs.csv").open() as f:
        jobs = list(csv.DictReader(f))
    assert len(jobs) == 16 and {j["policy"] for j in jobs} == {"hops", "fifo"}
    for j in jobs:
        assert j["completed"] == "1" and j["gpu_types"] and set(j["gpu_types"].split()) <= {"v100", "p100"}
        jct, wait = float(j["jct_s"]), float(j["wait_s"])
        assert float(j["end_s"]) - float(j["arrival_s"]) == pytest.approx(jct, rel=1e-5)
        assert 0 <= wait <= jct and float(j["first_start_s"]) >= float(j["arrival_s"])
        assert [int(g) for g in j["gpus"].split()] and float(j["latency_ratio"]) >= 0
    fifo = [j for j in jobs if j["policy"] == "fifo"]
    assert all(j["preemptions"] == "0" and j["moves"] == "0" for j in fifo)
    hops_preemptions = sum(int(j["preemptions"]) for j in jobs if j["policy"] == "hops")
    assert hops_preemptions == policies["hops"]["preemptions"]


@needs_data
def test_simulate_gavel_compat(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        "v100=2x4,p100=1x4,k80=1x4",
        "--workload",
        "poisson:jobs=6,rate=30",
        "--policies",
        "hops,gavel",
        "--gavel-compat",
        "--seed",
        "1",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert "gavel-compat" in stderr
    assert set(table_rows(stdout)) == {"hops", "gavel"}
    doc = results(out)
    assert doc["gavel_compat"] is True
    policies = doc["policies"]
    assert isinstance(policies, dict)
    for name in ("hops", "gavel"):
        assert policies[name]["completed"] == 6
        # The oracle estimator knows the (variation-free) truth.
        mape = policies[name]["estimator_mape"]
        assert mape is None or mape == pytest.approx(0.0, abs=1e-9)
    assert_plots(out)


@needs_data
def test_simulate_gavel_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "small.trace",
        [
            gavel_line("ResNet-18 (batch size 64)", 3000, 1, 0),
            gavel_line("ResNet-50 (batch size 64)", 1500, 2, 30),
            gavel_line("Transformer (batch size 16)", 2000, 1, 90),
            gavel_line("ResNet-18 (batch size 128)", 2500, 4, 200),
        ],
    )
    out = tmp_path / "out"
    code, stdout, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        "v100=2x4,p100=1x4,k80=1x4",
        "--trace",
        str(trace),
        "--format",
        "gavel",
        "--policies",
        "fifo,hops",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert set(table_rows(stdout)) == {"fifo", "hops"}
    doc = results(out)
    assert doc["jobs"] == 4
    policies = doc["policies"]
    assert isinstance(policies, dict)
    assert policies["fifo"]["completed"] == 4 and policies["hops"]["completed"] == 4
    assert_plots(out)


def test_simulate_paper_world_toml_cluster(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cluster = tmp_path / "lab.toml"
    cluster.write_text(
        '[cluster]\nname = "lab"\n\n'
        '[[servers]]\nid = "r1"\ngpu_type = "rtx3090"\ngpus = 4\nhost_model = "A"\n\n'
        '[[servers]]\nid = "r2"\ngpu_type = "rtx3090"\ngpus = 4\nhost_model = "A"\n\n'
        '[[servers]]\nid = "t1"\ngpu_type = "titanxp"\ngpus = 4\n\n'
        "[scheduler]\nround_seconds = 120\n"
    )
    out = tmp_path / "out"
    code, stdout, stderr = run(
        capsys,
        "simulate",
        "--cluster",
        str(cluster),
        "--workload",
        "poisson:jobs=5,rate=30",
        "--policies",
        "hops,fifo",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert set(table_rows(stdout)) == {"hops", "fifo"}
    doc = results(out)
    assert doc["world"] == "paper" and doc["gpus"] == 12 and doc["jobs"] == 5
    assert doc["cluster"] == str(cluster)
    policies = doc["policies"]
    assert isinstance(policies, dict)
    assert all(policies[p]["completed"] == 5 for p in ("hops", "fifo"))
    assert_plots(out)
    # The estimator's error over time: hourly bins from the first arrival, fractions in [0, inf).
    over_time = policies["hops"]["estimator_mape_over_time"]
    assert over_time, "no estimator samples over time"
    hours = [b["hour"] for b in over_time]
    assert hours == sorted(hours) and hours[0] >= 0 and len(set(hours)) == len(hours)
    values = [b[k] for b in over_time for k in ("seen", "unseen") if b[k] is not None]
    assert values and all(v >= 0 for v in values)


def test_server_sigma_sets_the_spread_of_the_servers_hidden_factors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --server-sigma 0 two servers of one kind run a job alike; by default they differ."""
    cluster = runner.parse_cluster(PAPER_CLUSTER)
    first, second = [s for s in cluster.servers if s.gpu_type == cluster.servers[0].gpu_type][:2]
    rates = {}
    for sigma in (0.0, 0.08):
        world = runner.make_world("paper", cluster, 1, None, server_sigma=sigma)
        rates[sigma] = [world.true_rate("ResNet50", [(server, 1)]) for server in (first, second)]
    assert rates[0.0][0] == rates[0.0][1] and rates[0.08][0] != rates[0.08][1]
    out = tmp_path / "out"
    code, _, stderr = run(
        capsys, "simulate", "--cluster", PAPER_CLUSTER, "--workload", SMALL, "--policies", "fifo",
        "--server-sigma", "0", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    assert results(out)["server_sigma"] == 0.0


def test_simulate_without_out_writes_only_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run(
        capsys, "simulate", "--cluster", PAPER_CLUSTER, "--workload", SMALL, "--policies", "fifo"
    )
    assert code == 0, stderr
    assert set(table_rows(stdout)) == {"fifo"}
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ demo


def test_demo_writes_results_for_hops_and_baselines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "demo"
    code, stdout, stderr = run(capsys, "demo", "--simulate", "--jobs", "6", "--rate", "60", "--out", str(out))
    assert code == 0, stderr
    assert "hopsmgr demo" in stderr
    assert set(table_rows(stdout)) == {"hops", "sia-lr", "gavel-lr"}
    doc = results(out)
    assert doc["world"] == "paper" and doc["jobs"] == 6 and doc["gpus"] == 64
    policies = doc["policies"]
    assert isinstance(policies, dict) and set(policies) == {"hops", "sia-lr", "gavel-lr"}
    for row in policies.values():
        assert row["completed"] == 6
        assert all(k in row for k in ROW_KEYS)
    assert_plots(out)


def test_demo_bad_rate_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--simulate", "--rate", "0", "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    assert "'0'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_demo_bad_job_count_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, stderr = run(capsys, "demo", "--simulate", "--jobs", "0", "--out", str(tmp_path / "out"))
    assert code == 2
    assert "jobs" in stderr
    assert not (tmp_path / "out").exists()


def test_the_latency_ratio_hysteresis_stops_long_jobs_rotating(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Six 7-hour jobs (6.9 h alone) on two GPUs, no restart costs (--gavel-compat): without the hysteresis a waiting
    # job's latency ratio passes a running one's within minutes and they rotate (about 230 preemptions);
    # the default (0.1) keeps a running job until a waiting one is 0.1 ahead of it.
    trace = write_trace(
        tmp_path / "long.trace",
        [gavel_line("ResNet-18 (batch size 64)", 600000, 1, 60 * i) for i in range(6)],
    )
    preemptions: dict[str, int] = {}
    for name, line in (("off", "lr_hysteresis = 0\n"), ("default", "")):
        cluster = tmp_path / f"{name}.toml"
        cluster.write_text(
            '[cluster]\nname = "lab"\n\n[[servers]]\nid = "v1"\ngpu_type = "v100"\ngpus = 2\n\n'
            f"[scheduler]\nround_seconds = 120\n{line}"
        )
        out = tmp_path / name
        argv = ["--cluster", str(cluster), "--trace", str(trace), "--format", "gavel", "--gavel-compat"]
        code, _, stderr = run(capsys, "simulate", *argv, "--policies", "hops", "--out", str(out))
        assert code == 0, stderr
        hops = results(out)["policies"]["hops"]  # type: ignore[index]
        assert hops["completed"] == 6
        preemptions[name] = hops["preemptions"]
    assert preemptions["off"] > 100
    assert preemptions["default"] < preemptions["off"] / 3
