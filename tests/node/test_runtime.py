"""hopsmgr.runtime in real training processes: progress, profiling, checkpoint on request, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hopsmgr.runtime import EXIT_CHECKPOINTED, checkpoint

from .util import EMULATED, PY, REPO, expected_checksum, run_script, wait_until


def env_for(tmp_path: Path, attempt: str = "a1", **extra: str) -> dict[str, str]:
    attempt_dir = tmp_path / "attempts" / attempt
    attempt_dir.mkdir(parents=True, exist_ok=True)
    return {
        "HOPS_JOB_ID": "j1",
        "HOPS_ATTEMPT_ID": attempt,
        "HOPS_ATTEMPT_DIR": str(attempt_dir),
        "HOPS_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        **extra,
    }


def temp_files(*dirs: Path) -> list[str]:
    return [p.name for d in dirs if d.exists() for p in d.iterdir() if p.name.startswith(".tmp-")]


def test_progress_file_records_iterations_samples_and_phase_times(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    out = run_script([PY, str(EMULATED), "--iters", "12", "--batch-size", "8", "--step-seconds", "0.02"], env)
    assert out.returncode == 0, out.stderr
    assert f"final checksum {expected_checksum(12)}" in out.stdout
    progress = json.loads(Path(env["HOPS_ATTEMPT_DIR"], "progress.json").read_text())
    assert progress["iteration"] == 12 and progress["samples"] == 96.0 and progress["mode"] == "run"
    assert progress["samples_per_s"] > 0 and progress["td_s"] > 0 and progress["tw_s"] == 0.0
    assert temp_files(Path(env["HOPS_ATTEMPT_DIR"]), tmp_path / "ckpt") == []


def test_profile_mode_writes_profile_and_exits_zero_without_checkpoint(tmp_path: Path) -> None:
    env = env_for(tmp_path, HOPS_MODE="profile", HOPS_PROFILE_ITERS="10")
    argv = [PY, str(EMULATED), "--iters", "100000", "--step-seconds", "0.02", "--batch-size", "4"]
    out = run_script([*argv, "--miss-every", "4", "--miss-seconds", "0.03"], env)
    assert out.returncode == 0, out.stderr
    assert "final checksum" not in out.stdout
    profile = json.loads(Path(env["HOPS_ATTEMPT_DIR"], "profile.json").read_text())
    assert profile["iterations"] == 10 and profile["measured"] == 8
    for key in ("tf_s", "tb_s", "tu_s"):
        assert 0.004 <= profile[key] < 0.05, (key, profile)
    assert profile["tc_s"] == 0.0 and profile["tw_s"] == 0.0
    # iterations 2..9 measured; 4 and 8 are misses
    assert profile["p_cache"] == pytest.approx(0.75)
    assert profile["td_miss_s"] - profile["td_hit_s"] > 0.02
    assert profile["iteration_s"] >= 0.02 and profile["samples_per_s"] > 0
    assert not (tmp_path / "ckpt").exists() or checkpoint.list_checkpoints(tmp_path / "ckpt") == []
    assert json.loads(Path(env["HOPS_ATTEMPT_DIR"], "progress.json").read_text())["mode"] == "profile"


@pytest.mark.parametrize("how", ["SIGUSR1", "SIGTERM", "file"])
def test_checkpoint_request_exits_75_and_resume_gives_the_same_checksum(tmp_path: Path, how: str) -> None:
    iters = 300
    env = env_for(tmp_path)
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("HOPS_")}, **env}
    argv = [PY, str(EMULATED), "--iters", str(iters)]
    proc = subprocess.Popen(
        [*argv, "--step-seconds", "0.01"],
        env=full,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress = Path(env["HOPS_ATTEMPT_DIR"], "progress.json")
        wait_until(progress.exists, "the first progress record")
        if how == "file":
            Path(env["HOPS_ATTEMPT_DIR"], "checkpoint.request").touch()
        else:
            proc.send_signal(signal.SIGUSR1 if how == "SIGUSR1" else signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_CHECKPOINTED, err
    saved = checkpoint.list_checkpoints(tmp_path / "ckpt")
    assert saved and 0 < saved[0].iteration < iters
    assert json.loads(progress.read_text())["iteration"] == saved[0].iteration
    out = run_script([*argv, "--step-seconds", "0"], env_for(tmp_path, attempt="a2"))
    assert out.returncode == 0, out.stderr
    assert f"resumed at iteration {saved[0].iteration}" in out.stdout
    assert f"final checksum {expected_checksum(iters)}" in out.stdout
    assert temp_files(tmp_path / "ckpt") == []


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    emulated = expected_checksum  # the state a run would have saved at each iteration
    checkpoint.save(ckpt, 10, {"checksum": emulated(10)})
    newest = checkpoint.save(ckpt, 20, {"checksum": 12345})
    newest.write_bytes(newest.read_bytes()[:-3])  # truncated
    out = run_script([PY, str(EMULATED), "--iters", "30", "--step-seconds", "0"], env_for(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "resumed at iteration 10" in out.stdout
    assert f"final checksum {expected_checksum(30)}" in out.stdout


def test_standalone_run_writes_nothing_and_ignores_missing_environment(tmp_path: Path) -> None:
    out = run_script([PY, str(EMULATED), "--iters", "5", "--step-seconds", "0"], {})
    assert out.returncode == 0 and f"final checksum {expected_checksum(5)}" in out.stdout


def test_runtime_never_imports_torch(tmp_path: Path) -> None:
    code = "import sys; from hopsmgr import runtime; runtime.cuda_sync(); print('torch' in sys.modules)"
    out = run_script([PY, "-c", code], {})
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_an_attempt_on_more_gpus_than_the_smallest_count_ends_the_job_in_fewer_steps(tmp_path: Path) -> None:
    # --iters counts iterations at the job's smallest GPU count (R1 = 1 here). The per-GPU batch stays
    # fixed, so a step on 4 GPUs does 4 of them: 12 iterations of work are 3 steps. A checkpoint keeps
    # the work done, and the next attempt, on 2 GPUs, does what is left at 2 a step.
    argv = [PY, str(EMULATED), "--iters", "12", "--batch-size", "8", "--step-seconds", "0"]
    wide = env_for(tmp_path, HOPS_WORLD_GPUS="4", HOPS_BASE_GPUS="1", HOPS_GPUS="4")
    out = run_script(argv, wide)
    assert out.returncode == 0, out.stderr
    progress = json.loads(Path(wide["HOPS_ATTEMPT_DIR"], "progress.json").read_text())
    assert (progress["iteration"], progress["work"], progress["start_work"]) == (3, 12.0, 0.0)

    checkpoint.save(tmp_path / "resumed", 1, {"checksum": expected_checksum(1)}, work=4.0)
    env = env_for(tmp_path, "a2", HOPS_WORLD_GPUS="2", HOPS_BASE_GPUS="1", HOPS_GPUS="2")
    out = run_script(argv, {**env, "HOPS_CHECKPOINT_DIR": str(tmp_path / "resumed")})
    assert out.returncode == 0, out.stderr
    progress = json.loads(Path(env["HOPS_ATTEMPT_DIR"], "progress.json").read_text())
    assert (progress["iteration"], progress["work"], progress["start_work"]) == (5, 12.0, 4.0)
    assert f"final checksum {expected_checksum(5)}" in out.stdout
