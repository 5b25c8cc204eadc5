"""The per-attempt monitor: a detached process that starts the job, waits for it and records its exit.

`launch` spawns `python -m hopsmgr.node.wrapper _monitor ...` in a new session; the monitor forks once
more (so it is nobody's child to reap), records itself in `monitor.json`, starts the job's argv in a
new session with stdout and stderr appended to `log`, writes `child.json` and `pid`, waits, kills what
is left of the job's process group, and writes `exit.json`. The job starts with SIGUSR1 blocked, so
processes that do not use hopsmgr.runtime ignore checkpoint requests instead of dying from them; the
runtime takes the signal with `sigwait`.

An attempt that runs as another Unix account (`layout.Attempt.isolated`) is started through the
privileged step (hopsmgr.node.runas start), which becomes the job; the monitor's own messages then go
to `monitor.log`, and what is left of the job when its leader exits is killed through the same step
(its cgroup). A job without the runtime whose checkpoint signal is SIGUSR1
(`block_sigusr1` false in its spec) starts with it unblocked, for its own handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from hopsmgr.node import runas
from hopsmgr.node.layout import Attempt, process_record
from hopsmgr.nodecontract import ENV_PREFIX, EXIT_CHECKPOINTED
from hopsmgr.runtime.files import atomic_write_bytes, atomic_write_json, read_json


def exit_record(returncode: int | None, error: str | None = None) -> dict[str, Any]:
    code = returncode if returncode is not None and returncode >= 0 else None
    sig = -returncode if returncode is not None and returncode < 0 else None
    rec: dict[str, Any] = {
        "code": code,
        "signal": sig,
        "ended": time.time(),
        "checkpointed": code == EXIT_CHECKPOINTED,
    }
    if error is not None:
        rec["error"] = error
    return rec


def child_env(overlay: dict[str, str]) -> dict[str, str]:
    """The inherited environment without stale HOPS_* variables, plus the attempt's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(overlay)
    return env


def _start(a: Attempt, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    how = signal.SIG_BLOCK if spec.get("block_sigusr1", True) else signal.SIG_UNBLOCK
    blocked = signal.pthread_sigmask(how, {signal.SIGUSR1})
    try:
        if a.isolated:
            with open(a.monitor_log, "ab") as log:
                return subprocess.Popen(
                    [*runas.command(), "start", "--workdir", str(a.workdir), "--attempt", a.attempt_id],
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    close_fds=True,
                )
        with open(a.log, "ab") as log:
            return subprocess.Popen(
                [str(x) for x in spec["argv"]],
                cwd=spec["cwd"],
                env=child_env(dict(spec.get("env") or {})),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _wait(a: Attempt, child: subprocess.Popen[bytes]) -> int:
    """Wait for the job; kill the rest of its process group (an isolated attempt's: its cgroup) while
    the leader's pid is still held."""
    if hasattr(os, "waitid"):
        while True:
            try:
                os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
        if a.isolated:
            runas.call(a, "signal", "--signal", "KILL")
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
    return child.wait()


def _refusal(a: Attempt) -> str | None:
    """The privileged step's refusal of an isolated attempt, from the monitor's log."""
    try:
        lines = a.monitor_log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line for line in lines if line.startswith("hopsmgr-runas: refused:")]
    return found[-1] if found else None


def run_monitor(workdir: Path, attempt_id: str) -> int:
    """Body of the `_monitor` command; returns at once in the first process (see module doc)."""
    a = Attempt(Path(workdir), attempt_id)
    if os.fork() != 0:
        os._exit(0)
    atomic_write_json(a.monitor, process_record(os.getpid()))
    spec = read_json(a.spec)
    if not isinstance(spec, dict) or not spec.get("argv"):
        atomic_write_json(a.exit, exit_record(127, f"attempt {attempt_id}: spec.json is missing or invalid"))
        return 0
    try:
        child = _start(a, spec)
    except OSError as exc:
        msg = f"cannot start {spec['argv'][0]!r}: {exc.strerror or exc}"
        with contextlib.suppress(OSError), open(a.monitor_log if a.isolated else a.log, "ab") as log:
            log.write(f"hopsmgr: {msg}\n".encode())
        code = 126 if isinstance(exc, PermissionError) else 127
        atomic_write_json(a.exit, exit_record(code, msg))
        return 0
    atomic_write_json(a.child, process_record(child.pid))
    atomic_write_bytes(a.pid, f"{child.pid}\n".encode("ascii"))
    returncode = _wait(a, child)
    refused = _refusal(a) if a.isolated and returncode == runas.REFUSED else None
    atomic_write_json(a.exit, exit_record(returncode, refused))
    return 0
