"""Node operations benchmark: launch latency, submit to first iteration, checkpoint-and-stop, SFTP, calibration.

Everything runs on this machine, for real (no mocks), in a temporary directory that is removed at the end:

- launch_latency_s: the wrapper's `launch` through LocalExecutor (a `python -m hopsmgr.node.wrapper
  launch` subprocess) of examples/emulated_train.py until the attempt's first progress.json with
  iteration >= 1 (median of --runs; launch_call_s is the launch command alone);
- submit_to_first_iteration_s: a one-server local cluster (hopsmgr.local.cluster: a master process and an
  emulated-device agent), idle, from POST /api/v1/jobs to the first progress of the job's first run
  attempt. It INCLUDES the profiling run every new job gets first (submit_to_profiled_s: until that
  run's exit record);
- checkpoint_stop_{100mb,1gb}_s: a job holding a 100 MB / 1 GB bytes state (os.urandom) launched through
  the wrapper; the time of `checkpoint --wait` until the exit record: pickling, writing, fsync and
  reading back to verify the checkpoint, then exit 75 (--quick skips 1 GB: null);
- sftp_mb_per_s: SshExecutor.copy_checkpoint of the largest checkpoint above from one work directory to
  another through a loopback sshd started here (tests/integration/sshd.py): download + sha256 into the
  master's spool, upload, fsync, stat, rename; MB = 10^6 bytes; null without /usr/sbin/sshd;
- calibration_s: `python -m hopsmgr_agent.calibrate --device auto --budget 60 --json FILE` wall time
  (null without torch).

    python bench/node_ops.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.integration.sshd (the loopback sshd)

from hopsmgr.config import load_cluster_config, parse_cluster_config  # noqa: E402
from hopsmgr.local.cluster import LocalCluster  # noqa: E402
from hopsmgr.master.executor import LaunchOrder, LocalExecutor, NodeTarget  # noqa: E402
from hopsmgr.master.ssh import SshExecutor  # noqa: E402
from hopsmgr.runtime import checkpoint  # noqa: E402
from hopsmgr.runtime.files import read_json  # noqa: E402

PYTHON = sys.executable
EXAMPLE = str(REPO / "examples" / "emulated_train.py")
SSHD = Path("/usr/sbin/sshd")
POLL_S = 0.005
STATE_JOB = """\
import os, sys, time
from hopsmgr import runtime

rt = runtime.init()
rt.resume()
blob = os.urandom(int(sys.argv[1]))  # the job's state: one bytes object
while True:
    time.sleep(0.05)
    rt.step(samples=1, state=lambda: blob)
"""
CLUSTER_TOML = """\
[cluster]
name = "bench-node-ops"

[[servers]]
id = "n1"
gpu_type = "v100"
gpus = 1

[scheduler]
round_seconds = 10
profiling_iterations = 10
min_attempt_s = 15

[master]
listen = "127.0.0.1:0"
heartbeat_interval_s = 0.5
suspect_after_s = 3
lost_after_s = 10

