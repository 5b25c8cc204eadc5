"""The SSH executor against a real OpenSSH server on 127.0.0.1 (tests/integration/sshd.py); no mocks.

The node is this machine: its work directory lives in the test's tmp dir and the remote python is this
interpreter, so the wrapper run over SSH is the same hopsmgr install. Commands over SSH, the failures and
their kinds, the channel limit and host keys; a real master process using `executor = "ssh"` and the
`nodes add` command: tests/integration/test_ssh_master.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hopsmgr.config import ClusterConfig, parse_cluster_config
from hopsmgr.master.executor import ExecutorError, LaunchOrder, NodeTarget
from hopsmgr.master.known_hosts import add_known_host, fingerprint, scan_host_key
from hopsmgr.master.ssh import SshExecutor
from hopsmgr.node.layout import record_alive
from tests.integration.cluster import EXAMPLE, PYTHON
from tests.integration.sshd import Sshd, free_port, keygen, known_hosts_line

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make_config(
    sshd: Sshd,
    *,
    key: Path | None = None,
    known_hosts: Path | str | None = None,
    port: int | None = None,
    connect_timeout_s: float = 5.0,
    max_channels: int = 8,
    remote_python: str = PYTHON,
) -> ClusterConfig:
    return parse_cluster_config(
        {
            "cluster": {"name": "ssh-test"},
            "servers": [
                {
                    "id": "n1",
                    "gpu_type": "v100",
                    "gpus": 2,
                    "address": "127.0.0.1",
                    "ssh_port": port or sshd.port,
                }
            ],
            "master": {
                "executor": "ssh",
                "ssh_key": str(key or sshd.user_key),
                "known_hosts": str(sshd.known_hosts if known_hosts is None else known_hosts),
                "remote_python": remote_python,
                "ssh_connect_timeout_s": connect_timeout_s,
                "ssh_max_channels": max_channels,
            },
        }
    )


@dataclass
class Node1:
    """The test node: its work directory and the executor's target for it."""

    workdir: Path

    @property
    def target(self) -> NodeTarget:
        return NodeTarget("n1", str(self.workdir))

    def attempts(self) -> list[str]:
        root = self.workdir / "attempts"
        return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node1]:
    yield Node1(tmp_path / "node")
    for child in (tmp_path / "node").glob("attempts/*/child.json"):  # jobs outlive SSH: end any left
        pid, alive = record_alive(child)  # checks the process start time: never a reused pid
        if pid is not None and alive:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def order(attempt: str, argv: list[str], epoch: int = 1) -> LaunchOrder:
    return LaunchOrder(attempt=attempt, job="j-1", epoch=epoch, argv=argv)


def train_argv(iters: int = 100_000) -> list[str]:
    return [PYTHON, EXAMPLE, "--iters", str(iters), "--batch-size", "8", "--step-seconds", "0.02"]


async def until(probe: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last}")


async def record(ex: SshExecutor, node: Node1, attempt: str) -> dict[str, Any]:
    reply = await ex.status(node.target, attempt)
    return dict(reply["attempts"][0])


# -- commands over SSH ------------------------------------------------------------------------------


