"""Host keys for `hopsmgr nodes add`: fetch the keys a node offers (`scan_host_key`, `scan_host_keys`),
name their type and SHA256 fingerprint for the operator (`key_type`, `fingerprint`), and append a
confirmed one to the master's known_hosts file (`add_known_host`). Nothing here trusts a key on its own:
the operator confirms, and the SSH executor (hopsmgr.master.ssh) only reads the file.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import asyncssh

from hopsmgr.master.executor import ExecutorError
from hopsmgr.master.ssh_errors import classify

# -- host keys, for `hopsmgr nodes add` (the operator confirms; never automatic) ---------------------


def known_hosts_name(address: str, port: int) -> str:
    """How known_hosts names a host: `address`, or `[address]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


async def scan_host_key(address: str, port: int = 22, timeout_s: float = 10.0) -> str:
    """The node's host key as a known_hosts line (not trusted: show its fingerprint to the operator)."""
    where = f"{address}:{port}"
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(address, port, config=[]), timeout_s)
    except Exception as exc:
        raise classify(exc, where) from None
    if key is None:
        raise ExecutorError("hostkey", f"{where}: the server offered no host key")
    return f"{known_hosts_name(address, port)} {key.export_public_key('openssh').decode().strip()}"


# host key algorithms in the order `nodes add` prefers them (ssh-keygen's ED25519 first)
HOST_KEY_ALGS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
)


async def scan_host_keys(address: str, port: int = 22, timeout_s: float = 10.0) -> list[str]:
    """Every host key the node offers, as known_hosts lines, ED25519 first (one handshake per key
    algorithm; algorithms the server has no key for are skipped). Raises ExecutorError when the
    node cannot be reached at all."""
    where = f"{address}:{port}"
    lines: list[str] = []
    first_error: Exception | None = None
    for alg in HOST_KEY_ALGS:
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(address, port, server_host_key_algs=[alg], config=[]), timeout_s
            )
        except (ConnectionRefusedError, socket.gaierror, asyncio.TimeoutError) as exc:  # unreachable
            raise classify(exc, where) from None
        except Exception as exc:  # no key of this algorithm: sshd drops the handshake
            first_error = first_error or exc
            continue
        if key is not None:
            line = f"{known_hosts_name(address, port)} {key.export_public_key('openssh').decode().strip()}"
            if line not in lines:
                lines.append(line)
    if not lines:
        if first_error is not None:
            raise classify(first_error, where)
        raise ExecutorError("hostkey", f"{where}: the server offered no host key")
    return lines


def key_type(line: str) -> str:
    """The key type of a known_hosts line as ssh-keygen -l names it: ED25519, ECDSA, RSA, ..."""
    alg = line.split()[1]
    if alg == "ssh-ed25519":
        return "ED25519"
    if alg.startswith("ecdsa-"):
        return "ECDSA"
    if alg in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512"):
        return "RSA"
    return alg


def fingerprint(line: str) -> str:
    """The SHA256 fingerprint of the key in a known_hosts line (what `ssh-keygen -lf` prints)."""
    parts = line.split()
    if len(parts) < 3:
        raise ValueError(f"not a known_hosts line (HOST KEYTYPE KEY): {line!r}")
    return str(asyncssh.import_public_key(" ".join(parts[1:3])).get_fingerprint("sha256"))


def add_known_host(path: Path, line: str) -> None:
    """Append a confirmed known_hosts line to `path` (created if missing); a repeated line is not added.

    A malformed line raises ValueError (asyncssh.KeyImportError is one) before anything is written.
    """
    line = line.strip()
    fingerprint(line)
    asyncssh.import_known_hosts(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else ""
    if line in (x.strip() for x in text.splitlines()):
        return
    with open(path, "a") as f:
        f.write(("\n" if text and not text.endswith("\n") else "") + line + "\n")
