"""Fixtures for the node tests: a node work directory whose leftover processes are killed afterwards;
for the tests that run jobs as a real account (as root), the account and an isolated node (`node`: a
work directory and a runas policy of root's naming a fake GPU listing of three GPUs)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hopsmgr.node import cgroup

from .util import fake_driver, kill_leftovers

USER = "hopsc-user"  # the account `account` makes


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    workdir = tmp_path / "work"
    yield workdir
    kill_leftovers(workdir)


@pytest.fixture(scope="module")
def account() -> Iterator[pwd.struct_passwd]:
    subprocess.run(["userdel", "-r", USER], capture_output=True, check=False)
    subprocess.run(["useradd", "--create-home", USER], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True, check=False)
        subprocess.run(["userdel", "-r", USER], capture_output=True, check=False)


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A work directory, a policy of root's that points at a fake driver listing (three GPUs)."""
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-limits-", dir="/tmp"))
    os.chmod(root, 0o711)
    driver = fake_driver(root / "driver", {"0000:3b:00.0": 1, "0000:5e:00.0": 0, "0000:86:00.0": 2})
    policy = root / "runas.toml"
    policy.write_text(f'min_uid = 1000\nnvidia_gpus = "{driver}"\n')
    os.chmod(policy, 0o644)
    monkeypatch.setenv("HOPSMGR_RUNAS_POLICY", str(policy))
    yield root / "w"
    left = []
    for marker in (root / "w" / "attempts").glob("*/spec.json"):
        found = cgroup.attempt_cgroup(root / "w", marker.parent.name)
        if found is not None and found.exists():
            left.append(found)
            cgroup.kill_and_remove(found)
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"cgroups left behind by ended attempts: {left}"
