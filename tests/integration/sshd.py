"""The SSH tests' sshd: hopsmgr.local.sshd.PrivateSshd, skipped (with a message) where sshd is absent.

CI installs openssh-server (.ci/run), so there the SSH tests always run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hopsmgr.local.sshd import SSHD, PrivateSshd, free_port, keygen, known_hosts_line

__all__ = ["SSHD", "Sshd", "free_port", "keygen", "known_hosts_line", "require_sshd"]


def require_sshd() -> None:
    if not SSHD.exists():
        pytest.skip(f"{SSHD} is not installed (apt-get install openssh-server); .ci/run installs it")


class Sshd(PrivateSshd):
    @classmethod
    def start(
        cls, root: Path, timeout: float = 10.0, max_sessions: int = 10, rsa_host_key: bool = False
    ) -> PrivateSshd:
        require_sshd()
        return super().start(root, timeout, max_sessions, rsa_host_key)
