"""Node-side attempt operations: launch, checkpoint, stop, status, logs, forget.

Each returns a JSON-ready dict or raises a `WrapperError` (BadRequest, StaleEpoch, UnknownAttempt,
Conflict) whose `exit_code` the command line uses. An in-process agent calls these directly.

`launch --run-as ACCOUNT` makes an isolated attempt: its spec (0600) and directory (0711) stay the
wrapper's, the job runs as ACCOUNT through the privileged step (hopsmgr.node.runas), which the
signals of checkpoint and stop, and forget, go through as well.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hopsmgr import nodecontract as nc
from hopsmgr.node import cgroup, runas
from hopsmgr.node.layout import (
    RUN_AS_FILE,
    Attempt,
    BadRequest,
    Conflict,
    UnknownAttempt,
    WrapperError,
    attempts_dir,
    fence,
    is_alive,
    read_epoch,
    read_pid,
    record_alive,
    validate_id,
)
from hopsmgr.runtime.files import atomic_write_bytes, atomic_write_json, read_json

START_TIMEOUT_S = 10.0
KILL_WAIT_S = 10.0
POLL_S = 0.05
DEFAULT_TAIL = 64 * 1024
DEFAULT_STOP_GRACE_S = 10.0
DEFAULT_CHECKPOINT_GRACE_S = 5.0
MODES = ("run", "profile")
CHECKPOINT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")  # as hopsmgr.protocol's
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICES = re.compile(r"^[A-Za-z0-9:_-]+(,[A-Za-z0-9:_-]+)*$")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def _attempt(workdir: Path | str, attempt_id: str) -> Attempt:
    return Attempt(Path(workdir).absolute(), validate_id("attempt", attempt_id))


def _existing(workdir: Path | str, attempt_id: str) -> Attempt:
    a = _attempt(workdir, attempt_id)
    if not a.dir.is_dir():
        raise UnknownAttempt(f"attempt {attempt_id!r} is not known in {a.workdir}")
    return a


def attempt_status(a: Attempt) -> dict[str, Any]:
    """One attempt's record: state running | exited | lost, pid, progress, profile and exit records."""
    spec = read_json(a.spec)
    spec = spec if isinstance(spec, dict) else {}
    pid = read_pid(a.pid)
    child_pid, child_alive = record_alive(a.child)
    if child_pid is None and pid is not None:
        child_alive = is_alive(pid)
    monitor_pid, monitor_alive = record_alive(a.monitor)
    exit_rec = read_json(a.exit)  # read after the liveness checks: a monitor writes it before exiting
    created = spec.get("created")
    young = isinstance(created, (int, float)) and time.time() - created < START_TIMEOUT_S + 5
    if isinstance(exit_rec, dict):
        state = "exited"
    elif child_alive or monitor_alive or (monitor_pid is None and pid is None and young):
        state = "running"
    else:
        state = "lost"
    return {
        "attempt": a.attempt_id,
        "job": spec.get("job"),
        "epoch": spec.get("epoch"),
        "mode": spec.get("mode"),
        "created": created,
        "state": state,
        "pid": pid,
        "checkpoint_requested": a.request.exists(),
        "progress": _dict_or_none(read_json(a.file(nc.PROGRESS_FILE))),
        "profile": _dict_or_none(read_json(a.file(nc.PROFILE_FILE))),
        "exit": exit_rec if isinstance(exit_rec, dict) else None,
    }


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def status(workdir: Path | str, attempt: str | None = None) -> dict[str, Any]:
    """{"epoch": node epoch, "attempts": [...]} for one attempt or all of them (sorted by id)."""
    workdir = Path(workdir).absolute()
    if attempt is not None:
        records = [attempt_status(_existing(workdir, attempt))]
    else:
        try:
            names = sorted(p.name for p in attempts_dir(workdir).iterdir() if p.is_dir())
        except FileNotFoundError:
            names = []
        records = [attempt_status(Attempt(workdir, n)) for n in names if not n.startswith(".")]
    return {"epoch": read_epoch(workdir), "attempts": records}


