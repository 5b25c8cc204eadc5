"""Faults of the job itself: killed by a signal, a corrupt newest checkpoint, a full disk at checkpoint.

A job killed by a signal nobody asked for (the OOM killer's SIGKILL) is a failure of the job: it ends
FAILED with the attempt, the signal and its log tail in the history, and stays listed. A corrupt newest
checkpoint is skipped when the job resumes: it goes on from the previous verified one and its result
is the same as an uninterrupted run's. A checkpoint that cannot be written (file size limit: EFBIG)
makes the job exit non-zero and leaves the previous checkpoint verified.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.node import ops
from hopsmgr.runtime import checkpoint
from tests.faults.conftest import MakeCluster
from tests.faults.helpers import RunWatcher, jobs_by_id, kinds, runs
from tests.integration.cluster import EXAMPLE, LocalCluster, wait_for

GROW_JOB = str(Path(__file__).parent / "jobs" / "grow_job.py")


def attempt_dir(cluster: LocalCluster, attempt: dict[str, Any]) -> Path:
    node = next(iter(attempt["placement"]))
    return cluster.root / "nodes" / node / "attempts" / attempt["id"]


def progress_iteration(directory: Path) -> int:
    try:
        return int(json.loads((directory / "progress.json").read_text())["iteration"])
    except (OSError, ValueError, KeyError):
        return 0


def expected_checksum(iters: int, seed: int = 0) -> int:
    spec = importlib.util.spec_from_file_location("emulated_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checksum = seed
    for it in range(iters):
        checksum = module.advance(checksum, it, seed)
    return checksum


def test_job_killed_by_signal_fails_with_a_clear_history(make_cluster: MakeCluster) -> None:
    cluster = make_cluster().start()
    job_id = cluster.submit(iters=2000, step=0.02, tenant="guest", name="victim")
    attempt = runs(cluster.wait_state(job_id, "RUNNING", timeout=60))[-1]
    pid_file = attempt_dir(cluster, attempt) / "pid"
    wait_for(pid_file.exists, 10, "the job's pid file")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    job = cluster.wait_state(job_id, "FAILED", timeout=30)
    assert job_id in jobs_by_id(cluster)  # not lost: listed, with its history
    failed = [h for h in job["history"] if h["kind"] == "failed"]
    assert len(failed) == 1, job["history"]
    message = failed[0]["message"]
    assert attempt["id"] in message and "signal 9" in message and "SIGKILL" in message, message
    assert job["reason"] == message
    assert runs(job)[-1]["exit_code"] == -9
    # nothing was restarted behind the user's back
    assert kinds(job).count("launching") == 1


@pytest.mark.slow
def test_corrupt_newest_checkpoint_resumes_from_the_previous_one(make_cluster: MakeCluster) -> None:
    """A guest is preempted twice by owners (guaranteed the whole cluster); its newest checkpoint is
    corrupted before it resumes the second time: it resumes from the first and ends right."""
    iters = 400
    cluster = make_cluster().start()
    with RunWatcher(cluster.root) as watcher:
        guest = cluster.submit(iters=iters, step=0.02, tenant="guest", name="guest")
        cluster.wait_state(guest, "RUNNING", timeout=60)
        ckpt_dir = cluster.state_dir / "checkpoints" / guest

        def newest() -> int:
            found = checkpoint.list_checkpoints(ckpt_dir)
            return found[0].iteration if found else -1

        # first owner: the guest checkpoints (A) and resumes once the owner is done
        owner1 = cluster.submit(gpus="2", iters=30, step=0.02, tenant="owner", name="owner1")
        cluster.wait_state(owner1, "COMPLETED", timeout=60)
        first = newest()
        assert first > 0, "the guest was not checkpointed for the first owner"
        resumed = cluster.wait_state(guest, "RUNNING", timeout=60)
        wait_for(
            lambda: progress_iteration(attempt_dir(cluster, runs(resumed)[-1])) >= first + 20,
            30,
            "the guest past its first checkpoint",
        )
        # second owner: a newer checkpoint (B); corrupt it while the guest waits
        owner2 = cluster.submit(gpus="2", iters=100, step=0.02, tenant="owner", name="owner2")
        wait_for(lambda: newest() > first, 60, "the second checkpoint")
        second = newest()
        data = checkpoint.data_path(ckpt_dir, second)
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # same size, wrong sha256
        data.write_bytes(bytes(raw))
        assert checkpoint.load_latest(ckpt_dir) is not None
        assert checkpoint.load_latest(ckpt_dir)[0] == first  # type: ignore[index]
        job = cluster.job(guest)
        assert job["state"] in ("QUEUED", "CHECKPOINTING"), f"the guest resumed before the corruption: {job}"
        cluster.wait_state(owner2, "COMPLETED", timeout=60)
        done = cluster.wait_state(guest, "COMPLETED", timeout=90)
        watcher.stop()
    assert not watcher.overlaps, watcher.overlaps[:5]
    last = runs(done)[-1]
    log = (attempt_dir(cluster, last) / "log").read_text()
    assert f"resumed at iteration {first}\n" in log, log  # the previous verified checkpoint, not B
    assert f"final checksum {expected_checksum(iters)}" in log, log
    assert len(runs(done)) == 3
    assert all("checkpointed" in h["message"] for h in done["history"] if h["kind"] == "requeued")


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_checkpoint_on_a_full_disk_fails_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """The wrapper directly: a run writes a small checkpoint; the next run, under a 64 KiB file size
    limit, cannot write its 1 MB one: it exits non-zero (not "checkpointed") and the small one stays."""
    work, ckpt = tmp_path / "work", tmp_path / "ckpt"
    cmd = [sys.executable, GROW_JOB, "--iters", "100000", "--step-seconds", "0.01"]
    try:
        ops.launch(work, "a-1", "j-1", 1, [*cmd, "--state-bytes", "1000"], checkpoint_dir=ckpt)
        wait_for(lambda: progress_iteration(work / "attempts" / "a-1") >= 3, 20, "a-1 running")
        rec = ops.checkpoint(work, "a-1", 1, wait=20)
        assert rec["exit"]["code"] == 75 and rec["exit"]["checkpointed"], rec
        saved = checkpoint.load_latest(ckpt)
        assert saved is not None
        first = saved[0]

        limited = ["prlimit", f"--fsize={64 * 1024}", *cmd, "--state-bytes", str(1 << 20)]
        ops.launch(work, "a-2", "j-1", 1, limited, checkpoint_dir=ckpt)
        wait_for(lambda: progress_iteration(work / "attempts" / "a-2") > first + 3, 20, "a-2 resumed")
        rec = ops.checkpoint(work, "a-2", 1, wait=20)
        assert rec["exit"]["code"] not in (0, 75, None) and not rec["exit"]["checkpointed"], rec
        log = ops.logs(work, "a-2")["log"]
        assert f"resumed at iteration {first}" in log and "File too large" in log, log
        # the previous checkpoint is intact and still the newest verified one; no partial file is left
        assert checkpoint.load_latest(ckpt) == saved
        names = sorted(p.name for p in ckpt.iterdir())
        assert names == [f"ckpt-{first:09d}.json", f"ckpt-{first:09d}.pkl"], names
    finally:
        for attempt in ("a-1", "a-2"):
            pid_file = work / "attempts" / attempt / "pid"
            if pid_file.exists():
                with contextlib.suppress(OSError, ValueError):
                    os.killpg(int(pid_file.read_text()), signal.SIGKILL)
