"""Each isolated attempt's cgroups: `<hierarchy>/hopsmgr/<attempt>-<workdir hash>`.

The privileged step (hopsmgr.node.runas) creates them, sets the submission's limits and the GPU
device rules, and moves itself in before it becomes the job, so every process the job starts is in
them: a stop signals every member and a kill is `cgroup.kill` (or SIGKILL to each member on kernels
without it), which reaches children that left the job's process group.

Each controller is taken from the cgroup v2 (unified) hierarchy where it offers it, else from its
own v1 hierarchy (hybrid hosts, as many Debian/Ubuntu LTS servers and containers still run):

| need | cgroup v2 | cgroup v1 |
|---|---|---|
| membership, stop, kill | the unified directory | the v1 directories (all of them without a unified one) |
| `--mem` | memory.max, memory.swap.max = 0 | memory.limit_in_bytes, memory.memsw.limit_in_bytes |
| `--cpus` | cpu.max | cpu.cfs_quota_us / cpu.cfs_period_us |
| GPUs not granted | an eBPF device program denying `c 195:<minor>` (hopsmgr.node.bpf_devices) | devices.deny `c 195:<minor> rwm` |

The GPU rules go where `device_fence` says: to the v1 devices hierarchy where one is mounted (hybrid
hosts keep it as their fence), else to an eBPF program attached to the attempt's unified directory
(pure-v2 hosts; such a program works on any cgroup2 directory, whatever controllers it has).

`create` makes them and sets limits and rules (removing what it made if any cannot be set), `enter`
moves the step into exactly those (failing if one is gone: a stop removed it meanwhile).

Where systemd manages the unified hierarchy (it runs, `/run/systemd/system` exists, and the cgroup2
mount is `/sys/fs/cgroup`: pure-v2 hosts), the attempt's unified directory is a transient scope unit
of systemd's, `hopsmgr.slice/hopsmgr-<attempt>-<workdir hash>.scope`, made by `systemd-run --scope`
(`scope_command`: the privileged step runs itself again inside it), with `Delegate=yes` and the
limits as the unit's properties (MemoryMax, MemorySwapMax, CPUQuota), so that systemd's own view of
the cgroup tree stays true (`systemctl status` shows the job) and systemd never moves the job out.
The GPU fence is the same eBPF program, attached to the scope's directory. Elsewhere (hybrid hosts,
hosts without systemd) the cgroups are made directly (docs/security.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from hopsmgr.node import bpf_devices

PARENT = "hopsmgr"
SLICE = "hopsmgr.slice"  # where systemd keeps the attempts' scopes
MOUNTS = Path("/proc/self/mounts")
SYSTEMD_RUNS = Path("/run/systemd/system")  # what sd_booted(3) checks
SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu", "devices")


class CgroupError(RuntimeError):
    """The attempt's cgroup cannot be made as asked (the message says what the node lacks)."""


@dataclass(frozen=True)
class Hierarchies:
    """Where the node's cgroup hierarchies are mounted."""

    unified: Path | None = None
    v1: Mapping[str, Path] = field(default_factory=dict)  # controller -> its v1 mount
    systemd: bool = False  # systemd manages the unified hierarchy: attempts are scopes of its own

    def offered_by_unified(self) -> set[str]:
        return _controllers(self.unified) if self.unified is not None else set()

    def home(self, controller: str) -> str | None:
        """ "v2", "v1" or None: where `controller` can be used on this node."""
        if controller in self.offered_by_unified():
            return "v2"
        return "v1" if controller in self.v1 else None


def hierarchies(mounts_text: str | None = None, systemd: bool | None = None) -> Hierarchies:
    """The hierarchies listed in /proc/self/mounts (or in `mounts_text`); `systemd` says whether
    systemd runs (read from /run/systemd/system when None)."""
    if mounts_text is None:
        try:
            mounts_text = MOUNTS.read_text()
        except OSError:
            return Hierarchies()
    unified: list[Path] = []
    v1: dict[str, Path] = {}
    for parts in (line.split() for line in mounts_text.splitlines()):
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2":
            unified.append(Path(parts[1]))
        elif parts[2] == "cgroup":
            for option in parts[3].split(","):
                if option in V1_CONTROLLERS:
                    v1.setdefault(option, Path(parts[1]))
    root = CGROUP_ROOT
    if systemd is None:
        systemd = SYSTEMD_RUNS.is_dir()
    return Hierarchies(
        root if root in unified else (unified[0] if unified else None), v1, systemd and root in unified
    )