# --- launch ----------------------------------------------------------------------------------------
def _child_overlay(
    a: Attempt,
    job: str,
    mode: str,
    gpus: int,
    checkpoint_dir: Path,
    visible_devices: str | None,
    profile_iters: int,
    emulated_speed: float | None,
    env: Mapping[str, str],
) -> dict[str, str]:
    overlay = {
        **env,  # the user's first: what hopsmgr sets below wins
        nc.JOB_ID: job,
        nc.ATTEMPT_ID: a.attempt_id,
        nc.ATTEMPT_DIR: str(a.dir),
        nc.CHECKPOINT_DIR: str(checkpoint_dir),
        nc.MODE: mode,
        nc.GPUS: str(gpus),
        nc.PROFILE_ITERS: str(profile_iters),
    }
    if emulated_speed is not None:
        overlay[nc.EMULATED_SPEED] = repr(float(emulated_speed))
    if visible_devices is not None:
        overlay[nc.VISIBLE_DEVICES] = visible_devices
        overlay[nc.DEVICE_ORDER] = nc.DEVICE_ORDER_VALUE
    return overlay


_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def _check_isolation(run_as: str | None, mem_mb: int | None, cpus: float | None) -> None:
    """Refuse, before anything is made, an account the privileged step would refuse, and limits
    without isolation (only the privileged step makes cgroups)."""
    if not run_as:
        if mem_mb is not None or cpus is not None:
            raise BadRequest("mem-mb and cpus need --run-as (limits are enforced in the attempt's cgroup)")
        return
    if not _ACCOUNT.match(run_as):
        raise BadRequest(f"run-as {run_as!r} is not a Unix account name")
    if mem_mb is not None and (isinstance(mem_mb, bool) or not isinstance(mem_mb, int) or mem_mb < 1):
        raise BadRequest(f"mem-mb {mem_mb!r} must be an integer >= 1")
    if cpus is not None and not (math.isfinite(cpus) and cpus > 0):
        raise BadRequest(f"cpus {cpus!r} must be a positive number")
    try:
        policy = runas.load_policy()
    except runas.Refused:
        policy = runas.Policy()  # unreadable here: the privileged step reads it
    try:
        runas.check_account(run_as, policy)
    except runas.Refused as exc:
        raise BadRequest(f"run-as: {exc}") from None
    try:
        if mem_mb is not None or cpus is not None:
            cgroup.check_controllers(mem_mb, cpus)
    except cgroup.CgroupError as exc:
        raise BadRequest(str(exc)) from None


def _check_launch_args(
    argv: Sequence[str],
    mode: str,
    gpus: int | None,
    visible_devices: str | None,
    env: Mapping[str, str],
    profile_iters: int,
    emulated_speed: float | None,
) -> None:
    if not argv or not all(isinstance(x, str) and "\0" not in x for x in argv):
        raise BadRequest("argv must be a non-empty list of strings without NUL bytes (after '--')")
    if mode not in MODES:
        raise BadRequest(f"mode {mode!r} must be one of {', '.join(MODES)}")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise BadRequest(f"gpus {gpus!r} must be an integer >= 1")
    if visible_devices is not None and not _DEVICES.match(visible_devices):
        raise BadRequest(f"visible-devices {visible_devices!r} must be comma-separated device ids")
    for key, value in env.items():
        if not _ENV_NAME.match(key) or "\0" in value:
            raise BadRequest(f"env {key!r} is not a valid variable name (or its value holds NUL)")
    if isinstance(profile_iters, bool) or not isinstance(profile_iters, int) or profile_iters < 1:
        raise BadRequest(f"profile-iters {profile_iters!r} must be an integer >= 1")
    if emulated_speed is not None and not (math.isfinite(emulated_speed) and emulated_speed > 0):
        raise BadRequest(f"emulated-speed {emulated_speed!r} must be a positive number")


