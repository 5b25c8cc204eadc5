"""Each isolated attempt's cgroup (v2): `<cgroup2 mount>/hopsmgr/<attempt>-<workdir hash>`.

The privileged step (hopsmgr.node.runas) creates it, sets the submission's limits (memory.max,
cpu.max) when the hierarchy offers those controllers, and moves itself in before it becomes the job,
so every process the job starts is in it: a stop signals every member and a kill is `cgroup.kill`
(or SIGKILL to each member on kernels without it), which reaches children that left the job's
process group. Not systemd transient units: the cgroup is made directly, which works with or
without systemd where the cgroup2 mount is writable by root (docs/security.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from pathlib import Path

PARENT = "hopsmgr"
MOUNTS = Path("/proc/self/mounts")


class CgroupError(RuntimeError):
    """The attempt's cgroup cannot be made as asked (the message says what the node lacks)."""


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on hybrid hosts)."""
    try:
        lines = MOUNTS.read_text().splitlines()
    except OSError:
        return None
    found = [
        Path(parts[1])
        for parts in (line.split() for line in lines)
        if len(parts) > 2 and parts[2] == "cgroup2"
    ]
    for path in found:
        if path == Path("/sys/fs/cgroup"):
            return path
    return found[0] if found else None


def attempt_path(workdir: Path, attempt_id: str) -> Path | None:
    root = cgroup2_root()
    if root is None:
        return None
    tag = hashlib.sha256(str(workdir).encode()).hexdigest()[:8]
    return root / PARENT / f"{attempt_id}-{tag}"


def _controllers(path: Path) -> set[str]:
    try:
        return set((path / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def check_controllers(root: Path, mem_mb: int | None, cpus: float | None) -> set[str]:
    """The controllers the limits need; CgroupError when the hierarchy at `root` lacks one."""
    needed = {name for name, value in (("memory", mem_mb), ("cpu", cpus)) if value is not None}
    missing = needed - _controllers(root)
    if missing:
        raise CgroupError(
            f"the cgroup v2 {' and '.join(sorted(missing))} controller is not available on this node "
            f"({root} offers: {' '.join(sorted(_controllers(root))) or 'none'}): cannot enforce "
            "--mem / --cpus here (a cgroup v1 or hybrid host); submit without them"
        )
    return needed


def create(path: Path, mem_mb: int | None, cpus: float | None) -> None:
    """Make the attempt's cgroup with its limits; CgroupError when a limit cannot be enforced here."""
    root, parent = path.parent.parent, path.parent
    needed = check_controllers(root, mem_mb, cpus)
    try:
        parent.mkdir(exist_ok=True)
        for where in (root, parent):
            for name in sorted(needed - set((where / "cgroup.subtree_control").read_text().split())):
                (where / "cgroup.subtree_control").write_text(f"+{name}")
        path.mkdir(exist_ok=True)
        if mem_mb is not None:
            (path / "memory.max").write_text(str(mem_mb * 1024 * 1024))
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        if cpus is not None:
            (path / "cpu.max").write_text(f"{max(1000, round(cpus * 100_000))} 100000")
    except OSError as exc:
        raise CgroupError(f"cannot set up the cgroup {path}: {exc.strerror or exc}") from None


def enter(path: Path) -> None:
    """Move the calling process into the cgroup (its children follow)."""
    try:
        (path / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        raise CgroupError(f"cannot move into the cgroup {path}: {exc.strerror or exc}") from None


def members(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def send(path: Path, sig: int) -> int:
    """Signal every process in the cgroup; how many were signalled."""
    if sig == signal.SIGKILL and (path / "cgroup.kill").exists():
        count = len(members(path))
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
        return count
    count = 0
    for pid in members(path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            count += 1
    return count


def kill_and_remove(path: Path, timeout_s: float = 10.0) -> bool:
    """SIGKILL what is left, wait until the cgroup is empty, remove it; whether it is gone."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        if members(path):
            send(path, signal.SIGKILL)
        else:
            with contextlib.suppress(OSError):
                path.rmdir()
        if time.monotonic() > deadline:
            return not path.exists()
        time.sleep(0.02)
    return True
