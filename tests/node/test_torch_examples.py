"""The torch examples under the runtime: an interrupted, resumed run ends bit for bit like a whole one.

Each example runs in real processes with `HOPS_*` settings: once uninterrupted; once asked for a
checkpoint a third of the way in (SIGUSR1 for the CNN, the request file for the LM), then resumed by a
fresh attempt from the same checkpoint directory; and once in profile mode. The whole and the
resumed run must print the same parameter digest; the profile must hold positive phase times. The
runs of one example share a fixture and overlap where they can, since starting torch dominates their
time. Skipped when torch is not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hopsmgr.runtime import EXIT_CHECKPOINTED, checkpoint

from .util import EXAMPLES, PY, REPO

torch = pytest.importorskip("torch")

ITERS = 60
PROFILE_ITERS = 5
TIMEOUT = 120.0
SCRIPTS = {"cnn": EXAMPLES / "cnn_train.py", "lm": EXAMPLES / "lm_train.py"}
HOW = {"cnn": "SIGUSR1", "lm": "file"}  # how each example is asked for its checkpoint
BATCH = {"cnn": 16, "lm": 8}  # small: starting torch is most of a run's time already
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
CASES = [
    pytest.param(("cnn", "cpu"), id="cnn-cpu"),
    pytest.param(("lm", "cpu"), id="lm-cpu"),
    pytest.param(("cnn", "cuda"), id="cnn-cuda", marks=NO_CUDA),
    pytest.param(("lm", "cuda"), id="lm-cuda", marks=NO_CUDA),
]
Done = subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class Runs:
    """One example's four runs: whole, split (checkpointed part way), resumed, profile."""

    name: str
    whole: Done
    split: Done
    resumed: Done
    profile: Done
    split_attempt: Path
    split_checkpoints: Path
    profile_attempt: Path
    profile_checkpoints: Path


def env_for(root: Path, attempt: str, **extra: str) -> dict[str, str]:
    attempt_dir = root / "attempts" / attempt
    attempt_dir.mkdir(parents=True, exist_ok=True)
    return {
        "HOPS_JOB_ID": "j1",
        "HOPS_ATTEMPT_ID": attempt,
        "HOPS_ATTEMPT_DIR": str(attempt_dir),
        "HOPS_CHECKPOINT_DIR": str(root / "ckpt"),
        "HOPS_THREADS": "1",
        **extra,
    }


def launch(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOPS_")}
    full.update(env)
    return subprocess.Popen(
        argv, env=full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def collect(proc: subprocess.Popen[str], stdout_before: str = "") -> Done:
    """Wait for `proc`; its output (after `stdout_before`, what was already read from it)."""
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out = stdout_before + proc.stdout.read()  # the examples write little to stderr: no deadlock
        err = proc.stderr.read()
    return subprocess.CompletedProcess(proc.args, proc.wait(timeout=TIMEOUT), out, err)


def read_until_iteration(proc: subprocess.Popen[str], iteration: int) -> str:
    """Read `proc`'s "iter <n> loss <x>" lines until n >= `iteration`; what was read."""
    assert proc.stdout is not None
    seen = []
    while line := proc.stdout.readline():
        seen.append(line)
        m = re.match(r"iter (\d+) ", line)
        if m and int(m.group(1)) >= iteration:
            return "".join(seen)
    done = collect(proc, "".join(seen))
    raise AssertionError(f"ended before iteration {iteration}: {done.returncode} {done.stdout} {done.stderr}")


@pytest.fixture(scope="module", params=CASES)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    name, device = request.param
    root = tmp_path_factory.mktemp(f"{name}-{device}")
    script = [PY, str(SCRIPTS[name]), "--batch-size", str(BATCH[name]), "--device", device]
    argv = [*script, "--iters", str(ITERS)]
    split_env = env_for(root / "split", "a1")
    profile_env = env_for(root / "profile", "p1", HOPS_MODE="profile", HOPS_PROFILE_ITERS=str(PROFILE_ITERS))
    # fewer --iters than profile iterations: profiling still runs its PROFILE_ITERS
    procs = [
        launch([*argv, "--log-every", "1"], split_env),
        launch([*argv, "--log-every", "0"], env_for(root / "whole", "a1")),
        launch([*script, "--iters", "2"], profile_env),
    ]

    def kill_all() -> None:
        for p in procs:
            p.kill()

    timer = threading.Timer(TIMEOUT, kill_all)
    timer.start()
    try:
        part, whole, profile = procs
        head = read_until_iteration(part, ITERS // 3)
        if HOW[name] == "file":
            Path(split_env["HOPS_ATTEMPT_DIR"], "checkpoint.request").touch()
        else:
            part.send_signal(signal.SIGUSR1)
        split = collect(part, head)
        procs.append(launch(argv, env_for(root / "split", "a2")))  # a fresh attempt, same checkpoints
        done = Runs(
            name=name,
            whole=collect(whole),
            split=split,
            resumed=collect(procs[-1]),
            profile=collect(profile),
            split_attempt=Path(split_env["HOPS_ATTEMPT_DIR"]),
            split_checkpoints=root / "split" / "ckpt",
            profile_attempt=Path(profile_env["HOPS_ATTEMPT_DIR"]),
            profile_checkpoints=root / "profile" / "ckpt",
        )
    finally:
        timer.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()  # reaps it and closes its pipes
    yield done


def final(stdout: str, what: str) -> str:
    found = re.findall(rf"^final {what} (\S+)$", stdout, re.MULTILINE)
    assert len(found) == 1, f"expected one 'final {what}' line in {stdout!r}"
    return str(found[0])


def test_checkpoint_request_exits_75_part_way(runs: Runs) -> None:
    assert runs.split.returncode == EXIT_CHECKPOINTED, runs.split.stderr
    assert "final digest" not in runs.split.stdout
    saved = checkpoint.list_checkpoints(runs.split_checkpoints)
    assert saved and ITERS // 3 <= saved[0].iteration < ITERS, saved
    assert f"checkpoint at iteration {saved[0].iteration}" in runs.split.stderr
    progress = json.loads((runs.split_attempt / "progress.json").read_text())
    assert progress["iteration"] == saved[0].iteration


def test_resumed_run_ends_bit_for_bit_like_an_uninterrupted_one(runs: Runs) -> None:
    assert runs.whole.returncode == 0, runs.whole.stderr
    assert runs.resumed.returncode == 0, runs.resumed.stderr
    saved = checkpoint.list_checkpoints(runs.split_checkpoints)
    assert saved and f"resumed at iteration {saved[0].iteration}\n" in runs.resumed.stdout
    assert "resumed" not in runs.whole.stdout
    assert final(runs.resumed.stdout, "digest") == final(runs.whole.stdout, "digest")
    assert final(runs.resumed.stdout, "loss") == final(runs.whole.stdout, "loss")
    assert float(final(runs.whole.stdout, "loss")) > 0


def test_profile_mode_writes_positive_phase_times_and_exits_zero(runs: Runs) -> None:
    assert runs.profile.returncode == 0, runs.profile.stderr
    assert "final digest" not in runs.profile.stdout
    profile = json.loads((runs.profile_attempt / "profile.json").read_text())
    assert profile["iterations"] == PROFILE_ITERS and profile["measured"] == PROFILE_ITERS - 2
    for key in ("tf_s", "tb_s", "tu_s", "td_s", "iteration_s", "samples_per_s"):
        assert profile[key] > 0, (key, profile)
    assert profile["tf_s"] + profile["tb_s"] + profile["tu_s"] < profile["iteration_s"]
    assert checkpoint.list_checkpoints(runs.profile_checkpoints) == []
