"""The production path of the privileged step: the wrapper runs as a service account that is not root
and reaches hopsmgr.node.runas only through sudo and one sudoers rule for one root-owned program, as
docs/security.md installs it. Real accounts, real sudo; the test installs the program, its policy
and the rule under names of its own and removes them after. Needs root and sudo: skipped otherwise."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICE, USER = "hopsr-svc", "hopsr-job"
EXAMPLE = REPO / "examples" / "emulated_train.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("sudo") is None,
    reason="needs root, useradd and sudo (apt-get install sudo; .ci/run installs it)",
)


def world_executable(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


PYTHON = next((p for p in (sys.executable, "/usr/bin/python3") if world_executable(p)), "")


@dataclass
class Node:
    workdir: Path
    program: Path
    service: pwd.struct_passwd
    user: pwd.struct_passwd
    enter: tuple[str, ...] = ()  # a command the wrapper runs under (nsenter into another systemd's world)

    def wrapper(self, *args: str, check: bool = True) -> dict[str, Any]:
        """The wrapper, run as the service account (as the master runs it over SSH)."""
        env = f"PYTHONPATH={REPO} HOPSMGR_RUNAS={self.program}"
        argv = [
            *self.enter,
            "runuser",
            "-u",
            SERVICE,
            "--",
            "env",
            *env.split(),
            PYTHON,
            "-m",
            "hopsmgr.node.wrapper",
            *args,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd="/")
        if check:
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return dict(json.loads(proc.stdout or "{}"))

    def sudo(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["runuser", "-u", SERVICE, "--", "sudo", "-n", str(self.program), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    if not PYTHON:
        pytest.skip("no Python interpreter other accounts may run")
    tag = secrets.token_hex(4)
    program = Path(f"/usr/local/sbin/hopsmgr-runas-test-{tag}")
    policy = Path(f"/etc/hopsmgr/runas-test-{tag}.toml")
    rule = Path(f"/etc/sudoers.d/hopsmgr-test-{tag}")
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-sudo-", dir="/tmp"))
    made: list[str] = []
    try:
        for name, flag in ((SERVICE, "--system"), (USER, "--create-home")):
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
            subprocess.run(["useradd", flag, name], check=True, capture_output=True)
            made.append(name)
        os.chmod(root, 0o711)
        workdir = root / "work"
        workdir.mkdir()
        service = pwd.getpwnam(SERVICE)
        os.chown(workdir, service.pw_uid, service.pw_gid)
        # what docs/security.md installs, with the test's own names (and this checkout's code)
        loader = f'import sys; sys.path.insert(0, "{REPO}"); from hopsmgr.node.runas import main; sys.exit(main(sys.argv[1:]))'
        program.write_text(
            f"#!/bin/sh\nHOPSMGR_RUNAS_POLICY={policy} exec {PYTHON} -I -c '{loader}' \"$@\"\n"
        )
        os.chmod(program, 0o755)
        policy.parent.mkdir(exist_ok=True)
        policy.write_text(f'min_uid = 1000\nworkdirs = ["{workdir}"]\n')
        os.chmod(policy, 0o644)
        rule.write_text(f"{SERVICE} ALL=(root) NOPASSWD: {program}\n")
        os.chmod(rule, 0o440)
        subprocess.run(["visudo", "-c", "-f", str(rule)], check=True, capture_output=True)
        yield Node(workdir, program, service, pwd.getpwnam(USER))
    finally:
        for path in (rule, program, policy):
            path.unlink(missing_ok=True)
        for name in made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, check=False)
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def wait_exit(node: Node, attempt: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = node.wrapper("status", "--workdir", str(node.workdir), "--attempt", attempt)["attempts"][0]
        if rec["state"] != "running":
            return dict(rec)
        time.sleep(0.2)
    raise AssertionError(f"{attempt} still running after {timeout} s")


def test_a_service_account_runs_jobs_as_users_through_sudo(node: Node) -> None:
    w = str(node.workdir)
    argv = ["/bin/sh", "-c", "id -un; sleep 600 & sleep 600"]
    # granted a GPU as the master grants one (on a server with an NVIDIA driver an attempt granted none
    # is fenced off every GPU, and its log begins with a line saying so)
    node.wrapper("launch", "--workdir", w, "--attempt", "a-000001", "--job", "j-000001", "--epoch", "1",
                 "--gpus", "1", "--visible-devices", "0", "--run-as", USER, "--", *argv)  # fmt: skip
    time.sleep(1)
    log = node.wrapper("logs", "--workdir", w, "--attempt", "a-000001")["log"]
    assert log.splitlines()[0] == USER
    job = node.workdir / "attempts" / "a-000001" / "job"
    assert job.stat().st_uid == node.user.pw_uid and job.stat().st_gid == node.service.pw_gid
    # stop (through sudo, to the whole cgroup) ends both sleeps; forget removes the user's files
    rec = node.wrapper("stop", "--workdir", w, "--attempt", "a-000001", "--epoch", "1", "--grace", "2")
    assert rec["attempts"][0]["state"] == "exited" if "attempts" in rec else rec["state"] == "exited"
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-u", USER, "-x", "sleep"], capture_output=True, text=True).stdout.split()
    alive = [p for p in left if Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
    assert alive == [], left
    assert node.wrapper("forget", "--workdir", w, "--attempt", "a-000001")["forgotten"] is True
    assert not (node.workdir / "attempts" / "a-000001").exists()


def test_the_runtime_files_reach_the_service_account(node: Node) -> None:
    w = str(node.workdir)
    node.wrapper("launch", "--workdir", w, "--attempt", "a-000002", "--job", "j-000002", "--epoch", "1",
                 "--run-as", USER, "--mode", "profile", "--profile-iters", "5", "--env", f"PYTHONPATH={REPO}",
                 "--", PYTHON, str(EXAMPLE), "--iters", "30", "--step-seconds", "0.02")  # fmt: skip
    rec = wait_exit(node, "a-000002")
    assert rec["exit"]["code"] == 0, node.wrapper("logs", "--workdir", w, "--attempt", "a-000002")
    assert rec["profile"] and rec["progress"], rec  # read by the service account, written by the user


def test_sudo_reaches_nothing_but_verified_attempts(node: Node) -> None:
    other = Path(tempfile.mkdtemp(prefix="hopsmgr-sudo-other-", dir="/tmp"))
    try:
        proc = node.sudo("start", "--workdir", str(other), "--attempt", "a-000001")
        assert proc.returncode == 126 and "not one of" in proc.stderr
        proc = node.sudo("start", "--workdir", str(node.workdir), "--attempt", "a-999999")
        assert proc.returncode == 126 and "refused" in proc.stderr
    finally:
        shutil.rmtree(other)
    proc = subprocess.run(
        ["runuser", "-u", SERVICE, "--", "sudo", "-n", "/bin/id"], capture_output=True, text=True
    )
    assert proc.returncode != 0  # the rule allows the one program only