@dataclass(frozen=True)
class AttemptCgroup:
    """The cgroup directories of one attempt (made or not)."""

    unified: Path | None
    v1: Mapping[str, Path]  # controller -> directory, for the controllers the unified hierarchy lacks
    unit: str | None = None  # systemd's scope unit whose cgroup `unified` is, where systemd manages it

    def dirs(self) -> list[Path]:
        return ([self.unified] if self.unified is not None else []) + sorted(set(self.v1.values()))

    def exists(self) -> bool:
        return any(d.exists() for d in self.dirs())

    def members(self) -> list[int]:
        if self.unified is not None and self.unified.exists():
            return procs(self.unified)
        return sorted({pid for d in self.v1.values() for pid in procs(d)})


def attempt_cgroup(workdir: Path, attempt_id: str, where: Hierarchies | None = None) -> AttemptCgroup | None:
    """The attempt's cgroup paths; None where the node has no hierarchy to make them in."""
    where = where or hierarchies()
    name = f"{attempt_id}-{hashlib.sha256(str(workdir).encode()).hexdigest()[:8]}"
    offered = where.offered_by_unified()
    v1 = {c: mount / PARENT / name for c, mount in where.v1.items() if c not in offered}
    if where.unified is not None and where.systemd:
        unit = f"hopsmgr-{name}.scope"
        return AttemptCgroup(where.unified / SLICE / unit, v1, unit)
    unified = where.unified / PARENT / name if where.unified is not None else None
    if unified is None and not v1:
        return None
    return AttemptCgroup(unified, v1)


def attempt_cgroups(workdir: Path, attempt_id: str, where: Hierarchies | None = None) -> list[AttemptCgroup]:
    """Every place the attempt's cgroups may be, for a stop or a cleanup: where this node makes them
    now, and, where systemd manages the cgroups, also where they were made directly (an attempt begun
    before the node ran this code, or while systemd was not detected)."""
    where = where or hierarchies()
    found = [cg for cg in (attempt_cgroup(workdir, attempt_id, where),) if cg is not None]
    if where.systemd:
        direct = attempt_cgroup(workdir, attempt_id, replace(where, systemd=False))
        found += [direct] if direct is not None else []
    return found


def in_scope(cg: AttemptCgroup, where: Hierarchies) -> bool:
    """Whether the calling process is in the attempt's scope already (systemd made it around it)."""
    if cg.unit is None or cg.unified is None or where.unified is None:
        return False
    try:
        lines = SELF_CGROUP.read_text().splitlines()
    except OSError:
        return False
    wanted = "/" + str(cg.unified.relative_to(where.unified))
    return any(line.startswith("0::") and line[3:] == wanted for line in lines)


def scope_command(
    cg: AttemptCgroup, mem_mb: int | None, cpus: float | None, argv: Sequence[str]
) -> list[str]:
    """`argv` run by systemd inside the attempt's new transient scope, with its limits as the unit's
    properties (systemd-run execs it: the process keeps its pid and its parent). CgroupError where
    systemd-run is missing, or for an argument systemd-run might expand (newer versions replace
    `$NAME` in the command line)."""
    assert cg.unit is not None
    systemd_run = shutil.which("systemd-run", path="/usr/bin:/bin")
    if systemd_run is None:
        raise CgroupError("systemd runs on this node but systemd-run is not installed")
    if any("$" in arg for arg in argv):
        raise CgroupError(f"cannot run {list(argv)!r} in a scope: an argument holds '$'")
    properties = ["Delegate=yes"]  # the cgroup is the job's: systemd never moves its processes
    if mem_mb is not None:
        properties += [f"MemoryMax={mem_mb}M", "MemorySwapMax=0"]
    if cpus is not None:
        properties.append(f"CPUQuota={cpu_percent(cpus)}%")
    return [
        systemd_run,
        "--scope",
        "--quiet",
        "--no-ask-password",
        "--collect",  # unloaded once it ends, also when its process failed
        f"--unit={cg.unit}",
        f"--slice={SLICE}",
        *(f"--property={p}" for p in properties),
        "--",
        *argv,
    ]


def cpu_percent(cpus: float) -> int:
    """`--cpus` as systemd's CPUQuota percentage (at least 1%)."""
    return max(1, round(cpus * 100))


