"""Network probe: a TCP sink each agent serves, and the sender that measures B_net against peers.

Wire format (one connection, several messages): the client sends the 8-byte magic, then per message an
8-byte big-endian length and that many bytes; the sink reads and discards them and answers the same 8
bytes when the last one has arrived, so the sender's clock covers delivery, not just its send buffer.
A length of 0 ends the connection. The sender first sends a small warm-up message (TCP slow start),
then times one message of `nbytes`: GB/s = nbytes / seconds / 1e9.

The sink accepts at most `MAX_MESSAGE` bytes per message and `MAX_CONNECTIONS` connections at once, and
gives each connection `CONNECTION_TIMEOUT_S` seconds; it stores nothing and answers nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

MAGIC = b"HOPSPRB1"
MAX_MESSAGE = 1 << 30
MAX_CONNECTIONS = 8
CONNECTION_TIMEOUT_S = 120.0
_CHUNK = 1 << 20


class ProbeError(RuntimeError):
    """A probe to one peer failed (unreachable, refused, timed out, or not a hopsmgr probe sink)."""


def parse_peer(text: str) -> tuple[str, int]:
    """ "host:port" or "[ipv6]:port" -> (host, port); ValueError naming what is wrong."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError('must be "host:port"')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host):
        raise ValueError("has an empty or invalid host")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError("needs a port in [1, 65535]")
    return host, int(port_text)


class ProbeSink:
    """The agent's probe server: `await sink.start()`, then `sink.port`; `await sink.close()`."""

    def __init__(self, host: str = "", port: int = 0) -> None:
        self.host = host
        self.requested_port = port
        self.port = 0
        self.received = 0  # bytes received over this sink's lifetime (tests and logs)
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._serving: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if self.host == "" and socket.has_dualstack_ipv6():
            sock = socket.create_server(
                ("", self.requested_port), family=socket.AF_INET6, dualstack_ipv6=True
            )
        else:
            sock = socket.create_server((self.host, self.requested_port))
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    async def close(self) -> None:
        tasks = [t for t in (self._accepting, *self._serving) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(sock)
            if len(self._serving) >= MAX_CONNECTIONS:
                conn.close()
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(self._messages(conn), CONNECTION_TIMEOUT_S)

    async def _messages(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        if await _recv_exact(loop, conn, view, 8) != MAGIC:
            return
        while True:
            header = await _recv_exact(loop, conn, view, 8)
            (length,) = struct.unpack(">Q", header)
            if length == 0 or length > MAX_MESSAGE:
                return
            left = length
            while left:
                got = await loop.sock_recv_into(conn, view[: min(left, _CHUNK)])
                if got == 0:
                    return
                left -= got
                self.received += got
            await loop.sock_sendall(conn, header)


async def _recv_exact(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, view: memoryview, n: int
) -> bytes:
    got = 0
    while got < n:
        k = await loop.sock_recv_into(conn, view[got:n])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(view[:n])


def measure_peer(host: str, port: int, nbytes: int, timeout_s: float = 30.0) -> float:
    """Send `nbytes` to a peer's probe sink; GB/s (1e9 bytes per second) from first byte to its answer."""
    deadline = time.monotonic() + timeout_s
    payload = memoryview(bytes(_CHUNK))
    try:
        with socket.create_connection((host, port), timeout=min(5.0, timeout_s)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(MAGIC)
            _message(sock, payload, min(nbytes, 4 << 20))  # warm-up: let the window open
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            t0 = time.perf_counter()
            _message(sock, payload, nbytes)
            elapsed = time.perf_counter() - t0
            sock.sendall(struct.pack(">Q", 0))
    except (OSError, ProbeError) as exc:
        raise ProbeError(f"probe to {host}:{port} failed: {exc}") from exc
    return nbytes / max(elapsed, 1e-9) / 1e9


def _message(sock: socket.socket, payload: memoryview, nbytes: int) -> None:
    header = struct.pack(">Q", nbytes)
    sock.sendall(header)
    left = nbytes
    while left:
        chunk = payload[: min(left, len(payload))]
        sock.sendall(chunk)
        left -= len(chunk)
    answer = b""
    while len(answer) < 8:
        part = sock.recv(8 - len(answer))
        if not part:
            raise ProbeError("the peer closed the connection before answering (is it a hopsmgr probe port?)")
        answer += part
    if answer != header:
        raise ProbeError("unexpected answer (is it a hopsmgr probe port?)")
