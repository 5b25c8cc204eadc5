"""The README's demo, run the way a newcomer runs it: `hopsmgr demo --quick` from a clean directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_demo_completes_every_job_with_a_preemption_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "hopsmgr.cli.main", "demo", "--quick", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "EMULATED" in proc.stdout and "executor:" in proc.stdout and "single-user" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] >= 4 and summary["completed"] == summary["jobs"] and summary["failed"] == 0
    assert summary["preempted"] >= 1 and summary["resumed"] >= 1
    assert summary["makespan_s"] > 0 and summary["executor"] in ("local", "ssh")
    assert "latency ratio mean / max" in proc.stdout  # the final table
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # nothing it started is left running
    assert not (out / "run" / "run.json").exists()
    leftover = subprocess.run(["pgrep", "-f", str(out / "run")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout


def test_up_and_down_start_and_stop_a_local_cluster(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
    run = [sys.executable, "-m", "hopsmgr.cli.main"]
    up = subprocess.run(
        [*run, "up", "--config", str(config), "--dir", "lc"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "export HOPSMGR_URL=" in up.stdout
        assert "single-user: every job runs as" in up.stdout  # no [[users]] with Unix accounts
        again = subprocess.run(
            [*run, "up", "--config", str(config), "--dir", "lc"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1 and "already runs" in again.stderr
        env_line = next(line for line in up.stdout.splitlines() if line.startswith("export "))
        url = env_line.split("HOPSMGR_URL=")[1].split()[0]
        token = (tmp_path / "lc" / "state" / "admin.token").read_text().strip()
        nodes = subprocess.run(
            [*run, "nodes", "--url", url, "--token", token], capture_output=True, text=True, timeout=60
        )
        assert nodes.returncode == 0 and "node-v100" in nodes.stdout and "HEALTHY" in nodes.stdout
    finally:
        down = subprocess.run(
            [*run, "down", "--dir", "lc"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not (tmp_path / "lc" / "run.json").exists()