[[tenants]]
name = "bench"
"""


async def poll(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def iteration(attempt_dir: Path) -> int:
    progress = read_json(attempt_dir / "progress.json")
    return int(progress.get("iteration", 0)) if isinstance(progress, dict) else 0


class Node:
    """One local node work directory driven through LocalExecutor; stops what it started."""

    def __init__(self, workdir: Path) -> None:
        self.ex = LocalExecutor(timeout_s=120)
        self.target = NodeTarget("bench", str(workdir))
        self.workdir = workdir
        self.started: list[str] = []

    def attempt_dir(self, attempt: str) -> Path:
        return self.workdir / "attempts" / attempt

    async def launch(self, attempt: str, job: str, argv: list[str]) -> float:
        t0 = time.perf_counter()
        self.started.append(attempt)
        await self.ex.launch(self.target, LaunchOrder(attempt=attempt, job=job, epoch=1, argv=argv))
        return time.perf_counter() - t0

    async def progressed(self, attempt: str, at_least: int, timeout: float) -> None:
        await poll(lambda: iteration(self.attempt_dir(attempt)) >= at_least, timeout, f"{attempt} progress")

    async def close(self) -> None:
        for attempt in self.started:
            try:
                await self.ex.stop(self.target, attempt, 1, grace_s=5)
            except Exception as exc:
                print(f"warning: stopping {attempt}: {exc}", file=sys.stderr)


async def bench_launch(root: Path, runs: int) -> dict[str, Any]:
    node = Node(root / "launch")
    argv = [PYTHON, EXAMPLE, "--iters", "1000000", "--batch-size", "8", "--step-seconds", "0.01"]
    latencies, calls = [], []
    try:
        for i in range(runs):
            t0 = time.perf_counter()
            calls.append(await node.launch(f"l-{i}", f"launch-{i}", argv))
            await node.progressed(f"l-{i}", 1, 60)
            latencies.append(time.perf_counter() - t0)
            await node.ex.stop(node.target, f"l-{i}", 1, grace_s=5)
    finally:
        await node.close()
    return {
        "launch_latency_s": statistics.median(latencies),
        "launch_latency_min_s": min(latencies),
        "launch_latency_max_s": max(latencies),
        "launch_call_s": statistics.median(calls),
    }


async def bench_checkpoint(root: Path, size: int, job: str) -> dict[str, Any]:
    """Launch the state job, let it run, time checkpoint --wait; the checkpoint stays for the SFTP run."""
    script = root / "state_job.py"
    script.write_text(STATE_JOB)
    node = Node(root / "ckpt-src")
    try:
        await node.launch(f"c-{job}", job, [PYTHON, str(script), str(size)])
        await node.progressed(f"c-{job}", 2, 300)
        t0 = time.perf_counter()
        info = await node.ex.checkpoint(node.target, f"c-{job}", 1, wait_s=600, grace_s=10)
        seconds = time.perf_counter() - t0
    finally:
        await node.close()
    if info is None or not info.checkpointed:
        raise RuntimeError(f"{job}: no checkpoint (exit {info})")
    found = checkpoint.list_checkpoints(root / "ckpt-src" / "checkpoints" / job)
    return {"seconds": seconds, "bytes": found[0].data.stat().st_size if found else 0}


async def bench_sftp(root: Path, job: str) -> dict[str, Any]:
    from tests.integration.sshd import Sshd

    server = Sshd.start(root / "sshd")
    common = {"gpu_type": "v100", "gpus": 1, "address": "127.0.0.1", "ssh_port": server.port}
    config = parse_cluster_config(
        {
            "cluster": {"name": "bench-sftp"},
            "servers": [{"id": "n1", **common}, {"id": "n2", **common}],
            "master": {
                "executor": "ssh",
                "checkpoint_shared": False,
                "ssh_key": str(server.user_key),
                "known_hosts": str(server.known_hosts),
                "remote_python": PYTHON,
            },
        }
    )
    ex = SshExecutor(config, root / "sshd")
    try:
        src, dst = NodeTarget("n1", str(root / "ckpt-src")), NodeTarget("n2", str(root / "ckpt-dst"))
        reply = await ex.copy_checkpoint(src, dst, job, spool_dir=str(root))
    finally:
        await ex.close()
        server.stop()
    return reply


def bench_submit(root: Path) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    config_path = root / "cluster.toml"
    config_path.write_text(CLUSTER_TOML)
    cluster = LocalCluster(config_path, load_cluster_config(config_path), root / "cluster")
    attempts = root / "cluster" / "nodes" / "n1" / "attempts"

    def first(mode: str, done: Any) -> float | None:
        for spec_path in sorted(attempts.glob("*/spec.json")):
            spec = read_json(spec_path)
            if isinstance(spec, dict) and spec.get("mode") == mode and done(spec_path.parent):
                return time.perf_counter()
        return None

    try:
        cluster.start()
        body = {
            "command": [PYTHON, EXAMPLE, "--iters", "100000", "--batch-size", "8", "--step-seconds", "0.02"],
            "gpus": [1],
            "batch_size": 8,
            "iterations": 100000,
            "tenant": "bench",
        }
        t0 = time.perf_counter()
        cluster.request("POST", "/api/v1/jobs", body)
        profiled = None
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            profiled = profiled or first("profile", lambda d: (d / "exit.json").exists())
            running = first("run", lambda d: iteration(d) >= 1)
            if running:
                return {
                    "submit_to_first_iteration_s": running - t0,
                    "submit_to_profiled_s": None if profiled is None else profiled - t0,
                }
            time.sleep(POLL_S)
        raise RuntimeError(f"no run attempt made progress within 120 s; see {root / 'cluster'}")
    finally:
        cluster.stop()


def bench_calibration(root: Path) -> dict[str, Any]:
    out = root / "calibration.json"
    argv = [PYTHON, "-m", "hopsmgr_agent.calibrate", "--device", "auto", "--budget", "60", "--json", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"calibrate exited {proc.returncode}: {proc.stderr[-300:]}")
    report = json.loads(out.read_text())
    return {
        "calibration_s": seconds,
        "calibration_device": f"{report.get('device')} {report.get('gpu_type')}",
    }


def attempt(result: dict[str, Any], notes: dict[str, str], keys: list[str], what: str, fn: Any) -> Any:
    """Run one measurement; a failure leaves its keys null with the reason in notes."""
    try:
        value = fn()
    except Exception as exc:
        print(f"{what}: failed: {exc}", file=sys.stderr)
        for key in keys:
            result[key] = None
        notes[keys[0]] = f"{type(exc).__name__}: {exc}"
        return None
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1 GB checkpoint; SFTP copies 100 MB")
    parser.add_argument("--runs", type=int, default=5, help="launches for the launch-latency median")
    parser.add_argument("--dir", type=Path, help="where the temporary files go (default: system temp)")
    parser.add_argument("--no-calibration", action="store_true")
    parser.add_argument("--json", type=Path, help="write the flat result object here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    result: dict[str, Any] = {"quick": args.quick}
    notes: dict[str, str] = {}
    root = Path(tempfile.mkdtemp(prefix="hops-node-ops-", dir=args.dir))
    try:
        launch = attempt(
            result,
            notes,
            ["launch_latency_s", "launch_call_s"],
            "launch",
            lambda: asyncio.run(bench_launch(root, args.runs)),
        )
        result.update(launch or {})
        sub = attempt(
            result,
            notes,
            ["submit_to_first_iteration_s", "submit_to_profiled_s"],
            "submit",
            lambda: bench_submit(root / "submit"),
        )
        result.update(sub or {})
        largest = None
        for label, size in (("100mb", 100 * 10**6), ("1gb", 10**9)):
            key = f"checkpoint_stop_{label}_s"
            if label == "1gb" and args.quick:
                result[key], notes[key] = None, "skipped (--quick)"
                continue
            job = f"ckpt-{label}"
            ck = attempt(
                result, notes, [key], key, lambda s=size, j=job: asyncio.run(bench_checkpoint(root, s, j))
            )
            if ck:
                result[key], result[f"checkpoint_{label}_bytes"], largest = ck["seconds"], ck["bytes"], job
        if not SSHD.exists():
            result["sftp_mb_per_s"], notes["sftp_mb_per_s"] = None, f"{SSHD} is not installed"
        elif largest is None:
            result["sftp_mb_per_s"], notes["sftp_mb_per_s"] = None, "no checkpoint to copy"
        else:
            job = largest
            copied = attempt(
                result, notes, ["sftp_mb_per_s"], "sftp", lambda: asyncio.run(bench_sftp(root, job))
            )
            if copied:
                result.update(
                    sftp_mb_per_s=copied["mb_per_s"],
                    sftp_bytes=copied["bytes"],
                    sftp_s=copied["seconds"],
                    sftp_download_s=copied["download_s"],
                    sftp_upload_s=copied["upload_s"],
                )
        for path in ("ckpt-src", "ckpt-dst"):  # the big files go before the calibration's disk test
            shutil.rmtree(root / path, ignore_errors=True)
        if args.no_calibration:
            result["calibration_s"], notes["calibration_s"] = None, "skipped (--no-calibration)"
        elif importlib.util.find_spec("torch") is None:
            result["calibration_s"], notes["calibration_s"] = None, "torch is not installed"
        else:
            cal = attempt(result, notes, ["calibration_s"], "calibration", lambda: bench_calibration(root))
            result.update(cal or {})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.update({f"{k}_note": v for k, v in notes.items()})
    print_table(result, notes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


ROWS = (
    ("launch_latency_s", "s", "wrapper launch -> first progress (iteration >= 1), median"),
    ("launch_call_s", "s", "the wrapper launch command alone, median"),
    ("submit_to_first_iteration_s", "s", "POST /jobs -> first run-attempt progress, INCLUDES profiling"),
    ("submit_to_profiled_s", "s", "POST /jobs -> the profiling run's exit record"),
    ("checkpoint_stop_100mb_s", "s", "checkpoint --wait, 100 MB state: write, fsync, verify, exit"),
    ("checkpoint_stop_1gb_s", "s", "checkpoint --wait, 1 GB state"),
    ("sftp_mb_per_s", "MB/s", "copy_checkpoint over loopback SFTP via the master (10^6 B)"),
    ("sftp_s", "s", "that copy's wall time (download + verify + upload + rename)"),
    ("calibration_s", "s", "hopsmgr_agent.calibrate --device auto --budget 60"),
)


def print_table(result: dict[str, Any], notes: dict[str, str]) -> None:
    print(f"\n{'metric':<30} {'value':>10}  unit  what")
    for key, unit, what in ROWS:
        value = result.get(key)
        shown = "null" if value is None else f"{value:.3f}"
        print(f"{key:<30} {shown:>10}  {unit:<4}  {notes.get(key, what)}")
    if result.get("calibration_device"):
        print(f"(calibration device: {result['calibration_device']})")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
