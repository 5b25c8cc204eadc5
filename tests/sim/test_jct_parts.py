"""Tests of bench/jct_parts.py: a simulated run's average JCT split into best run time, wait and the rest."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import ModuleType

import pytest

from hopsmgr.cli.main import main
from tests.helpers.bench import load_bench

WORKLOAD = "poisson:jobs=12,rate=20"
CLUSTER = str(Path(__file__).resolve().parents[2] / "configs" / "sim" / "paper-16.toml")


def load() -> ModuleType:
    return load_bench("jct_parts")


def parts_main(jobs_csv: Path, *extra: str, workload: str = WORKLOAD) -> int:
    """bench/jct_parts.py's main on the paper-16 run's arguments (`extra` appended)."""
    argv = ["--cluster", CLUSTER, "--jobs-csv", str(jobs_csv), "--workload", workload, "--seed", "4"]
    return int(load().main([*argv, *extra]))


@pytest.fixture(scope="module")
def jobs_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    code = main(
        [
            "simulate",
            "--cluster",
            CLUSTER,
            "--workload",
            WORKLOAD,
            "--policies",
            "hops",
            "--seed",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out / "jobs.csv"


def test_the_parts_add_up_to_the_runs_average_jct(jobs_csv: Path, tmp_path: Path) -> None:
    with jobs_csv.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    avg_jct_h = sum(float(r["jct_s"]) for r in rows) / len(rows) / 3600
    out = tmp_path / "parts.json"
    assert parts_main(jobs_csv, "--json", str(out)) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["jobs"] == 12 and figures["avg_jct_h"] == pytest.approx(avg_jct_h)
    total = figures["avg_best_run_h"] + figures["avg_wait_h"] + figures["avg_rest_h"]
    assert total == pytest.approx(figures["avg_jct_h"])
    # a job's best run time is a bound: every job profiles and waits, so the rest of every job is
    # above zero, and so is the mean of each kind
    assert 0 < figures["avg_best_run_h"] < figures["avg_jct_h"]
    assert figures["avg_rest_elastic_h"] > 0 and figures["avg_rest_rigid_h"] > 0
    assert figures["min_rest_h"] > 0


def test_a_jobs_csv_of_another_workload_is_refused(jobs_csv: Path) -> None:
    with pytest.raises(SystemExit, match="not in the file"):
        parts_main(jobs_csv, workload="poisson:jobs=40,rate=20")


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.csv"
    assert parts_main(missing) == 2
    assert str(missing) in capsys.readouterr().err


def test_a_bad_workload_spec_is_named(jobs_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parts_main(jobs_csv, workload="nonsense:jobs=3") == 2
    err = capsys.readouterr().err
    assert "--workload" in err and "nonsense" in err


def test_a_bad_cluster_is_named(jobs_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--cluster", "v100=2y4", "--jobs-csv", str(jobs_csv), "--workload", WORKLOAD, "--seed", "4"]
    assert load().main(argv) == 2
    err = capsys.readouterr().err
    assert "--cluster" in err and "v100=2y4" in err


def test_the_runs_server_sigma_sets_the_world(
    jobs_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The best run times depend on the world's hidden factors, so on --server-sigma; a bad one is named."""
    best = {}
    for sigma in ("0.08", "0"):
        out = tmp_path / f"parts-{sigma}.json"
        assert parts_main(jobs_csv, "--server-sigma", sigma, "--json", str(out)) == 0
        best[sigma] = json.loads(out.read_text(encoding="utf-8"))["avg_best_run_h"]
    assert best["0.08"] != best["0"]
    assert parts_main(jobs_csv, "--server-sigma", "-0.5") == 2
    assert "--server-sigma" in capsys.readouterr().err