def test_launch_idempotent_checkpoint_stop_logs(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    async def scenario() -> None:
        ex = SshExecutor(make_config(sshd), tmp_path)
        try:
            await ex.launch(node.target, order("a-1", train_argv()))

            async def progressing() -> dict[str, Any] | None:
                rec = await record(ex, node, "a-1")
                return rec if (rec["progress"] or {}).get("iteration", 0) >= 3 else None

            running = await until(progressing, 20, "a-1 progressing")
            assert running["state"] == "running" and running["pid"]
            await ex.launch(node.target, order("a-1", train_argv()))  # again: nothing new starts
            assert (await record(ex, node, "a-1"))["pid"] == running["pid"]
            assert node.attempts() == ["a-1"]

            info = await ex.checkpoint(node.target, "a-1", 1, wait_s=15, grace_s=5)
            assert info is not None and info.code == 75 and info.checkpointed
            await ex.launch(node.target, order("a-1", train_argv()))  # after the exit: still nothing
            after = await record(ex, node, "a-1")
            assert after["state"] == "exited" and after["pid"] == running["pid"]
            assert after["exit"]["code"] == 75

            await ex.launch(node.target, order("a-2", train_argv()))  # resumes from the checkpoint
            await until(
                lambda: ex.logs(node.target, "a-2", 4096), 20, "a-2 log"
            )  # the job has started writing
            stopped = await ex.stop(node.target, "a-2", 1, grace_s=5)
            assert stopped is not None
            assert (await record(ex, node, "a-2"))["state"] == "exited"
            log = await ex.logs(node.target, "a-2", 4096)
            assert "resumed at iteration" in log
            assert "checkpoint at iteration" in await ex.logs(node.target, "a-1", 4096)
        finally:
            await ex.close()

    run(scenario())


def test_stale_epoch_is_refused(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    async def scenario() -> None:
        ex = SshExecutor(make_config(sshd), tmp_path)
        try:
            await ex.launch(node.target, order("a-5", train_argv(), epoch=5))
            with pytest.raises(ExecutorError) as stop_err:
                await ex.stop(node.target, "a-5", 4, grace_s=1)
            assert stop_err.value.kind == "refused"
            with pytest.raises(ExecutorError) as launch_err:
                await ex.launch(node.target, order("a-4", train_argv(), epoch=4))
            assert launch_err.value.kind == "refused" and "epoch" in launch_err.value.message
            assert node.attempts() == ["a-5"]
            assert (await record(ex, node, "a-5"))["state"] == "running"
            assert await ex.stop(node.target, "a-5", 5, grace_s=5) is not None
        finally:
            await ex.close()

    run(scenario())


def test_shell_metacharacters_arrive_literally(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    canary = tmp_path / "pwned"
    nasty = [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"&& touch {canary} ||",
        f"| tee {canary}",
        f"> {canary}",
        "'single' \"double\" \\back\\slash",
        "$HOME ${PATH} * ? [a-z] ~ # !",
        "two  spaces\ttab\nnewline",
        "",
        "ünïcødé ✓",
        "--",
        "--epoch",
    ]
    script = "import json, os, sys; json.dump([sys.argv[2:], os.environ['NASTY']], open(sys.argv[1], 'w'))"
    env_value = f"$(touch {canary}); `touch {canary}` 'q' \"dq\""

    async def scenario() -> None:
        ex = SshExecutor(make_config(sshd), tmp_path)
        try:
            argv = [PYTHON, "-c", script, str(out), *nasty]
            launch = LaunchOrder(attempt="a-meta", job="j-1", epoch=1, argv=argv, env={"NASTY": env_value})
            await ex.launch(node.target, launch)
            rec = await until(
                lambda: _exited(ex, node, "a-meta"), 20, "a-meta exited"
            )  # a job this short may end before or after launch returns
            assert rec["exit"]["code"] == 0, await ex.logs(node.target, "a-meta", 4096)
        finally:
            await ex.close()

    run(scenario())
    assert json.loads(out.read_text()) == [nasty, env_value]
    assert not canary.exists()


async def _exited(ex: SshExecutor, node: Node1, attempt: str) -> dict[str, Any] | None:
    rec = await record(ex, node, attempt)
    return rec if rec["state"] == "exited" else None


# -- failures and their kinds -------------------------------------------------------------------------


def _kind_of(config: ClusterConfig, node: Node1, state_dir: Path) -> ExecutorError:
    async def scenario() -> ExecutorError:
        ex = SshExecutor(config, state_dir)
        try:
            with pytest.raises(ExecutorError) as err:
                await ex.launch(node.target, order("a-x", train_argv()))
            return err.value
        finally:
            await ex.close()

    return run(scenario())


def test_host_key_mismatch(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_line(sshd.port, other.with_name(other.name + ".pub")))
    error = _kind_of(make_config(sshd, known_hosts=known), node, tmp_path)
    assert error.kind == "hostkey", error
    assert str(known) in error.message
    assert node.attempts() == []  # nothing ran


def test_unknown_host(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    assert _kind_of(make_config(sshd, known_hosts=empty), node, tmp_path).kind == "hostkey"
    # no known_hosts setting and no <state_dir>/known_hosts: nothing is trusted (never "accept any")
    assert _kind_of(make_config(sshd, known_hosts=""), node, tmp_path / "state").kind == "hostkey"
    assert node.attempts() == []


def test_refused_user_key(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    error = _kind_of(make_config(sshd, key=keygen(tmp_path / "stranger")), node, tmp_path)
    assert error.kind == "auth", error
    missing = _kind_of(make_config(sshd, key=tmp_path / "no_such_key"), node, tmp_path)
    assert missing.kind == "auth" and "no_such_key" in missing.message
    assert node.attempts() == []


def test_unreachable(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    t0 = time.monotonic()
    closed = _kind_of(make_config(sshd, port=free_port(), connect_timeout_s=1), node, tmp_path)
    assert closed.kind == "unreachable", closed
    # a port that accepts TCP but never speaks SSH: the connect timeout ends the wait
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        mute = _kind_of(make_config(sshd, port=port, connect_timeout_s=1), node, tmp_path)
        shared = run(_burst_unreachable(make_config(sshd, port=port, connect_timeout_s=1), node, tmp_path))
    assert mute.kind == "unreachable" and "timed out" in mute.message, mute
    errors, failures = shared
    assert [e.kind for e in errors] == ["unreachable"] * 8 and failures == 1  # one wait, shared by all 8
    assert time.monotonic() - t0 < 15  # bounded by the connect timeout, not the TCP default


async def _burst_unreachable(config: ClusterConfig, node: Node1, state_dir: Path) -> tuple[list[Any], int]:
    ex = SshExecutor(config, state_dir)
    try:
        errors = await asyncio.gather(*(ex.status(node.target) for _ in range(8)), return_exceptions=True)
        return [e if isinstance(e, ExecutorError) else None for e in errors], ex._nodes["n1"].failures
    finally:
        await ex.close()


def test_command_timeout_is_unreachable(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    hang = f"{PYTHON} -c 'import time; time.sleep(5)'"  # the wrapper's args follow, ignored

    async def scenario() -> ExecutorError:
        ex = SshExecutor(make_config(sshd, remote_python=hang), tmp_path, timeout_s=1)
        try:
            with pytest.raises(ExecutorError) as err:
                await ex.logs(node.target, "a-1", 100)
            return err.value
        finally:
            await ex.close()

    error = run(scenario())
    assert error.kind == "unreachable" and "timed out" in error.message


SHIM = """\
import os, runpy, sys, time
MARKS = sys.argv[1]
def mark(sign):
    fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, sign)
    os.close(fd)
mark(b"+")
time.sleep(0.2)  # long enough for commands that may overlap to overlap
sys.argv = sys.argv[:1] + sys.argv[4:]  # drop MARKS -m hopsmgr.node.wrapper
try:
    runpy.run_module("hopsmgr.node.wrapper", run_name="__main__")
finally:
    mark(b"-")
"""


def _peak(marks: str) -> int:
    level = peak = 0
    for sign in marks:
        level += 1 if sign == "+" else -1
        peak = max(peak, level)
    return peak


def test_channel_limit_and_reconnect(sshd: Sshd, tmp_path: Path, node: Node1) -> None:
    """20 commands at once over one connection: at most ssh_max_channels of them run at a time on the node.

    A shim in front of the wrapper appends "+" when a command starts and "-" when it ends; the deepest
    nesting is the node-side concurrency. The server allows only 2 sessions (MaxSessions 2), so the
    client's limit must be exact and must ride out sshd freeing closed sessions a little late.
    """
    server = Sshd.start(tmp_path / "sshd2", max_sessions=2)
    shim = tmp_path / "shim.py"
    shim.write_text(SHIM)

    async def burst(on: Sshd, max_channels: int, marks: Path, count: int) -> list[Any]:
        # the shim takes the marks file as its first argument and hands the rest to the wrapper
        python = f"{PYTHON} {shim} {marks}"
        ex = SshExecutor(make_config(on, max_channels=max_channels, remote_python=python), tmp_path)
        try:
            results = await asyncio.gather(
                *(ex.status(node.target) for _ in range(count)), return_exceptions=True
            )
            first = ex._nodes["n1"].conn  # one connection, reused; opened again once closed
            assert first is not None
            first.close()
            await first.wait_closed()
            results.append(await ex.status(node.target))
            assert ex._nodes["n1"].conn is not first
            return results
        finally:
            await ex.close()

    try:
        results = run(burst(server, 2, tmp_path / "limited", 20))
        assert all(isinstance(r, dict) and r["attempts"] == [] for r in results), results
        marks = (tmp_path / "limited").read_text()
        assert len(marks) == 2 * 21 and _peak(marks) <= 2, marks
        assert server.log.count("Accepted publickey") == 2  # one connection, then one reconnect
    finally:
        server.stop()
    # the measure has teeth: a wider limit on a roomier server does run more at once
    results = run(burst(sshd, 6, tmp_path / "wide", 8))
    assert all(isinstance(r, dict) for r in results), results
    assert _peak((tmp_path / "wide").read_text()) > 2


def test_scan_and_add_host_key(sshd: Sshd, node: Node1, tmp_path: Path) -> None:
    line = run(scan_host_key("127.0.0.1", sshd.port))
    assert line.split()[:3] == known_hosts_line(sshd.port, sshd.host_key.with_suffix(".pub")).split()
    keygen_print = subprocess.run(
        ["ssh-keygen", "-lf", str(sshd.host_key.with_suffix(".pub"))], capture_output=True, text=True
    ).stdout
    assert fingerprint(line) in keygen_print
    known = tmp_path / "state" / "known_hosts"
    add_known_host(known, line)
    add_known_host(known, line)  # already there: not repeated
    assert known.read_text() == line + "\n"
    for bad in ("garbage", "[127.0.0.1]:22 ssh-ed25519 not-base64!"):
        with pytest.raises(ValueError):
            add_known_host(tmp_path / "bad_known_hosts", bad)
    assert not (tmp_path / "bad_known_hosts").exists()

    async def scenario() -> dict[str, Any]:
        ex = SshExecutor(make_config(sshd, known_hosts=""), tmp_path / "state")
        try:
            return await ex.status(node.target)
        finally:
            await ex.close()

    assert run(scenario())["attempts"] == []
