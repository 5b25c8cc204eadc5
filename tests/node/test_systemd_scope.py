"""Where systemd manages the cgroups, each isolated attempt is a transient scope unit of its own.

A private systemd runs as PID 1 of new PID, mount, cgroup, UTS and IPC namespaces (as a container
manager starts one), on a cgroup2 mount of its own whose root is a fresh cgroup of the host's unified
hierarchy, with a private /run and a unit path that holds one empty target of the test's, so it
starts nothing else (no tmpfiles, journald or udev: nothing it does reaches the host's files). Inside
it, as root, the node's wrapper launches jobs as a real Unix account, and the privileged step, which
finds systemd running, runs itself again inside `hopsmgr.slice/hopsmgr-<attempt>-<hash>.scope` made
by systemd-run. The tests read systemd's own view (`systemctl show`) and the job's /proc/self/cgroup,
check that the node's other GPUs are fenced off inside the scope, that a stop reaches a child that
left the job's session, and that systemd then drops the scope. The first tests read only the rules:
which hosts count as systemd's and how the scope is asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hopsmgr.node import cgroup, ops

from .conftest import USER
from .test_cgroup_limits import opened_as
from .test_runas_sudo import Node as SudoNode
from .test_runas_sudo import node as sudo_node  # noqa: F401  (a fixture)
from .util import bpf_refusal, device_nodes, wait_until

JOB_PYTHON = "/usr/bin/python3"
SYSTEMD = "/lib/systemd/systemd"
PR_SET_PDEATHSIG = 1
PURE_V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
HYBRID = (
    "cgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
)


def test_attempts_are_scopes_only_where_systemd_manages_the_unified_hierarchy(tmp_path: Path) -> None:
    work = tmp_path / "w"
    systemd = cgroup.hierarchies(PURE_V2, systemd=True)
    assert systemd.systemd and systemd.unified == Path("/sys/fs/cgroup")
    cg = cgroup.attempt_cgroup(work, "a-000001", systemd)
    assert cg is not None and cg.unit is not None
    assert cg.unit.startswith("hopsmgr-a-000001-") and cg.unit.endswith(".scope")
    assert cg.unified == Path("/sys/fs/cgroup/hopsmgr.slice") / cg.unit
    # without systemd, or on a hybrid host (systemd's own tree is the v1 name=systemd one): made directly
    for where in (cgroup.hierarchies(PURE_V2, systemd=False), cgroup.hierarchies(HYBRID, systemd=True)):
        assert not where.systemd
        direct = cgroup.attempt_cgroup(work, "a-000001", where)
        assert direct is not None and direct.unit is None and direct.unified is not None
        assert direct.unified.parent.name == cgroup.PARENT
    # a stop looks in both places: an attempt begun before the node made scopes is found too
    places = cgroup.attempt_cgroups(work, "a-000001", systemd)
    assert [c.unit is not None for c in places] == [True, False]
    assert places[1].unified == Path("/sys/fs/cgroup") / cgroup.PARENT / places[0].unit.removeprefix(
        "hopsmgr-"
    ).removesuffix(".scope")


def test_the_scope_carries_the_limits_as_unit_properties(tmp_path: Path) -> None:
    if shutil.which("systemd-run", path="/usr/bin:/bin") is None:
        pytest.skip("systemd-run is not installed")
    cg = cgroup.attempt_cgroup(tmp_path, "a-000002", cgroup.hierarchies(PURE_V2, systemd=True))
    assert cg is not None and cg.unit is not None
    argv = cgroup.scope_command(cg, 512, 1.5, ["/bin/step", "start"])
    assert argv[1:7] == [
        "--scope",
        "--quiet",
        "--no-ask-password",
        "--collect",
        f"--unit={cg.unit}",
        "--slice=hopsmgr.slice",
    ]
    assert argv[-3:] == ["--", "/bin/step", "start"]
    properties = [a.removeprefix("--property=") for a in argv if a.startswith("--property=")]
    assert properties == ["Delegate=yes", "MemoryMax=512M", "MemorySwapMax=0", "CPUQuota=150%"]
    assert [a for a in cgroup.scope_command(cg, None, None, ["x"]) if a.startswith("--property")] == [
        "--property=Delegate=yes"
    ]
    with pytest.raises(cgroup.CgroupError, match="holds '\\$'"):
        cgroup.scope_command(cg, None, None, ["/bin/step", "--workdir", "/srv/$HOME"])


needs_private_systemd = pytest.mark.skipif(
    os.geteuid() != 0
    or not os.access(SYSTEMD, os.X_OK)
    or shutil.which("systemd-run") is None
    or shutil.which("unshare") is None
    or shutil.which("nsenter") is None
    or shutil.which("useradd") is None
    or not os.access(JOB_PYTHON, os.X_OK)
    or cgroup.hierarchies().unified is None,
    reason="needs root, systemd, systemd-run, unshare, nsenter, useradd, /usr/bin/python3 and a cgroup2 "
    "mount: it boots a private systemd in namespaces of its own and runs jobs as an account it creates",
)

INNER = """\
set -e
mount --make-rprivate /
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
umount -l /sys/fs/cgroup 2>/dev/null || true
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=0755 tmpfs /run
exec env -i container=hopsmgr-test SYSTEMD_UNIT_PATH={units} {systemd} --system \
  --unit=hopsmgr-test.target --log-target=null
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove_tree(top: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while top.exists() and time.monotonic() < deadline:
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
        time.sleep(0.05)


class PrivateSystemd:
    """systemd as PID 1 of namespaces of its own (see the module doc); `run` runs a command inside."""

    def __init__(self, pid: int, root_cgroup: Path) -> None:
        self.pid = pid  # systemd's pid as the host sees it
        self.root_cgroup = root_cgroup  # the host's path of its cgroup2 root

    def run(self, *argv: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-a", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def unit(self, name: str, *properties: str) -> dict[str, str]:
        shown = self.run("systemctl", "show", *(f"--property={p}" for p in properties), name).stdout
        return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def private_systemd() -> Iterator[PrivateSystemd]:
    host_v2 = cgroup.hierarchies().unified
    assert host_v2 is not None
    top = host_v2 / f"hopsmgr-test-systemd-{os.getpid()}"
    top.mkdir()
    here = Path(tempfile.mkdtemp(prefix="hopsmgr-systemd-", dir="/tmp"))
    units = here / "units"
    units.mkdir()
    (units / "hopsmgr-test.target").write_text("[Unit]\nDescription=hopsmgr test systemd\n")
    (here / "inner.sh").write_text(INNER.format(units=units, systemd=SYSTEMD))

    def into_top() -> None:  # the namespace's cgroup root is the cgroup unshare starts in
        (top / "cgroup.procs").write_text(str(os.getpid()))
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with pytest

    # a network namespace of its own too: systemd sets up loopback and socket limits there, not here;
    # --kill-child: systemd dies with unshare
    cmd = ["unshare", "--cgroup", "--pid", "--fork", "--mount", "--uts", "--ipc", "--net", "--kill-child"]
    cmd.append("--mount-proc")
    unshare = subprocess.Popen(
        [*cmd, "/bin/sh", str(here / "inner.sh")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=into_top,
    )
    pid = 0
    try:

        def up() -> int | None:
            assert unshare.poll() is None, (
                f"unshare exited: {unshare.stderr.read() if unshare.stderr else ''}"
            )
            children = _children(unshare.pid)
            if not children or Path(f"/proc/{children[0]}/comm").read_text().strip() != "systemd":
                return None
            probe = PrivateSystemd(children[0], top).run("systemctl", "is-system-running", check=False)
            return children[0] if probe.stdout.strip() in ("running", "degraded") else None

        pid = wait_until(up, "the private systemd to run", timeout=30)
        # unshare leaves the namespace's root cgroup, so that systemd may enable controllers in it (a
        # cgroup with processes of its own cannot hand controllers to its children)
        own = next(
            line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")
        )
        (host_v2 / own.lstrip("/") / "cgroup.procs").write_text(str(unshare.pid))
        yield PrivateSystemd(pid, top)
    finally:
        for victim in (pid, unshare.pid):
            if victim:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)  # PID 1 of the namespace: every process in it dies
        unshare.wait(timeout=30)
        if unshare.stderr is not None:
            unshare.stderr.close()
        _remove_tree(top)
        shutil.rmtree(here, ignore_errors=True)
        assert not top.exists(), f"cgroups left behind: {top}"


LAUNCH = """
import json, sys
from hopsmgr.node import ops
workdir, attempt, user, script, launch = sys.argv[1:6]
if sys.argv[6:] == ["--past-the-launch-check"]:  # in this process only: the privileged step checks again
    ops.cgroup.check_controllers = lambda *args, **kw: set()
ops.launch(workdir, attempt, "j-000001", 1, [PYTHON, "-c", script], run_as=user, **json.loads(launch))
""".replace("PYTHON", repr(JOB_PYTHON))

JOB = """
import os, subprocess, sys, time
print("user", subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(), flush=True)
print("cgroup", open("/proc/self/cgroup").read().strip().splitlines()[-1], flush=True)
for path in {paths!r}:
    try:
        os.close(os.open(path, os.O_RDWR))
        print(path, "opened", flush=True)
    except OSError as exc:
        import errno
        print(path, errno.errorcode[exc.errno], flush=True)
subprocess.Popen(["sleep", "600"], start_new_session=True)  # leaves the job's session and group
print("ready", flush=True)
time.sleep(600)
"""


def launch(sd: PrivateSystemd, workdir: Path, attempt: str, script: str, *flags: str, **kw: object) -> None:
    sd.run(sys.executable, "-c", LAUNCH, str(workdir), attempt, USER, script, json.dumps(kw), *flags)


def started(workdir: Path, attempt: str) -> str:
    """The job's log once it printed "ready"."""

    def ready() -> str | None:
        text = str(ops.logs(workdir, attempt)["log"])
        return text if "ready" in text else None

    return wait_until(ready, f"{attempt} to start", timeout=60)


@needs_private_systemd
def test_an_attempt_runs_in_a_scope_of_its_own_and_a_stop_reaches_every_process(
    private_systemd: PrivateSystemd, account: pwd.struct_passwd, node: Path
) -> None:
    sd = private_systemd
    nodes = device_nodes(node.parent / "dev")
    paths = [nodes[name] for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl")]
    # GPU index 0 is the first in PCI bus order: 0000:3b:00.0, whose minor is 1
    launch(sd, node, "a-000001", JOB.format(paths=paths), visible_devices="0", gpus=1)
    log = started(node, "a-000001")
    where = cgroup.hierarchies(PURE_V2, systemd=True)
    cg = cgroup.attempt_cgroup(node, "a-000001", where)
    assert cg is not None and cg.unit is not None
    assert f"user {USER}" in log, log
    assert f"cgroup 0::/hopsmgr.slice/{cg.unit}" in log, log
    shown = sd.unit(cg.unit, "ActiveState", "ControlGroup", "Delegate", "Slice")
    assert shown == {
        "ActiveState": "active",
        "ControlGroup": f"/hopsmgr.slice/{cg.unit}",
        "Delegate": "yes",
        "Slice": "hopsmgr.slice",
    }, shown
    if why := bpf_refusal():
        assert "hopsmgr: the node's other GPUs are not fenced off" in log, (why, log)
    else:  # the scope is fenced with the device program: only the granted GPU's file opens
        opened = opened_as(log)
        assert [opened[p] == "EPERM" for p in paths] == [True, False, True, False], log
    scope_dir = sd.root_cgroup / "hopsmgr.slice" / cg.unit
    members = [int(x) for x in (scope_dir / "cgroup.procs").read_text().split()]
    assert len(members) >= 2, members  # the job and the sleep that left its session
    sd.run(
        sys.executable, "-c", f"from hopsmgr.node import ops; ops.stop({str(node)!r}, 'a-000001', 1, grace=2)"
    )
    wait_until(lambda: not scope_dir.exists() or None, "systemd to drop the ended scope", timeout=30)
    assert all(not Path(f"/proc/{pid}").exists() for pid in members), members
    gone = sd.unit(cg.unit, "LoadState", "ActiveState")
    assert gone == {"LoadState": "not-found", "ActiveState": "inactive"}, gone  # unloaded by systemd
    record = json.loads((node / "attempts" / "a-000001" / "exit.json").read_text())
    assert record["code"] != 0 or record.get("signal"), record


@needs_private_systemd
def test_limits_become_the_scopes_properties_or_are_refused_with_the_reason(
    private_systemd: PrivateSystemd, account: pwd.struct_passwd, node: Path
) -> None:
    sd = private_systemd
    offered = (sd.root_cgroup / "cgroup.controllers").read_text().split()
    if "memory" not in offered:  # a hybrid host: its memory controller is bound to a v1 hierarchy
        refused = sd.run(
            sys.executable,
            "-c",
            LAUNCH,
            str(node),
            "a-000002",
            USER,
            "print(1)",
            '{"mem_mb": 64}',
            check=False,
        )
        assert refused.returncode != 0
        assert "the cgroup memory controller is not available on this node" in refused.stderr, refused.stderr
        # the privileged step refuses it too, before systemd makes a scope
        launch(sd, node, "a-000003", "print('ran', flush=True)", "--past-the-launch-check", mem_mb=64)
        done = node / "attempts" / "a-000003" / "exit.json"
        record = wait_until(
            lambda: json.loads(done.read_text()) if done.exists() else None, "the refusal", 60
        )
        assert "memory controller is not available" in str(record.get("error")), record
        assert "ran" not in str(ops.logs(node, "a-000003")["log"])
        cg = cgroup.attempt_cgroup(node, "a-000003", cgroup.hierarchies(PURE_V2, systemd=True))
        assert cg is not None and cg.unit is not None
        assert sd.unit(cg.unit, "LoadState")["LoadState"] == "not-found"
        return
    launch(sd, node, "a-000002", "import time; print('ready', flush=True); time.sleep(600)", mem_mb=64)
    started(node, "a-000002")
    cg = cgroup.attempt_cgroup(node, "a-000002", cgroup.hierarchies(PURE_V2, systemd=True))
    assert cg is not None and cg.unit is not None
    shown = sd.unit(cg.unit, "MemoryMax", "MemorySwapMax")
    assert shown == {"MemoryMax": str(64 << 20), "MemorySwapMax": "0"}, shown
    assert (sd.root_cgroup / "hopsmgr.slice" / cg.unit / "memory.max").read_text().strip() == str(64 << 20)
    sd.run(
        sys.executable, "-c", f"from hopsmgr.node import ops; ops.stop({str(node)!r}, 'a-000002', 1, grace=2)"
    )


def test_a_scope_without_the_limits_asked_for_is_named(tmp_path: Path) -> None:
    """systemd only logs a controller it could not enable: the step reads the limits back."""
    scope = tmp_path / "hopsmgr-a-000004-0.scope"
    scope.mkdir()
    cg = cgroup.AttemptCgroup(scope, {}, scope.name)
    (scope / "memory.max").write_text(f"{64 << 20}\n")
    (scope / "cpu.max").write_text("150000 100000\n")
    assert cgroup.scope_limits_hold(cg, 64, 1.5) is None
    assert cgroup.scope_limits_hold(cg, None, None) is None
    assert "memory.max of hopsmgr-a-000004-0.scope is" in str(cgroup.scope_limits_hold(cg, 128, None))
    assert "not 0.5 CPUs" in str(cgroup.scope_limits_hold(cg, None, 0.5))
    (scope / "cpu.max").write_text("max 100000\n")
    assert "cpu.max of" in str(cgroup.scope_limits_hold(cg, None, 1.5))
    (scope / "memory.max").unlink()
    assert "cannot read the limits" in str(cgroup.scope_limits_hold(cg, 64, None))


@needs_private_systemd
@pytest.mark.skipif(shutil.which("sudo") is None, reason="needs sudo (.ci/run installs it)")
def test_a_service_account_gets_scopes_through_sudo(
    private_systemd: PrivateSystemd,
    sudo_node: SudoNode,  # noqa: F811  (the fixture imported above)
) -> None:
    """The production path on a systemd host: the wrapper runs as a service account and reaches the
    privileged step only through sudo and the installed program (`python -I -c ...` here)."""
    sd = private_systemd
    via = dataclasses.replace(sudo_node, enter=("nsenter", "-t", str(sd.pid), "-a"))
    w = str(via.workdir)
    argv = ["/bin/sh", "-c", "tail -n 1 /proc/self/cgroup; id -un; sleep 600 & sleep 600"]
    via.wrapper("launch", "--workdir", w, "--attempt", "a-000011", "--job", "j-000011", "--epoch", "1",
                 "--gpus", "1", "--visible-devices", "0",  # granted as the master grants (no fence note)
                 "--run-as", sudo_node.user.pw_name, "--", *argv)  # fmt: skip
    cg = cgroup.attempt_cgroup(via.workdir, "a-000011", cgroup.hierarchies(PURE_V2, systemd=True))
    assert cg is not None and cg.unit is not None

    def logged() -> list[str] | None:
        lines = str(via.wrapper("logs", "--workdir", w, "--attempt", "a-000011")["log"]).splitlines()
        return lines if len(lines) >= 2 else None

    lines = wait_until(logged, "the job's first lines", timeout=60)
    assert lines[:2] == [f"0::/hopsmgr.slice/{cg.unit}", sudo_node.user.pw_name], lines
    assert sd.unit(cg.unit, "ActiveState")["ActiveState"] == "active"
    scope_dir = sd.root_cgroup / "hopsmgr.slice" / cg.unit
    members = [int(x) for x in (scope_dir / "cgroup.procs").read_text().split()]
    assert len(members) >= 3, members  # sh and its two sleeps
    via.wrapper("stop", "--workdir", w, "--attempt", "a-000011", "--epoch", "1", "--grace", "2")
    wait_until(lambda: not scope_dir.exists() or None, "systemd to drop the ended scope", timeout=30)
    assert all(not Path(f"/proc/{pid}").exists() for pid in members), members
    assert sd.unit(cg.unit, "LoadState")["LoadState"] == "not-found"
