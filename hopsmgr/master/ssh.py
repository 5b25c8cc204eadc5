"""The SSH executor: the master runs the on-node job wrapper over SSH (asyncssh).

Each command is `<remote_python> -m hopsmgr.node.wrapper <args>`, built by the same `launch_args` /
`wrapper_args` as the local executor and quoted with `shlex.join`, so a job's argv reaches the node
verbatim through the remote (POSIX) shell. The wrapper makes every command idempotent per attempt id and
refuses stale epochs (exit 3).

One connection per node, opened on first use, reused, and opened again once closed (keepalive notices
a dead peer); at most `ssh_max_channels` commands run at once on it. Authentication is by key only
(`ssh_key`, default ~/.ssh/id_ed25519: no password, no agent, no forwarding, no ~/.ssh/config) and host
keys are always checked against `known_hosts` (default <state_dir>/known_hosts), read again on every
connect. Adding a node's key is an operator's decision: `scan_host_keys` shows them, `add_known_host`
records it once confirmed (both in hopsmgr.master.known_hosts). Failures raise `ExecutorError` with kind
(hopsmgr.master.ssh_errors classifies them):

    unreachable  refused / no route / DNS / connect timeout / connection lost / command timed out
    auth         the node refused the key (or the key file cannot be read)
    hostkey      the node's host key is unknown or differs from known_hosts
    refused      the wrapper refused the command: stale epoch (exit 3)
    failed       the wrapper failed (any other non-zero exit, or no exit status)

`copy_checkpoint` moves a job's newest verified checkpoint between two nodes' work directories over SFTP
through the master (hopsmgr.master.checkpoints describes the convention and the local counterpart); it
raises "failed" when the source holds no verified checkpoint or a file operation fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hashlib
import posixpath
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import asyncssh
import structlog

from hopsmgr.config import ClusterConfig
from hopsmgr.master.checkpoints import (
    CHUNK,
    MAX_SIDECAR,
    Sidecar,
    candidates,
    node_checkpoint_dir,
    parse_sidecar,
    result,
    temp_name,
)
from hopsmgr.master.executor import (
    ExecutorError,
    ExitInfo,
    LaunchOrder,
    NodeTarget,
    exit_info,
    launch_args,
    signal_args,
    wrapper_args,
)
from hopsmgr.master.ssh_errors import classify, parse_reply, sftp_error

log = structlog.get_logger("hopsmgr.master.ssh")

DEFAULT_KEY = Path("~/.ssh/id_ed25519")
KEEPALIVE_COUNT_MAX = 3
OPEN_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # waits between refused channel opens
T = TypeVar("T")


@dataclass
class _Node:
    """One node's connection, the lock that serialises (re)connecting, and its channel limit.

    `failures` counts failed connection attempts and `error` holds the latest: commands that queued
    behind a failing attempt share its error instead of each waiting out the connect timeout again.
    """

    id: str
    channels: asyncio.Semaphore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: asyncssh.SSHClientConnection | None = None
    failures: int = 0
    error: ExecutorError | None = None


class SshExecutor:
    """Runs the job wrapper on each node over one reused SSH connection per node."""

    name = "ssh"

    def __init__(self, config: ClusterConfig, state_dir: Path, timeout_s: float = 60.0) -> None:
        m = config.master
        self.config = config
        self.key_path = Path(m.ssh_key or DEFAULT_KEY).expanduser()
        self.known_hosts = Path(m.known_hosts).expanduser() if m.known_hosts else state_dir / "known_hosts"
        self.python = shlex.split(m.remote_python)
        self.connect_timeout_s = m.ssh_connect_timeout_s
        self.keepalive_s = m.ssh_keepalive_s
        self.max_channels = m.ssh_max_channels
        self.timeout_s = timeout_s
        self._nodes: dict[str, _Node] = {}

    # -- connections ------------------------------------------------------------------------------------

    def _node(self, node_id: str) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _Node(node_id, asyncio.Semaphore(self.max_channels))
        return node

    def _client_key(self, where: str) -> asyncssh.SSHKey:
        try:
            return asyncssh.read_private_key(self.key_path)
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            raise ExecutorError("auth", f"{where}: cannot read ssh_key {self.key_path}: {exc}") from None

    def _trusted_hosts(self) -> asyncssh.SSHKnownHosts:
        """The known_hosts file, parsed; missing means empty (never "accept any key")."""
        try:
            text = self.known_hosts.read_text()
        except FileNotFoundError:
            text = ""
        return asyncssh.import_known_hosts(text)

    async def _connection(self, node: _Node) -> asyncssh.SSHClientConnection:
        failures = node.failures
        async with node.lock:
            if node.conn is not None and not node.conn.is_closed():
                return node.conn
            if node.failures != failures and node.error is not None:
                raise node.error  # the attempt made while this command waited failed just now
            node.conn, node.error = None, None
            access = self.config.node_access(node.id)
            user = access.ssh_user or getpass.getuser()
            where = f"{node.id} ({user}@{access.address}:{access.ssh_port})"
            try:
                node.conn = await asyncssh.connect(
                    access.address,
                    access.ssh_port,
                    username=user,
                    client_keys=[self._client_key(where)],
                    known_hosts=self._trusted_hosts(),
                    config=[],
                    agent_path=None,
                    agent_forwarding=False,
                    preferred_auth="publickey",
                    password_auth=False,
                    kbdint_auth=False,
                    gss_auth=False,
                    host_based_auth=False,
                    connect_timeout=self.connect_timeout_s,
                    login_timeout=self.connect_timeout_s,
                    keepalive_interval=self.keepalive_s,
                    keepalive_count_max=KEEPALIVE_COUNT_MAX,
                )
            except Exception as exc:
                error = classify(exc, where)
                if error.kind == "hostkey":
                    error = ExecutorError(error.kind, f"{error.message}; known_hosts: {self.known_hosts}")
                log.warning("ssh_connect_failed", node=node.id, kind=error.kind, error=error.message)
                node.error, node.failures = error, node.failures + 1
                raise error from None
            log.info("ssh_connected", node=node.id, address=access.address, port=access.ssh_port, user=user)
            return node.conn

    async def _run(
        self, target: NodeTarget, args: list[str], timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Run the wrapper with `args` on the target's node; its JSON reply."""
        node = self._node(target.node)
        command = shlex.join([*self.python, "-m", "hopsmgr.node.wrapper", *args])
        limit = timeout_s or self.timeout_s
        async with node.channels:
            conn = await self._connection(node)
            where = f"{node.id}: wrapper {args[0]}"
            try:
                result = await asyncio.wait_for(_execute(conn, command), limit)
            except asyncio.TimeoutError:
                raise ExecutorError("unreachable", f"{where} timed out after {limit:.0f} s") from None
            except Exception as exc:
                raise classify(exc, where) from None
        signal = result.exit_signal[0] if result.exit_signal else None
        if result.exit_status is None and conn.is_closed():
            raise ExecutorError("unreachable", f"{where}: connection lost")
        return parse_reply(result.exit_status, _text(result.stdout), _text(result.stderr), signal)

    # -- the Executor protocol -------------------------------------------------------------------------

    async def launch(self, target: NodeTarget, order: LaunchOrder) -> None:
        await self._run(target, launch_args(target, order))

    async def checkpoint(
        self,
        target: NodeTarget,
        attempt: str,
        epoch: int,
        wait_s: float,
        grace_s: float,
        signal_name: str = "SIGUSR1",
    ) -> ExitInfo | None:
        args = [*wrapper_args("checkpoint", target, attempt, epoch), "--wait", str(wait_s)]
        args += ["--grace", str(grace_s), *signal_args(signal_name)]
        return exit_info(await self._run(target, args, wait_s + grace_s + 30))

    async def stop(self, target: NodeTarget, attempt: str, epoch: int, grace_s: float) -> ExitInfo | None:
        args = [*wrapper_args("stop", target, attempt, epoch), "--grace", str(grace_s)]
        return exit_info(await self._run(target, args, grace_s + 30))

    async def logs(self, target: NodeTarget, attempt: str, tail: int) -> str:
        reply = await self._run(target, [*wrapper_args("logs", target, attempt), "--tail", str(tail)])
        return str(reply.get("log", ""))

    async def status(self, target: NodeTarget, attempt: str | None = None) -> dict[str, Any]:
        """The wrapper's status reply for one attempt or all (not part of the Executor protocol)."""
        args = ["status", "--workdir", target.workdir, *(["--attempt", attempt] if attempt else [])]
        return await self._run(target, args)

    # -- checkpoint transfer (nodes without a shared filesystem) ----------------------------------------

    async def copy_checkpoint(
        self, src: NodeTarget, dst: NodeTarget, job_id: str, *, spool_dir: str | None = None
    ) -> dict[str, Any]:
        """Copy `job_id`'s newest verified checkpoint from `src`'s work directory to `dst`'s over SFTP.

        Both sides use `<workdir>/checkpoints/<job id>`. Newest first, each checkpoint whose sidecar is
        well formed and whose data file has the sidecar's size is downloaded into a temp file under
        `spool_dir` (default: the system temp dir) while it is hashed; the first whose sha256 matches is
        uploaded to a temp name on `dst`, fsynced, its size checked (stat), renamed into place
        (posix-rename), and its sidecar written the same way last. Nothing on `src` is changed. Returns
        file, iteration, bytes, seconds, mb_per_s, download_s, upload_s, src_dir, dst_dir and skipped
        (newer checkpoints that did not verify). Raises ExecutorError "failed" when no checkpoint
        verifies or a file operation fails, else as the other commands do.
        """
        src_dir = node_checkpoint_dir(src.workdir, job_id)
        dst_dir = node_checkpoint_dir(dst.workdir, job_id)
        started = time.monotonic()
        try:
            spool = tempfile.TemporaryDirectory(prefix=".hops-ckpt-", dir=spool_dir)
        except OSError as exc:
            raise ExecutorError("failed", f"master spool {spool_dir}: {exc.strerror or exc}") from None
        with spool:
            local = Path(spool.name) / "checkpoint"

            async def fetch(sftp: asyncssh.SFTPClient) -> tuple[Sidecar, list[str]]:
                return await self._fetch_verified(sftp, src.node, src_dir, local)

            sidecar, skipped = await self._with_sftp(src, f"checkpoint from {src_dir}", fetch)
            fetched = time.monotonic()

            async def put(sftp: asyncssh.SFTPClient) -> None:
                await self._put_checkpoint(sftp, dst.node, dst_dir, local, sidecar)

            await self._with_sftp(dst, f"checkpoint to {dst_dir}", put)
        done = time.monotonic()
        reply = result(sidecar, src_dir, dst_dir, done - started, skipped)
        reply.update(download_s=fetched - started, upload_s=done - fetched)
        log.info("checkpoint_copied", job_id=job_id, src=src.node, dst=dst.node, **reply)
        return reply

    async def _with_sftp(
        self, target: NodeTarget, what: str, body: Callable[[asyncssh.SFTPClient], Awaitable[T]]
    ) -> T:
        """Run `body` with an SFTP session on the target's node (one of its `ssh_max_channels`)."""
        node = self._node(target.node)
        where = f"{node.id}: {what}"
        async with node.channels:
            conn = await self._connection(node)
            try:
                sftp = await asyncio.wait_for(conn.start_sftp_client(), self.timeout_s)
            except Exception as exc:
                raise sftp_error(exc, f"{where}: sftp session") from None
            try:
                async with sftp:
                    value = await body(sftp)
            except ExecutorError:
                raise
            except Exception as exc:
                raise sftp_error(exc, where) from None
        return value

    async def _io(self, op: Awaitable[T]) -> T:
        """One SFTP request or transfer chunk, bounded by the command timeout (a stall is unreachable)."""
        return await asyncio.wait_for(op, self.timeout_s)

    async def _fetch_verified(
        self, sftp: asyncssh.SFTPClient, node: str, src_dir: str, local: Path
    ) -> tuple[Sidecar, list[str]]:
        """Download the newest checkpoint of `src_dir` that verifies into `local`: its sidecar, and the
        names of newer ones that did not verify."""
        try:
            names = await self._io(sftp.listdir(src_dir))
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPNoSuchPath, asyncssh.SFTPNotADirectory):
            raise ExecutorError("failed", f"{node}: no checkpoint directory {src_dir}") from None
        skipped: list[str] = []
        for iteration, name in candidates(str(n) for n in names):
            raw = await self._read_small(sftp, posixpath.join(src_dir, name))
            sidecar = parse_sidecar(iteration, raw) if raw is not None else None
            if sidecar is None:
                skipped.append(name)
            elif await self._download(sftp, posixpath.join(src_dir, sidecar.data_name), local, sidecar):
                return sidecar, skipped
            else:
                skipped.append(sidecar.data_name)
                log.warning("checkpoint_not_verified", node=node, file=posixpath.join(src_dir, name))
        raise ExecutorError(
            "failed", f"{node}: no verified checkpoint in {src_dir} (not verified: {skipped or 'none'})"
        )

    async def _read_small(self, sftp: asyncssh.SFTPClient, path: str) -> bytes | None:
        try:
            async with await self._io(sftp.open(path, "rb")) as f:
                raw = await self._io(f.read(MAX_SIDECAR + 1))
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPPermissionDenied, asyncssh.SFTPFailure):
            return None
        return raw if isinstance(raw, bytes) and len(raw) <= MAX_SIDECAR else None

    async def _download(self, sftp: asyncssh.SFTPClient, path: str, local: Path, sidecar: Sidecar) -> bool:
        """Copy `path` to `local`, hashing as it comes; whether its size and sha256 match `sidecar`."""
        try:
            f = await self._io(sftp.open(path, "rb"))
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPPermissionDenied):
            return False
        digest, size = hashlib.sha256(), 0
        async with f:
            if (await self._io(f.stat())).size != sidecar.size:
                return False
            out = _open_spool(local, "wb")
            pending: asyncio.Future[bytes] = asyncio.ensure_future(f.read(CHUNK, 0))
            try:
                with out:
                    while chunk := await self._io(pending):
                        size += len(chunk)
                        if size > sidecar.size:
                            break
                        pending = asyncio.ensure_future(f.read(CHUNK, size))  # the next chunk meanwhile
                        await asyncio.to_thread(_absorb, digest, out, chunk, local)
            finally:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
        return size == sidecar.size and digest.hexdigest() == sidecar.sha256

    async def _put_checkpoint(
        self, sftp: asyncssh.SFTPClient, node: str, dst_dir: str, local: Path, sidecar: Sidecar
    ) -> None:
        """Upload `local` and then the sidecar into `dst_dir`, each through a temp name and a rename."""
        await self._io(sftp.makedirs(dst_dir, exist_ok=True))
        source = _open_spool(local, "rb")
        with source:
            await self._put_file(sftp, node, dst_dir, sidecar.data_name, sidecar.size, source)
        await self._put_file(sftp, node, dst_dir, sidecar.name, len(sidecar.raw), sidecar.raw)

    async def _put_file(
        self,
        sftp: asyncssh.SFTPClient,
        node: str,
        dst_dir: str,
        name: str,
        size: int,
        data: IO[bytes] | bytes,
    ) -> None:
        tmp = posixpath.join(dst_dir, temp_name(name))
        try:
            async with await self._io(sftp.open(tmp, "wb")) as f:
                if isinstance(data, bytes):
                    await self._io(f.write(data, 0))
                else:
                    offset = 0
                    while chunk := await asyncio.to_thread(_spool_read, data, CHUNK):
                        await self._io(f.write(chunk, offset))
                        offset += len(chunk)
                with contextlib.suppress(asyncssh.SFTPOpUnsupported):  # no fsync@openssh.com
                    await self._io(f.fsync())
            written = (await self._io(sftp.stat(tmp))).size
            if written != size:
                raise ExecutorError("failed", f"{node}: {tmp} has {written} bytes after upload, not {size}")
            await self._io(sftp.posix_rename(tmp, posixpath.join(dst_dir, name)))
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sftp.remove(tmp), 5)
            raise

    async def close(self) -> None:
        conns = [n.conn for n in self._nodes.values() if n.conn is not None]
        for node in self._nodes.values():
            node.conn = None
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()


