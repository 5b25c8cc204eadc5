"""How the SSH side's failures become `ExecutorError` kinds: `classify` maps an exception raised while
connecting to or talking with a node (asyncssh, OS, timeout) to unreachable / auth / hostkey / failed,
`sftp_error` does the same for SFTP sessions, and `parse_reply` reads the wrapper's JSON reply and exit
status (refused on exit 3, failed otherwise). Used by the SSH executor (hopsmgr.master.ssh) and the
host-key scans (hopsmgr.master.known_hosts); hopsmgr.master.ssh's docstring lists the kinds.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncssh

from hopsmgr.master.executor import ExecutorError


def classify(exc: BaseException, where: str) -> ExecutorError:
    """The `ExecutorError` for an exception raised while connecting to or talking with a node."""
    if isinstance(exc, ExecutorError):
        return exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return ExecutorError("hostkey", f"{where}: host key not verified ({exc.reason})")
    if isinstance(exc, asyncssh.PermissionDenied):
        return ExecutorError("auth", f"{where}: key refused ({exc.reason})")
    if isinstance(exc, asyncio.TimeoutError):  # before OSError: TimeoutError is one
        return ExecutorError("unreachable", f"{where}: timed out")
    if isinstance(exc, asyncssh.DisconnectError):
        return ExecutorError("unreachable", f"{where}: disconnected ({exc.reason})")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return ExecutorError("unreachable", f"{where}: channel refused ({exc.reason})")
    if isinstance(exc, OSError):
        return ExecutorError("unreachable", f"{where}: {exc.strerror or exc}")
    return ExecutorError("failed", f"{where}: {type(exc).__name__}: {exc}")


def sftp_error(exc: BaseException, where: str) -> ExecutorError:
    """`classify`, except that a lost SFTP session is "unreachable" and other SFTP errors "failed"."""
    if isinstance(exc, (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection)):
        return ExecutorError("unreachable", f"{where}: connection lost ({exc.reason})")
    if isinstance(exc, asyncssh.SFTPError):
        return ExecutorError("failed", f"{where}: {exc.reason}")
    return classify(exc, where)


def parse_reply(
    exit_status: int | None, stdout: str, stderr: str, exit_signal: str | None = None
) -> dict[str, Any]:
    """The wrapper's JSON reply, or the ExecutorError its exit status means (as LocalExecutor reads it)."""
    try:
        reply = json.loads(stdout or "{}")
    except json.JSONDecodeError:
        reply = {"error": (stdout + stderr)[-500:]}
    if exit_status != 0:
        kind = "refused" if exit_status == 3 else "failed"
        message = reply.get("error") if isinstance(reply, dict) else None
        if exit_status is None or exit_signal:
            message = message or f"no exit status (signal {exit_signal or '?'})"
        raise ExecutorError(kind, str(message or stderr[-500:] or f"exit {exit_status}"))
    return reply if isinstance(reply, dict) else {}