def scope_limits_hold(cg: AttemptCgroup, mem_mb: int | None, cpus: float | None) -> str | None:
    """Why the scope's cgroup does not have the limits asked for (systemd only logs a controller it
    could not enable), or None when it does."""
    assert cg.unified is not None
    try:
        if mem_mb is not None:
            found = (cg.unified / "memory.max").read_text().strip()
            if found != str(mem_mb << 20):
                return f"memory.max of {cg.unit} is {found!r}, not {mem_mb << 20} (--mem {mem_mb})"
        if cpus is not None:
            quota, period = (cg.unified / "cpu.max").read_text().split()
            wanted = cpu_percent(cpus) / 100
            if quota == "max" or abs(int(quota) / int(period) - wanted) > 0.01 * wanted:
                return f"cpu.max of {cg.unit} is '{quota} {period}', not {wanted:g} CPUs (--cpus {cpus})"
    except (OSError, ValueError) as exc:
        return f"cannot read the limits of {cg.unit}: {exc}"
    return None


def stop_unit(unit: str) -> None:
    """Ask systemd to stop and drop a scope (one left loaded after its processes ended)."""
    systemctl = shutil.which("systemctl", path="/usr/bin:/bin")
    if systemctl is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [systemctl, "stop", "--no-ask-password", unit],
                capture_output=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )


