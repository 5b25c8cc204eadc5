"""A private OpenSSH server on 127.0.0.1: its own host key, user key, config and port.

Used by `hopsmgr demo` to reach its local nodes over SSH the way a lab's master reaches real servers
(the SSH executor, host keys checked against a known_hosts file written from the key it generated),
and by the SSH tests. It runs `/usr/sbin/sshd -D -e` as the current user with a config that accepts
only the generated user key (no passwords, no PAM) and serves SFTP.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
KEYGEN = "ssh-keygen"


class SshdError(RuntimeError):
    """The private sshd could not start (the message carries its log)."""


def available() -> bool:
    return SSHD.exists()


def keygen(path: Path) -> Path:
    """A new passphrase-less ed25519 key pair at `path` (+ `.pub`); returns `path`."""
    subprocess.run(
        [KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def known_hosts_line(port: int, public_key_file: Path) -> str:
    kind, blob = public_key_file.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {kind} {blob}\n"


@dataclass
class PrivateSshd:
    root: Path
    port: int
    host_key: Path
    user_key: Path
    known_hosts: Path
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    @classmethod
    def start(
        cls, root: Path, timeout: float = 10.0, max_sessions: int = 10, rsa_host_key: bool = False
    ) -> PrivateSshd:
        if not available():
            raise SshdError(f"{SSHD} is not installed (apt-get install openssh-server)")
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # sshd's privilege-separation directory (as root)
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        host_key = keygen(root / "ssh_host_ed25519_key")
        extra_keys = []
        if rsa_host_key:  # a second host key, listed first (as on hosts where ssh-keyscan shows RSA first)
            rsa = root / "ssh_host_rsa_key"
            subprocess.run(
                [KEYGEN, "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)],
                check=True,
                capture_output=True,
            )
            extra_keys.append(f"HostKey {rsa}")
        user_key = keygen(root / "id_ed25519")
        (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
        port = free_port()
        config = root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    *extra_keys,
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    f"PidFile {root / 'sshd.pid'}",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "Subsystem sftp internal-sftp",
                    "LogLevel VERBOSE",
                    f"MaxSessions {max_sessions}",
                    "",
                ]
            )
        )
        known_hosts = root / "known_hosts"
        known_hosts.write_text(known_hosts_line(port, root / "ssh_host_ed25519_key.pub"))
        with open(root / "sshd.log", "ab") as log:
            proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
        server = cls(root, port, host_key, user_key, known_hosts, proc)
        server._wait_listening(timeout)
        return server

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SshdError(f"sshd exited with {self.proc.returncode}:\n{self.log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise SshdError(f"sshd did not listen on {self.port} within {timeout} s:\n{self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