def launch(
    workdir: Path | str,
    attempt: str,
    job: str,
    epoch: int,
    argv: Sequence[str],
    *,
    mode: str = "run",
    gpus: int | None = None,
    visible_devices: str | None = None,
    checkpoint_dir: Path | str | None = None,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    profile_iters: int = 20,
    emulated_speed: float | None = None,
    start_timeout: float = START_TIMEOUT_S,
    run_as: str | None = None,
    mem_mb: int | None = None,
    cpus: float | None = None,
    block_sigusr1: bool = True,
) -> dict[str, Any]:
    """Start `argv` as attempt `attempt` of `job` under a detached monitor; idempotent per attempt id.

    Returns the attempt's status with "already": True when the attempt existed (nothing started).
    """
    a = _attempt(workdir, attempt)
    validate_id("job", job)
    env = dict(env or {})
    _check_launch_args(argv, mode, gpus, visible_devices, env, profile_iters, emulated_speed)
    _check_isolation(run_as, mem_mb, cpus)
    work_cwd = Path(cwd).absolute() if cwd is not None else a.dir
    if cwd is not None and not work_cwd.is_dir():
        raise BadRequest(f"cwd {str(cwd)!r} is not a directory")
    fence(a.workdir, epoch)
    if a.dir.exists():
        return {**attempt_status(a), "already": True}
    ckpt_dir = Path(checkpoint_dir).absolute() if checkpoint_dir else a.workdir / "checkpoints" / job
    if gpus is None:
        gpus = len(visible_devices.split(",")) if visible_devices else 1
    overlay = _child_overlay(
        a, job, mode, gpus, ckpt_dir, visible_devices, profile_iters, emulated_speed, env
    )
    spec = {
        "attempt": attempt,
        "job": job,
        "epoch": epoch,
        "mode": mode,
        "argv": list(argv),
        "env": overlay,
        "cwd": str(work_cwd),
        "created": time.time(),
        "block_sigusr1": bool(block_sigusr1),
    }
    if run_as:
        spec.update(run_as=run_as, mem_mb=mem_mb, cpus=cpus)
    attempts_dir(a.workdir).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{attempt}.", dir=attempts_dir(a.workdir)))
    try:
        atomic_write_json(staging / "spec.json", spec)  # 0600: the env may hold the job's secrets
        if run_as:
            atomic_write_bytes(staging / RUN_AS_FILE, run_as.encode() + b"\n")
            os.chmod(staging, 0o711)  # the job reaches its job/ directory, nothing else in here
        os.rename(staging, a.dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if a.dir.exists():  # a concurrent launch of the same attempt won
            return {**attempt_status(a), "already": True}
        raise
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if run_as:
        for d in (a.workdir, attempts_dir(a.workdir), a.workdir / "checkpoints"):
            if d.stat().st_uid == os.geteuid():  # traversable, not listable, by the job
                os.chmod(d, 0o711)
    _spawn_monitor(a, start_timeout)
    return {**_wait_started(a, start_timeout), "already": False}


def _spawn_monitor(a: Attempt, timeout: float) -> None:
    cmd = [sys.executable, "-m", "hopsmgr.node.wrapper", "_monitor"]
    cmd += ["--workdir", str(a.workdir), "--attempt", a.attempt_id]
    with open(a.monitor_log if a.isolated else a.log, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=_PACKAGE_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    try:
        rc = proc.wait(timeout)  # the monitor forks and this first process returns at once
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise WrapperError(f"attempt {a.attempt_id}: the monitor did not start within {timeout}s") from None
    if rc != 0:
        raise WrapperError(f"attempt {a.attempt_id}: the monitor failed with code {rc}; see its log")


def _wait_started(a: Attempt, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if read_pid(a.pid) is not None:
            return attempt_status(a)
        exit_rec = read_json(a.exit)
        if isinstance(exit_rec, dict):
            reason = exit_rec.get("error") or "it exited before starting"
            raise WrapperError(f"attempt {a.attempt_id}: {reason}")
        if time.monotonic() >= deadline:
            raise WrapperError(f"attempt {a.attempt_id}: the job did not start within {timeout}s")
        time.sleep(POLL_S)


# --- checkpoint, stop ------------------------------------------------------------------------------
def _await_pid(a: Attempt) -> bool:
    """Wait (launch in progress) until the job's pid is known; False if the attempt stopped running."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while read_pid(a.pid) is None:
        if attempt_status(a)["state"] != "running" or time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _signal_group(a: Attempt, sig: signal.Signals) -> None:
    if a.isolated:  # the job is another account's: through the privileged step, to its whole cgroup
        error = runas.call(a, "signal", "--signal", sig.name.removeprefix("SIG"))
        if error:
            raise WrapperError(f"attempt {a.attempt_id}: cannot signal it: {error}")
        return
    pid, alive = record_alive(a.child)
    if pid is not None and alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _wait_exit(a: Attempt, timeout: float) -> bool:
    """Poll until the attempt is no longer running; whether it stopped within `timeout`."""
    deadline = time.monotonic() + max(timeout, 0.0)
    while attempt_status(a)["state"] == "running":
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _terminate(a: Attempt, grace: float) -> None:
    _signal_group(a, signal.SIGTERM)
    if _wait_exit(a, grace):
        return
    _signal_group(a, signal.SIGKILL)
    if not _wait_exit(a, KILL_WAIT_S):
        raise WrapperError(f"attempt {a.attempt_id}: still running {KILL_WAIT_S}s after SIGKILL")


def _check_grace(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise BadRequest(f"{name} {value!r} must be a number of seconds >= 0")


def checkpoint(
    workdir: Path | str,
    attempt: str,
    epoch: int,
    *,
    wait: float | None = None,
    grace: float = DEFAULT_CHECKPOINT_GRACE_S,
    signal_name: str = "SIGUSR1",
) -> dict[str, Any]:
    """Ask the job to checkpoint and exit (request file + `signal_name`, SIGUSR1 by default, to its
    group: a job without the runtime may save its own checkpoint on another signal).

    With `wait`, wait that long for the exit, then SIGTERM, then after `grace` SIGKILL.
    """
    _check_grace("wait", wait)
    _check_grace("grace", grace)
    if signal_name not in CHECKPOINT_SIGNALS:
        raise BadRequest(f"signal {signal_name!r} must be one of {', '.join(CHECKPOINT_SIGNALS)}")
    a = _attempt(workdir, attempt)
    fence(a.workdir, epoch)
    a = _existing(workdir, attempt)
    if attempt_status(a)["state"] != "running":
        return attempt_status(a)
    a.request.touch()
    if _await_pid(a):
        _signal_group(a, signal.Signals[signal_name])
    if wait is not None and not _wait_exit(a, wait):
        _terminate(a, grace)
    return attempt_status(a)


def stop(
    workdir: Path | str, attempt: str, epoch: int, *, grace: float = DEFAULT_STOP_GRACE_S
) -> dict[str, Any]:
    """SIGTERM the job's process group, SIGKILL it after `grace` seconds, and wait for its exit record."""
    _check_grace("grace", grace)
    a = _attempt(workdir, attempt)
    fence(a.workdir, epoch)
    a = _existing(workdir, attempt)
    if attempt_status(a)["state"] != "running":
        return attempt_status(a)
    if _await_pid(a):
        _terminate(a, grace)
    return attempt_status(a)


# --- logs, forget ----------------------------------------------------------------------------------
def logs(workdir: Path | str, attempt: str, tail: int = DEFAULT_TAIL) -> dict[str, Any]:
    """The last `tail` bytes of the attempt's log, decoded as UTF-8 (bad bytes replaced)."""
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 0:
        raise BadRequest(f"tail {tail!r} must be an integer >= 0")
    a = _existing(workdir, attempt)
    data = b""
    path = a.log if a.log.exists() or not a.isolated else a.monitor_log  # refused before it started
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(size - tail, 0))
        data = fh.read(tail)
    return {"attempt": attempt, "log": data.decode("utf-8", errors="replace")}


def forget(workdir: Path | str, attempt: str) -> dict[str, Any]:
    """Remove an attempt's directory; refused (Conflict) while it runs."""
    a = _existing(workdir, attempt)
    if attempt_status(a)["state"] == "running":
        raise Conflict(f"attempt {attempt!r} is running: stop it before forgetting it")
    if a.isolated:
        error = runas.call(a, "cleanup")
        if error:
            raise WrapperError(f"attempt {attempt}: cannot remove its job directory: {error}")
    shutil.rmtree(a.dir)
    return {"attempt": attempt, "forgotten": True}