def _controllers(path: Path) -> set[str]:
    try:
        return set((path / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def procs(path: Path) -> list[int]:
    """The processes in one cgroup directory ([] when it is gone)."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def check_controllers(mem_mb: int | None, cpus: float | None, where: Hierarchies | None = None) -> set[str]:
    """The controllers the limits need; CgroupError when the node has neither a v2 nor a v1 home for one."""
    where = where or hierarchies()
    needed = {name for name, value in (("memory", mem_mb), ("cpu", cpus)) if value is not None}
    missing = {name for name in needed if where.home(name) is None}
    if missing:
        offered = sorted(where.offered_by_unified()) + [f"{c} (v1)" for c in sorted(where.v1)]
        raise CgroupError(
            f"the cgroup {' and '.join(sorted(missing))} controller is not available on this node "
            f"(it offers: {' '.join(offered) or 'none'}): cannot enforce --mem / --cpus here; "
            "submit without them"
        )
    return needed


@dataclass(frozen=True)
class Made:
    """What `create` made: the directories the job must be in, and lines for the job's log."""

    dirs: tuple[Path, ...]
    notes: tuple[str, ...] = ()


def create(
    cg: AttemptCgroup,
    mem_mb: int | None,
    cpus: float | None,
    deny_devices: Sequence[tuple[int, int]] = (),
    where: Hierarchies | None = None,
) -> Made:
    """Make the attempt's cgroups with its limits and device rules (char devices major:minor to deny,
    where `device_fence` says). CgroupError, after removing what it made, when a limit or a rule
    cannot be set as asked."""
    where = where or hierarchies()
    fence_kind = device_fence(cg) if deny_devices else None
    if deny_devices and fence_kind is None:
        raise CgroupError(
            "this node has no cgroup v1 devices hierarchy nor a unified one: devices cannot be fenced off"
        )
    needed = check_controllers(mem_mb, cpus, where)
    v2_needed = {c for c in needed if where.home(c) == "v2"}
    quota = max(1000, round(cpus * 100_000)) if cpus is not None else None
    made: list[Path] = []
    dirs: list[Path] = []
    notes: list[str] = []

    def mkdir(path: Path) -> None:
        path.parent.mkdir(exist_ok=True)  # shared by every attempt: made at most once, never removed
        try:
            path.mkdir()
        except FileExistsError:
            return
        made.append(path)

    try:
        if cg.unit is not None and cg.unified is not None:
            # systemd made the scope around this process, with the limits (scope_command)
            if not in_scope(cg, where):
                raise CgroupError(f"the privileged step is not in its systemd scope {cg.unit}")
            if why := scope_limits_hold(cg, mem_mb, cpus):
                raise CgroupError(why)
            dirs.append(cg.unified)
            if fence_kind == "v2":
                _fence_v2(cg.unified, deny_devices)
        elif cg.unified is not None:
            root = cg.unified.parent.parent
            cg.unified.parent.mkdir(exist_ok=True)  # shared: never rolled back
            for level in (root, cg.unified.parent):
                enabled = set((level / "cgroup.subtree_control").read_text().split())
                for name in sorted(v2_needed - enabled):
                    (level / "cgroup.subtree_control").write_text(f"+{name}")
            mkdir(cg.unified)
            dirs.append(cg.unified)
            if mem_mb is not None and "memory" in v2_needed:
                (cg.unified / "memory.max").write_text(str(mem_mb << 20))
                with contextlib.suppress(OSError):
                    (cg.unified / "memory.swap.max").write_text("0")
            if quota is not None and "cpu" in v2_needed:
                (cg.unified / "cpu.max").write_text(f"{quota} 100000")
            if fence_kind == "v2":
                _fence_v2(cg.unified, deny_devices)
        wanted = {"memory": mem_mb is not None, "cpu": cpus is not None, "devices": bool(deny_devices)}
        for controller, path in sorted(cg.v1.items()):
            # without a unified hierarchy the v1 directories are also how stop finds the job: all made
            if not wanted.get(controller) and cg.unified is not None:
                continue
            mkdir(path)
            dirs.append(path)
            if controller == "memory" and mem_mb is not None:
                (path / "memory.limit_in_bytes").write_text(str(mem_mb << 20))
                try:
                    (path / "memory.memsw.limit_in_bytes").write_text(str(mem_mb << 20))
                except OSError:
                    notes.append(
                        "hopsmgr: this node does not account swap (cgroup v1 without memsw): past its "
                        "memory limit the job may swap before it is killed"
                    )
            elif controller == "cpu" and quota is not None:
                (path / "cpu.cfs_period_us").write_text("100000")
                (path / "cpu.cfs_quota_us").write_text(str(quota))
            elif controller == "devices" and deny_devices:
                # a deny rule is an exception to allow-by-default; under a parent that denies by
                # default and allows c 195:*, it would be accepted and change nothing
                inherited = (path / "devices.list").read_text().split("\n")[0].strip()
                if inherited != "a *:* rwm":
                    raise CgroupError(
                        f"the devices cgroup {path} does not allow by default ({inherited!r}, from "
                        "its parent): the node's other GPUs cannot be fenced off here"
                    )
                for major, minor in deny_devices:
                    (path / "devices.deny").write_text(f"c {major}:{minor} rwm")
    except (OSError, CgroupError) as exc:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(exc, CgroupError):
            raise
        raise CgroupError(f"cannot set up {exc.filename or 'the cgroups'}: {exc.strerror or exc}") from None
    return Made(tuple(dirs), tuple(notes))


def _fence_v2(directory: Path, deny_devices: Sequence[tuple[int, int]]) -> None:
    try:
        bpf_devices.fence(directory, deny_devices)
    except bpf_devices.BpfError as exc:
        raise CgroupError(
            f"cannot fence off the node's other GPUs with a cgroup v2 device program on {directory}: {exc}"
        ) from None


def device_fence(cg: AttemptCgroup) -> Literal["v1", "v2"] | None:
    """How device rules reach this attempt: "v1" (its v1 devices directory), "v2" (an eBPF device
    program on its unified directory, where no v1 devices hierarchy is mounted) or None."""
    if "devices" in cg.v1:
        return "v1"
    return "v2" if cg.unified is not None else None


def enforces_devices(cg: AttemptCgroup) -> bool:
    """Whether device rules can reach this attempt (see `device_fence`)."""
    return device_fence(cg) is not None


def enter(made: Made) -> None:
    """Move the calling process into every cgroup `create` made (its children follow); CgroupError if
    one is gone (a stop removed it meanwhile) or refuses it."""
    for d in made.dirs:
        try:
            (d / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as exc:
            raise CgroupError(f"cannot move into the cgroup {d}: {exc.strerror or exc}") from None


def send(cg: AttemptCgroup, sig: int) -> int:
    """Signal every process in the attempt's cgroups; how many were signalled."""
    unified = cg.unified
    if sig == signal.SIGKILL and unified is not None and (unified / "cgroup.kill").exists():
        count = len(procs(unified))
        with contextlib.suppress(OSError):
            (unified / "cgroup.kill").write_text("1")
        return count
    count = 0
    for pid in cg.members():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            count += 1
    return count


def kill_and_remove(cg: AttemptCgroup, timeout_s: float = 10.0) -> bool:
    """SIGKILL what is left, wait until the cgroups are empty, remove them; whether they are gone. A
    scope's cgroup is systemd's to remove once it is empty (--collect); one still there after half
    the time is stopped through systemctl."""
    deadline = time.monotonic() + timeout_s
    asked = False
    while cg.exists():
        if cg.members():
            send(cg, signal.SIGKILL)
        else:
            for d in cg.dirs():
                if d != cg.unified or cg.unit is None:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            if cg.unit is not None and not asked and time.monotonic() > deadline - timeout_s / 2:
                stop_unit(cg.unit)
                asked = True
        if time.monotonic() > deadline:
            return not cg.exists()
        time.sleep(0.02)
    return True
