"""Caps per GPU type through `hopsmgr simulate`: a cluster file gives one tenant no GPU of the fastest
type; its jobs (jobs.csv) never run there, while the other tenant's do, in the same run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.sim._cli_simulate_helpers import run

REPO = Path(__file__).resolve().parents[2]


def cluster_file(tmp_path: Path, caps: str) -> Path:
    text = (REPO / "configs/sim/paper-16.toml").read_text(encoding="utf-8")
    text += f'\n[[tenants]]\nname = "a"\n{caps}\n\n[[tenants]]\nname = "b"\n'
    path = tmp_path / "paper-16-tenants.toml"
    path.write_text(text, encoding="utf-8")
    return path


def types_used(out: Path) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {"a": set(), "b": set()}
    with (out / "jobs.csv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            used[row["tenant"]].update(row["gpu_types"].split())
    return used


def test_a_tenant_capped_at_zero_on_a_type_never_runs_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = "poisson:jobs=40,rate=30,tenants=a|b"
    outs = {}
    for label, caps in (("free", ""), ("capped", "cap_gpus_by_type = { rtx3090 = 0 }")):
        out = tmp_path / label
        argv = ["simulate", "--cluster", str(cluster_file(tmp_path, caps)), "--workload", workload]
        code, _, err = run(capsys, *argv, "--policies", "hops", "--seed", "1", "--out", str(out))
        assert code == 0, err
        outs[label] = types_used(out)
    assert "rtx3090" in outs["free"]["a"]  # without the cap, tenant a's jobs do run on the fastest type
    assert "rtx3090" not in outs["capped"]["a"]
    assert outs["capped"]["a"]  # ... and they ran elsewhere
    assert "rtx3090" in outs["capped"]["b"]
