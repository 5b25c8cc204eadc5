"""The node wrapper end to end: real launches through `python -m hopsmgr.node.wrapper` and monitors."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest

from hopsmgr import node
from hopsmgr.node.layout import is_alive
from hopsmgr.runtime.files import read_json

from .util import EMULATED, FAIL, PY, expected_checksum, wait_until, wrapper

SLEEPER = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)"
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)"
)


def launch(
    work: Path, attempt: str, *argv: str, epoch: int = 1, job: str = "j1", opts: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any]]:
    return wrapper(
        "launch", "--workdir", str(work), "--attempt", attempt, "--job", job, "--epoch", str(epoch),
        *opts, "--", *argv,
    )  # fmt: skip


def state_of(work: Path, attempt: str) -> dict[str, Any]:
    return node.status(work, attempt)["attempts"][0]


def exited(work: Path, attempt: str) -> dict[str, Any] | None:
    st = state_of(work, attempt)
    return st if st["state"] == "exited" else None


def log_has(work: Path, attempt: str, text: str) -> bool:
    return text in node.logs(work, attempt)["log"]


def test_launch_runs_the_job_and_records_its_exit(work: Path) -> None:
    code, out = launch(work, "a1", PY, str(EMULATED), "--iters", "5", "--step-seconds", "0.01")
    assert code == 0, out
    assert out["attempt"] == "a1" and out["already"] is False and isinstance(out["pid"], int)
    assert out["state"] in ("running", "exited")
    st = wait_until(lambda: exited(work, "a1"), "the job's exit")
    assert st["exit"]["code"] == 0 and st["exit"]["signal"] is None and st["exit"]["checkpointed"] is False
    assert st["progress"]["iteration"] == 5 and (st["job"], st["epoch"], st["mode"]) == ("j1", 1, "run")
    assert log_has(work, "a1", f"final checksum {expected_checksum(5)}")
    code, listing = wrapper("status", "--workdir", str(work))
    assert code == 0 and [a["attempt"] for a in listing["attempts"]] == ["a1"] and listing["epoch"] == 1


def test_launch_is_idempotent_per_attempt(work: Path) -> None:
    marker = f"marker-{os.getpid()}-idem"
    _, first = launch(work, "a1", PY, "-c", SLEEPER, marker)
    code, second = launch(work, "a1", PY, "-c", SLEEPER, marker)
    assert code == 0 and second["already"] is True and second["pid"] == first["pid"]
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to start")
    procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    running = []
    for p in procs:
        try:
            if marker.encode() in (p / "cmdline").read_bytes():
                running.append(int(p.name))
        except OSError:
            continue
    assert running == [first["pid"]]
    assert node.logs(work, "a1")["log"].count("ready") == 1


def test_checkpoint_wait_gives_exit_75_and_a_resumable_checkpoint(work: Path) -> None:
    argv = (PY, str(EMULATED), "--iters", "400", "--step-seconds", "0.01")
    launch(work, "a1", *argv)
    wait_until(lambda: state_of(work, "a1")["progress"], "the first progress record")
    code, st = wrapper(
        "checkpoint", "--workdir", str(work), "--attempt", "a1", "--epoch", "1", "--wait", "20"
    )
    assert code == 0, st
    assert st["state"] == "exited" and st["exit"]["code"] == 75 and st["exit"]["checkpointed"] is True
    assert st["checkpoint_requested"] is True
    # again: idempotent on an exited attempt
    code, again = wrapper("checkpoint", "--workdir", str(work), "--attempt", "a1", "--epoch", "1")
    assert code == 0 and again["exit"] == st["exit"]
    stopped_at = st["progress"]["iteration"]
    launch(work, "a2", PY, str(EMULATED), "--iters", "400", "--step-seconds", "0")
    st2 = wait_until(lambda: exited(work, "a2"), "the resumed run")
    assert st2["exit"]["code"] == 0
    assert log_has(work, "a2", f"resumed at iteration {stopped_at}")
    assert log_has(work, "a2", f"final checksum {expected_checksum(400)}")


def test_stop_kills_a_job_that_ignores_signals_after_grace(work: Path) -> None:
    launch(work, "a1", PY, "-c", STUBBORN)
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to install its handlers")
    code, st = wrapper("stop", "--workdir", str(work), "--attempt", "a1", "--epoch", "1", "--grace", "0.3")
    assert code == 0, st
    assert st["state"] == "exited" and st["exit"]["signal"] == signal.SIGKILL and st["exit"]["code"] is None
    code, again = wrapper("stop", "--workdir", str(work), "--attempt", "a1", "--epoch", "1")
    assert code == 0 and again["exit"] == st["exit"]


def test_checkpoint_wait_escalates_to_sigkill(work: Path) -> None:
    launch(work, "a1", PY, "-c", STUBBORN)
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to install its handlers")
    st = node.checkpoint(work, "a1", 1, wait=0.2, grace=0.2)
    assert st["exit"]["signal"] == signal.SIGKILL and st["exit"]["checkpointed"] is False


def test_plain_jobs_start_with_sigusr1_blocked_and_get_the_hops_environment(
    work: Path, tmp_path: Path
) -> None:
    code = (
        "import json, os\n"
        "blk = [l for l in open('/proc/self/status') if l.startswith('SigBlk')][0].split()[1]\n"
        "keys = ['HOPS_JOB_ID', 'HOPS_ATTEMPT_ID', 'HOPS_ATTEMPT_DIR', 'HOPS_CHECKPOINT_DIR', 'HOPS_MODE',\n"
        "        'HOPS_GPUS', 'HOPS_PROFILE_ITERS', 'HOPS_EMULATED_SPEED', 'CUDA_VISIBLE_DEVICES', 'EXTRA']\n"
        "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'cwd': os.getcwd(),\n"
        "                  'usr1_blocked': bool(int(blk, 16) & (1 << 9))}))\n"
    )
    opts = ("--visible-devices", "2,3", "--emulated-speed", "0.5", "--env", "EXTRA=a=b", "--mode", "profile")
    launch(work, "a1", PY, "-c", code, opts=opts)
    wait_until(lambda: exited(work, "a1"), "the job's exit")
    seen = json.loads(node.logs(work, "a1")["log"])
    attempt_dir = str(work.absolute() / "attempts" / "a1")
    assert seen["env"] == {
        "HOPS_JOB_ID": "j1",
        "HOPS_ATTEMPT_ID": "a1",
        "HOPS_ATTEMPT_DIR": attempt_dir,
        "HOPS_CHECKPOINT_DIR": str(work.absolute() / "checkpoints" / "j1"),
        "HOPS_MODE": "profile",
        "HOPS_GPUS": "2",
        "HOPS_PROFILE_ITERS": "20",
        "HOPS_EMULATED_SPEED": "0.5",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "EXTRA": "a=b",
    }
    assert seen["cwd"] == attempt_dir and seen["usr1_blocked"] is True
    spec = read_json(work / "attempts" / "a1" / "spec.json")
    assert spec is not None and spec["argv"] == [PY, "-c", code] and spec["mode"] == "profile"


def test_processes_a_runtime_job_starts_survive_the_checkpoint_signal(work: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "from hopsmgr import runtime\n"
        "rt = runtime.init()\n"
        "probe = \"print([l for l in open('/proc/self/status') if l.startswith('SigBlk')][0], flush=True)\"\n"
        "subprocess.run([sys.executable, '-c', probe], check=True)\n"
        "helper = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)'])\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
        "    rt.step(state=lambda: {'helper_alive': alive_after(0.3)})\n"
    )
    code = code.replace(
        "print('ready'",
        "def alive_after(s):\n"
        "    try:\n"
        "        helper.wait(s)\n"
        "    except subprocess.TimeoutExpired:\n"
        "        return True\n"
        "    return False\n"
        "print('ready'",
    )
    _, out = launch(work, "a1", PY, "-c", code)
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to start its helper")
    os.killpg(out["pid"], signal.SIGUSR1)  # the signal alone, without the request file
    st = wait_until(lambda: exited(work, "a1"), "the checkpoint exit")
    assert st["exit"]["code"] == 75, node.logs(work, "a1")["log"]
    blocked = next(line for line in node.logs(work, "a1")["log"].splitlines() if line.startswith("SigBlk"))
    assert int(blocked.split()[1], 16) & (1 << (signal.SIGUSR1 - 1))
    saved = sorted((work / "checkpoints" / "j1").glob("*.pkl"))
    assert len(saved) == 1 and pickle.loads(saved[0].read_bytes())["state"] == {"helper_alive": True}


def test_epoch_fencing(work: Path) -> None:
    code, _ = launch(work, "a1", PY, "-c", SLEEPER, epoch=5)
    assert code == 0 and (work / "epoch").read_text().strip() == "5"
    code, out = wrapper("checkpoint", "--workdir", str(work), "--attempt", "a1", "--epoch", "4")
    assert code == 3 and "epoch 4" in out["error"] and "5" in out["error"]
    code, out = launch(work, "a2", PY, "-c", "pass", epoch=4)
    assert code == 3 and not (work / "attempts" / "a2").exists()
    code, out = wrapper("stop", "--workdir", str(work), "--attempt", "a1", "--epoch", "7", "--grace", "5")
    assert code == 0 and out["state"] == "exited" and (work / "epoch").read_text().strip() == "7"


@pytest.mark.parametrize(
    ("field", "args"),
    [
        ("attempt", ["--attempt", "../evil", "--job", "j1"]),
        ("attempt", ["--attempt", "..", "--job", "j1"]),
        ("attempt", ["--attempt", "a" * 65, "--job", "j1"]),
        ("attempt", ["--attempt", "", "--job", "j1"]),
        ("job", ["--attempt", "a1", "--job", "j 1"]),
        ("job", ["--attempt", "a1", "--job", "j/../../x"]),
        ("epoch", ["--attempt", "a1", "--job", "j1", "--epoch", "x"]),
        ("env", ["--attempt", "a1", "--job", "j1", "--env", "1BAD=x"]),
        ("mode", ["--attempt", "a1", "--job", "j1", "--mode", "train"]),
        ("argv", ["--attempt", "a1", "--job", "j1"]),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(work: Path, field: str, args: list[str]) -> None:
    if "--epoch" not in args:
        args = [*args, "--epoch", "1"]
    tail = [] if field == "argv" else ["--", PY, "-c", "pass"]
    code, out = wrapper("launch", "--workdir", str(work), *args, *tail)
    assert code == 2 and field in out["error"], out
    assert not (work / "attempts").exists() or list((work / "attempts").iterdir()) == []


def test_status_and_logs_refuse_bad_or_unknown_attempts(work: Path) -> None:
    code, out = wrapper("status", "--workdir", str(work), "--attempt", "../../etc")
    assert code == 2 and "attempt" in out["error"]
    code, out = wrapper("logs", "--workdir", str(work), "--attempt", "nope")
    assert code == 4 and "nope" in out["error"]
    code, out = wrapper("status", "--workdir", str(work))
    assert code == 0 and out == {"epoch": 0, "attempts": []}


def test_argv_with_shell_metacharacters_is_passed_literally(work: Path, tmp_path: Path) -> None:
    evil = [f"$(touch {tmp_path}/pwned); rm -rf {tmp_path}/x", f"`touch {tmp_path}/pwned2`", "a b;|&*", "'\""]
    launch(work, "a1", PY, "-c", "import sys\nfor a in sys.argv[1:]: print(a)", *evil)
    wait_until(lambda: exited(work, "a1"), "the job's exit")
    assert node.logs(work, "a1")["log"].splitlines() == evil
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_logs_tail(work: Path) -> None:
    launch(work, "a1", PY, "-c", "for i in range(2000): print(f'line {i}')")
    wait_until(lambda: exited(work, "a1"), "the job's exit")
    code, out = wrapper("logs", "--workdir", str(work), "--attempt", "a1", "--tail", "100")
    assert code == 0 and len(out["log"]) <= 100 and out["log"].endswith("line 1999\n")
    assert node.logs(work, "a1", tail=10**7)["log"].startswith("line 0\n")


def test_killed_monitor_means_lost_and_killed_child_is_recorded(work: Path) -> None:
    launch(work, "a1", PY, "-c", SLEEPER)
    launch(work, "a2", PY, "-c", SLEEPER)
    monitor = read_json(work / "attempts" / "a1" / "monitor.json")
    assert monitor is not None
    os.kill(monitor["pid"], signal.SIGKILL)
    wait_until(lambda: not is_alive(monitor["pid"], monitor["start"]), "the monitor to die")
    assert state_of(work, "a1")["state"] == "running"  # the job itself still runs
    os.killpg(state_of(work, "a1")["pid"], signal.SIGKILL)
    st = wait_until(lambda: state_of(work, "a1")["state"] == "lost" and state_of(work, "a1"), "lost")
    assert st["exit"] is None
    os.killpg(state_of(work, "a2")["pid"], signal.SIGKILL)
    st2 = wait_until(lambda: exited(work, "a2"), "the monitor to record the kill")
    assert st2["exit"]["signal"] == signal.SIGKILL
    assert node.forget(work, "a1") == {"attempt": "a1", "forgotten": True}
    assert not (work / "attempts" / "a1").exists()


def test_forget_refuses_a_running_attempt(work: Path) -> None:
    launch(work, "a1", PY, "-c", SLEEPER)
    code, out = wrapper("forget", "--workdir", str(work), "--attempt", "a1")
    assert code == 5 and "running" in out["error"]
    node.stop(work, "a1", 1, grace=5)
    code, out = wrapper("forget", "--workdir", str(work), "--attempt", "a1")
    assert code == 0 and out["forgotten"] is True
    code, _ = wrapper("forget", "--workdir", str(work), "--attempt", "a1")
    assert code == 4


def test_a_missing_executable_fails_the_launch(work: Path) -> None:
    code, out = launch(work, "a1", str(work / "no-such-program"))
    assert code == 1 and "no-such-program" in out["error"]
    st = state_of(work, "a1")
    assert st["state"] == "exited" and st["exit"]["code"] == 127


def test_failing_job_fails_in_run_mode_and_profiles_in_profile_mode(work: Path) -> None:
    node.launch(work, "run1", "j1", 1, [PY, str(FAIL), "--only-run"])
    node.launch(work, "prof1", "j1", 1, [PY, str(FAIL), "--only-run"], mode="profile", profile_iters=5)
    run = wait_until(lambda: exited(work, "run1"), "the failing run")
    prof = wait_until(lambda: exited(work, "prof1"), "the profiling run")
    assert run["exit"]["code"] == 1 and log_has(work, "run1", "simulated failure")
    assert prof["exit"]["code"] == 0 and prof["profile"]["iterations"] == 5


OWN_CHECKPOINT = (
    "import signal, sys, time\n"
    "def save(signum, frame):\n"
    "    open('own.ckpt', 'w').write(signal.Signals(signum).name)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, save)\n"
    "signal.signal(signal.SIGUSR2, save)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGUSR2"])
def test_a_script_without_the_runtime_gets_its_own_checkpoint_signal(work: Path, name: str) -> None:
    """`--checkpoint-signal`: the wrapper sends the job's own signal; SIGUSR1 reaches a job started
    with it unblocked, and the job saves and exits 0 within the grace period."""
    opts = ("--cwd", str(work.parent), "--sigusr1-unblocked")
    code, started = launch(work, "a1", PY, "-c", OWN_CHECKPOINT, opts=opts)
    assert code == 0, started
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to install its handlers")
    code, st = wrapper(
        "checkpoint", "--workdir", str(work), "--attempt", "a1", "--epoch", "1",
        "--signal", name, "--wait", "20", "--grace", "1",
    )  # fmt: skip
    assert code == 0, st
    assert st["exit"]["code"] == 0 and st["exit"]["signal"] is None
    assert (work.parent / "own.ckpt").read_text() == name


def test_a_checkpoint_signal_outside_the_list_is_refused(work: Path) -> None:
    launch(work, "a1", PY, "-c", OWN_CHECKPOINT)
    wait_until(lambda: log_has(work, "a1", "ready"), "the job to install its handlers")
    code, st = wrapper(
        "checkpoint", "--workdir", str(work), "--attempt", "a1", "--epoch", "1", "--signal", "SIGKILL"
    )
    assert code == 2 and "SIGKILL" in st["error"] and "SIGUSR1" in st["error"]
    node.stop(work, "a1", 1, grace=0.2)
