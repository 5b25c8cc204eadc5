"""The privileged step (hopsmgr.node.runas) refuses every attempt it cannot verify, and the wrapper
refuses accounts it would refuse, before anything runs. Real accounts (useradd) and real files; run
as root (the step's own rule), skipped otherwise."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hopsmgr.node import ops, runas
from hopsmgr.node.layout import BadRequest, fence

USER, SYSTEM = "hopsr-user", "hopsr-sys"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: it creates Unix accounts (CI runs as root)",
)


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    made = {}
    try:
        for name, flag in ((USER, "--create-home"), (SYSTEM, "--system")):
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
            subprocess.run(["useradd", flag, name], check=True, capture_output=True)
            made[name] = pwd.getpwnam(name)
        yield made
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@pytest.fixture
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-runas-unit-", dir="/tmp"))
    os.chmod(root, 0o711)
    yield root / "w"
    shutil.rmtree(root, ignore_errors=True)


def prepared(workdir: Path, attempt: str = "a-000001", run_as: str = USER, epoch: int = 1) -> Path:
    """An attempt directory as the wrapper makes it for `launch --run-as` (without starting it)."""
    d = workdir / "attempts" / attempt
    d.mkdir(parents=True)
    os.chmod(d, 0o711)
    spec = {
        "attempt": attempt,
        "job": "j-000001",
        "epoch": epoch,
        "argv": ["true"],
        "env": {},
        "run_as": run_as,
    }
    (d / "spec.json").write_text(json.dumps(spec))
    (d / "run_as").write_text(run_as + "\n")
    for f in ("spec.json", "run_as"):
        os.chmod(d / f, 0o600)
    fence(workdir, epoch)
    return d


def refused(workdir: Path, attempt: str = "a-000001") -> str:
    with pytest.raises(runas.Refused) as info:
        runas.verify(str(workdir), attempt)
    return str(info.value)


def test_a_proper_attempt_verifies(accounts: dict[str, pwd.struct_passwd], workdir: Path) -> None:
    prepared(workdir)
    v = runas.verify(str(workdir), "a-000001")
    assert v.account.pw_uid == accounts[USER].pw_uid and v.spec["run_as"] == USER


def test_what_the_step_refuses(accounts: dict[str, pwd.struct_passwd], workdir: Path) -> None:
    d = prepared(workdir)
    user = accounts[USER]
    os.chown(d / "spec.json", user.pw_uid, -1)  # a spec the job's account could have written
    assert "spec" in refused(workdir) and "must belong to uid 0" in refused(workdir)
    os.chown(d / "spec.json", 0, -1)
    os.chmod(d, 0o777)
    assert "attempt directory" in refused(workdir)
    os.chmod(d, 0o711)
    link = workdir.parent / "link"
    link.symlink_to(workdir)
    assert "without symlinks" in refused(link)
    assert "not a valid id" in refused(workdir, "../a-000001")
    spec = json.loads((d / "spec.json").read_text())
    (d / "spec.json").write_text(json.dumps({**spec, "attempt": "a-000002"}))
    assert "does not describe this attempt" in refused(workdir)
    (d / "spec.json").write_text(json.dumps(spec))
    fence(workdir, 5)
    assert "fenced off" in refused(workdir)
    for account, why in (("root", "root or a system account"), (SYSTEM, "root or a system account"),
                         ("no-such-account", "no Unix account 'no-such-account'")):  # fmt: skip
        d2 = prepared(workdir / "x", run_as=account, epoch=7)
        assert why in refused(workdir / "x"), account
        shutil.rmtree(d2.parent.parent)


def test_start_runs_once(accounts: dict[str, pwd.struct_passwd], workdir: Path) -> None:
    d = prepared(workdir)
    (d / "job").mkdir()  # a start made it already
    proc = subprocess.run(
        [*runas.command(), "start", "--workdir", str(workdir), "--attempt", "a-000001"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == runas.REFUSED and "was started already" in proc.stderr


def test_the_wrapper_refuses_before_it_makes_anything(
    accounts: dict[str, pwd.struct_passwd], workdir: Path
) -> None:
    for account, why in (("root", "root or a system account"), (SYSTEM, "system account"),
                         ("Bad Name", "not a Unix account name"), ("no-such-account", "no Unix account")):  # fmt: skip
        with pytest.raises(BadRequest, match=why):
            ops.launch(workdir, "a-000001", "j-000001", 1, ["true"], run_as=account)
    with pytest.raises(BadRequest, match="need --run-as"):
        ops.launch(workdir, "a-000001", "j-000001", 1, ["true"], mem_mb=512)
    assert not (workdir / "attempts" / "a-000001").exists()


def test_checkpoints_brought_for_the_job_become_its_users(
    accounts: dict[str, pwd.struct_passwd], workdir: Path
) -> None:
    user = accounts[USER]
    ckpt = workdir / "checkpoints" / "j-000001"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-000000010.pt").write_bytes(b"weights")  # as a move from another node leaves it
    (ckpt / "ckpt-000000010.json").write_text("{}")
    # with a grant, as the master gives one: on a server with an NVIDIA driver an attempt without one
    # is fenced off every GPU, and its log begins with a line saying so
    ops.launch(
        workdir,
        "a-000001",
        "j-000001",
        1,
        ["/bin/sh", "-c", "cat $HOPS_CHECKPOINT_DIR/*.pt"],
        run_as=USER,
        gpus=1,
        visible_devices="0",
    )
    deadline = time.monotonic() + 10
    while not (workdir / "attempts" / "a-000001" / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    *notes, last = str(ops.logs(workdir, "a-000001")["log"]).splitlines()
    # only hopsmgr's own notes before the job's output (a server whose GPUs cannot be fenced says so)
    assert last == "weights" and all(n.startswith("hopsmgr: ") for n in notes), notes
    for path in (ckpt, *ckpt.iterdir()):
        st = path.stat()
        assert st.st_uid == user.pw_uid and st.st_mode & 0o007 == 0, (path, oct(st.st_mode))
