"""The framework integrations of hopsmgr.runtime with the real libraries: Hugging Face Trainer
(`hopsmgr.runtime.hf`), PyTorch Lightning (`hopsmgr.runtime.lightning`) and a hand-written loop
(`hopsmgr.runtime.loop`), each through its example script in real processes with `HOPS_*` settings.

Per script: a whole run; a run asked for a checkpoint part way (SIGUSR1, as the node wrapper sends
it) that must exit 75 with a verified checkpoint at the step it reached; a fresh attempt that
resumes from it and must end at the last step with the same parameters as the whole run; and a
profile-mode run that must exit 0 after HOPS_PROFILE_ITERS steps with positive phase times. Models are
built from configs inside the scripts (HF_HUB_OFFLINE=1: nothing is downloaded). Skipped when a
library is missing (they are the `test` extra's).
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

ITERS = 12
SPLIT_AT = 4
PROFILE_ITERS = 5
TIMEOUT = 240.0
Done = subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class Case:
    script: str
    library: str
    args: tuple[str, ...]
    line: str  # the regex of a per-step progress line: group 1 is the step


CASES = {
    "hf": Case("hf_train.py", "transformers", ("--batch-size", "4"), r"step (\d+) loss"),
    # its steps and the loop's iterations take a few milliseconds: 0.05 s each leaves the test time to
    # send its signal before the run ends (the reader of a loaded machine lagged eight steps behind)
    "lightning": Case(
        "lightning_train.py",
        "lightning",
        ("--batch-size", "16", "--step-seconds", "0.05"),
        r"step (\d+) loss",
    ),
    "loop": Case(
        "loop_train.py",
        "torch",
        ("--batch-size", "16", "--log-every", "1", "--step-seconds", "0.05"),
        r"iter (\d+) loss",
    ),
}


@dataclass(frozen=True)
class Runs:
    whole: Done
    split: Done
    resumed: Done
    profile: Done
    split_attempt: Path
    checkpoints: Path
    profile_attempt: Path


def env_for(root: Path, attempt: str, **extra: str) -> dict[str, str]:
    attempt_dir = root / "attempts" / attempt
    attempt_dir.mkdir(parents=True, exist_ok=True)
    return {
        "HOPS_JOB_ID": "j-000001",
        "HOPS_ATTEMPT_ID": attempt,
        "HOPS_ATTEMPT_DIR": str(attempt_dir),
        "HOPS_CHECKPOINT_DIR": str(root / "ckpt"),
        "HOPS_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        **extra,
    }


def launch(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOPS_")}
    full.update(env)
    return subprocess.Popen(
        argv, env=full, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def collect(proc: subprocess.Popen[str], before: str = "") -> Done:
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, before + out, err)


def read_until_step(proc: subprocess.Popen[str], pattern: str, step: int) -> str:
    assert proc.stdout is not None
    seen = []
    while line := proc.stdout.readline():
        seen.append(line)
        m = re.match(pattern, line)
        if m and int(m.group(1)) >= step:
            return "".join(seen)
    done = collect(proc, "".join(seen))
    raise AssertionError(f"ended before step {step}: {done.returncode} {done.stdout} {done.stderr[-3000:]}")


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    case = CASES[request.param]
    pytest.importorskip(case.library)
    root = tmp_path_factory.mktemp(request.param)
    argv = [PY, str(EXAMPLES / case.script), *case.args, "--iters", str(ITERS)]
    split_env = env_for(root / "split", "a-000001")
    profile_env = env_for(
        root / "profile", "a-000009", HOPS_MODE="profile", HOPS_PROFILE_ITERS=str(PROFILE_ITERS)
    )
    # two at a time: each run starts torch and its framework, on a small machine
    procs = [launch(argv, split_env), launch(argv, env_for(root / "whole", "a-000001"))]

    def kill_all() -> None:
        for p in procs:
            p.kill()

    timer = threading.Timer(TIMEOUT, kill_all)
    timer.start()
    try:
        part, whole = procs
        head = read_until_step(part, case.line, SPLIT_AT)
        # what the wrapper sends (it also writes checkpoint.request, which tests/node/test_runtime.py
        # covers): the signal reaches the integration's handler even where the framework has its own
        part.send_signal(signal.SIGUSR1)
        split = collect(part, head)
        procs.append(launch(argv, env_for(root / "split", "a-000002")))  # a fresh attempt
        whole_done = collect(whole)
        procs.append(launch(argv, profile_env))
        done = Runs(
            whole=whole_done,
            split=split,
            resumed=collect(procs[2]),
            profile=collect(procs[3]),
            split_attempt=Path(split_env["HOPS_ATTEMPT_DIR"]),
            checkpoints=root / "split" / "ckpt",
            profile_attempt=Path(profile_env["HOPS_ATTEMPT_DIR"]),
        )
    finally:
        timer.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    yield done


def final(stdout: str, what: str) -> str:
    found = re.findall(rf"^final {what} (\S+)$", stdout, re.MULTILINE)
    assert len(found) == 1, f"expected one 'final {what}' line in {stdout!r}"
    return str(found[0])


def test_a_checkpoint_request_saves_a_verified_checkpoint_and_exits_75(runs: Runs) -> None:
    assert runs.split.returncode == EXIT_CHECKPOINTED, runs.split.stderr[-3000:]
    assert "final digest" not in runs.split.stdout
    saved = checkpoint.list_checkpoints(runs.checkpoints)
    assert saved, "no checkpoint written"
    assert SPLIT_AT <= saved[0].iteration < ITERS, saved
    assert checkpoint.read_verified(saved[0]) is not None
    progress = json.loads((runs.split_attempt / "progress.json").read_text())
    assert progress["iteration"] == saved[0].iteration
    assert progress["samples"] > 0 and progress["samples_per_s"] > 0


def test_the_resumed_attempt_ends_like_an_uninterrupted_run(runs: Runs) -> None:
    assert runs.whole.returncode == 0, runs.whole.stderr[-3000:]
    assert runs.resumed.returncode == 0, runs.resumed.stderr[-3000:]
    assert "resumed" in runs.resumed.stdout and "resumed" not in runs.whole.stdout
    saved = checkpoint.list_checkpoints(runs.checkpoints)[0].iteration
    steps = [int(s) for s in re.findall(r"^(?:step|iter) (\d+) loss", runs.resumed.stdout, re.MULTILINE)]
    assert steps and steps[0] == saved + 1 and steps[-1] == ITERS, steps
    assert final(runs.resumed.stdout, "digest") == final(runs.whole.stdout, "digest")


def test_profile_mode_measures_the_phases_and_exits_0(runs: Runs) -> None:
    assert runs.profile.returncode == 0, runs.profile.stderr[-3000:]
    assert "final digest" not in runs.profile.stdout
    profile = json.loads((runs.profile_attempt / "profile.json").read_text())
    assert profile["iterations"] == PROFILE_ITERS, profile
    assert profile["tf_s"] > 0 and profile["tu_s"] > 0 and profile["iteration_s"] > 0, profile
    assert profile["samples_per_s"] > 0, profile


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_attempt_on_twice_the_smallest_gpu_count_ends_in_half_the_steps(name: str, tmp_path: Path) -> None:
    # --iters counts steps at the job's smallest GPU count; with the per-GPU batch fixed a step on
    # twice the GPUs does two of them, and each integration stops once the runtime's work is done
    # (by default at the Trainer's max_steps). The examples train on one CPU device, so each step
    # takes twice the batch: the same samples in all as the whole run at the smallest count.
    case = CASES[name]
    pytest.importorskip(case.library)
    argv = [PY, str(EXAMPLES / case.script), *case.args, "--iters", str(ITERS)]
    env = env_for(tmp_path, "a-000001", HOPS_WORLD_GPUS="2", HOPS_BASE_GPUS="1")
    done = collect(launch(argv, env))
    assert done.returncode == 0, done.stderr[-3000:]
    progress = json.loads(Path(env["HOPS_ATTEMPT_DIR"], "progress.json").read_text())
    assert (progress["iteration"], progress["work"]) == (ITERS // 2, float(ITERS)), progress
    batch = int(case.args[case.args.index("--batch-size") + 1])
    assert progress["samples"] == ITERS * batch, progress