async def _execute(conn: asyncssh.SSHClientConnection, command: str) -> asyncssh.SSHCompletedProcess:
    """Run one command with no stdin; its channel is closed however this ends (timeout included).

    A refused channel open is retried (the command did not start): sshd frees a closed session a little
    after the close handshake, so a burst at `ssh_max_channels` near its MaxSessions can meet a refusal.
    """
    for delay in (*OPEN_RETRY_S, None):
        try:
            proc = await conn.create_process(
                command, stdin=asyncssh.DEVNULL, encoding="utf-8", errors="replace"
            )
            break
        except asyncssh.ChannelOpenError:
            if delay is None or conn.is_closed():
                raise
            await asyncio.sleep(delay)
    try:
        result = await proc.wait()
    finally:
        proc.close()
    await proc.wait_closed()
    return result


def _open_spool(path: Path, mode: str) -> IO[bytes]:
    try:
        return open(path, mode)
    except OSError as exc:
        raise ExecutorError("failed", f"master spool {path}: {exc.strerror or exc}") from None


def _absorb(digest: Any, out: IO[bytes], chunk: bytes, path: Path) -> None:
    """Hash and spool one downloaded chunk (in a worker thread: hashlib and writes release the GIL)."""
    digest.update(chunk)
    try:
        out.write(chunk)
    except OSError as exc:
        raise ExecutorError("failed", f"master spool {path}: {exc.strerror or exc}") from None


def _spool_read(source: IO[bytes], size: int) -> bytes:
    try:
        return source.read(size)
    except OSError as exc:
        raise ExecutorError("failed", f"master spool: {exc.strerror or exc}") from None


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data if isinstance(data, str) else ""
