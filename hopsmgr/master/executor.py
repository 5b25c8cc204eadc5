"""How the master acts on nodes: the `Executor` interface and the local executor.

An executor runs the on-node job wrapper (hopsmgr.node.wrapper) for one node: launch an attempt,
checkpoint-and-stop it, stop it, read its log. Every command carries the attempt id (the wrapper makes it
idempotent) and the master's epoch (the wrapper refuses older epochs). The local executor runs the
wrapper as a subprocess on this machine, in the node's work directory; the SSH executor (node-side work)
runs the very same commands over SSH. Results come back as `ExitInfo`; failures raise `ExecutorError`
with a classification the master records in the job's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hopsmgr.master import faults


class ExecutorError(RuntimeError):
    """A command did not do what it should: `kind` is unreachable | auth | hostkey | refused | failed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeTarget:
    node: str
    workdir: str
    host: str = "localhost"


@dataclass(frozen=True, slots=True)
class LaunchOrder:
    attempt: str
    job: str
    epoch: int
    argv: Sequence[str]
    mode: str = "run"  # "run" | "profile"
    gpus: int = 1
    visible_devices: Sequence[int] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    checkpoint_dir: str = ""
    profile_iters: int = 20
    emulated_speed: float | None = None
    run_as: str = ""  # the Unix account the job runs as ("": the wrapper's own)
    mem_mb: int | None = None
    cpus: float | None = None
    block_sigusr1: bool = True  # False: a job without the runtime that saves its checkpoint on SIGUSR1


@dataclass(frozen=True, slots=True)
class ExitInfo:
    code: int | None
    signal: int | None = None
    checkpointed: bool = False


class Executor(Protocol):
    name: str

    async def launch(self, target: NodeTarget, order: LaunchOrder) -> None: ...

    async def checkpoint(
        self,
        target: NodeTarget,
        attempt: str,
        epoch: int,
        wait_s: float,
        grace_s: float,
        signal_name: str = "SIGUSR1",
    ) -> ExitInfo | None: ...

    async def stop(self, target: NodeTarget, attempt: str, epoch: int, grace_s: float) -> ExitInfo | None: ...

    async def logs(self, target: NodeTarget, attempt: str, tail: int) -> str: ...

    async def close(self) -> None: ...


def wrapper_args(command: str, target: NodeTarget, attempt: str, epoch: int | None = None) -> list[str]:
    args = [command, "--workdir", target.workdir, "--attempt", attempt]
    if epoch is not None:
        args += ["--epoch", str(epoch)]
    return args


def signal_args(signal_name: str) -> list[str]:
    """`--signal NAME` for the wrapper's checkpoint, left out for its default SIGUSR1 (so a node whose
    wrapper predates the option still takes every checkpoint of a job that uses the runtime)."""
    return [] if signal_name == "SIGUSR1" else ["--signal", signal_name]


def launch_args(target: NodeTarget, order: LaunchOrder) -> list[str]:
    args = wrapper_args("launch", target, order.attempt, order.epoch)
    args += ["--job", order.job, "--mode", order.mode, "--gpus", str(order.gpus)]
    args += ["--profile-iters", str(order.profile_iters)]
    if order.visible_devices:
        args += ["--visible-devices", ",".join(str(d) for d in order.visible_devices)]
    if order.checkpoint_dir:
        args += ["--checkpoint-dir", order.checkpoint_dir]
    if order.cwd:
        args += ["--cwd", order.cwd]
    if order.emulated_speed is not None:
        args += ["--emulated-speed", repr(order.emulated_speed)]
    if order.run_as:
        args += ["--run-as", order.run_as]
    if order.mem_mb is not None:
        args += ["--mem-mb", str(order.mem_mb)]
    if order.cpus is not None:
        args += ["--cpus", repr(order.cpus)]
    if not order.block_sigusr1:
        args += ["--sigusr1-unblocked"]
    for key, value in sorted(order.env.items()):
        args += ["--env", f"{key}={value}"]
    return [*args, "--", *order.argv]


def exit_info(reply: Mapping[str, Any]) -> ExitInfo | None:
    """The exit record in a wrapper reply (`status`-shaped or with an `exit` key), if the attempt ended."""
    record = reply.get("exit")
    if record is None and isinstance(reply.get("attempts"), list) and reply["attempts"]:
        record = reply["attempts"][0].get("exit")
    if not isinstance(record, Mapping):
        return None
    return ExitInfo(record.get("code"), record.get("signal"), bool(record.get("checkpointed", False)))


class LocalExecutor:
    """Runs the job wrapper as a subprocess on this machine (every node's work directory is local)."""

    name = "local"

    def __init__(self, python: str = sys.executable, timeout_s: float = 60.0) -> None:
        self.python = python
        self.timeout_s = timeout_s

    async def _wrapper(self, args: list[str], timeout_s: float | None = None) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "hopsmgr.node.wrapper",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            faults.point(f"{args[0]}.in_command")  # test-only crash hook (hopsmgr.master.faults)
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s or self.timeout_s)
        except asyncio.TimeoutError:
            await _reap(proc)
            raise ExecutorError(
                "failed", f"wrapper {args[0]} timed out after {timeout_s or self.timeout_s:.0f} s"
            ) from None
        except BaseException:
            # Cancelled (the master stopping): the wrapper may be midway through a launch or a stop (of
            # a cancelled job, say): let it finish, for a while, then reap it, so that no child or pipe
            # outlives the event loop.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(proc.wait()), CANCELLED_GRACE_S)
            await _reap(proc)
            raise
        try:
            reply = json.loads(out.decode() or "{}")
        except json.JSONDecodeError:
            reply = {"error": (out + err).decode(errors="replace")[-500:]}
        if proc.returncode != 0:
            kind = "refused" if proc.returncode == 3 else "failed"
            message = reply.get("error") if isinstance(reply, dict) else None
            raise ExecutorError(
                kind, str(message or err.decode(errors="replace")[-500:] or f"exit {proc.returncode}")
            )
        return reply if isinstance(reply, dict) else {}

    async def launch(self, target: NodeTarget, order: LaunchOrder) -> None:
        await self._wrapper(launch_args(target, order))

    async def checkpoint(
        self,
        target: NodeTarget,
        attempt: str,
        epoch: int,
        wait_s: float,
        grace_s: float,
        signal_name: str = "SIGUSR1",
    ) -> ExitInfo | None:
        args = [
            *wrapper_args("checkpoint", target, attempt, epoch),
            "--wait",
            str(wait_s),
            "--grace",
            str(grace_s),
            *signal_args(signal_name),
        ]
        return exit_info(await self._wrapper(args, wait_s + grace_s + 30))

    async def stop(self, target: NodeTarget, attempt: str, epoch: int, grace_s: float) -> ExitInfo | None:
        args = [*wrapper_args("stop", target, attempt, epoch), "--grace", str(grace_s)]
        return exit_info(await self._wrapper(args, grace_s + 30))

    async def logs(self, target: NodeTarget, attempt: str, tail: int) -> str:
        reply = await self._wrapper([*wrapper_args("logs", target, attempt), "--tail", str(tail)])
        return str(reply.get("log", ""))

    async def close(self) -> None:
        return None


CANCELLED_GRACE_S = 15.0


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill a wrapper still running and wait for it (shielded: a second cancel leaves the wait running)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(BaseException):
        await asyncio.shield(proc.wait())
