"""Jobs run as their submitting Unix users, isolated: real accounts (useradd), a real master and agent,
the SSH executor over a real sshd on 127.0.0.1, the CLI as a subprocess.

alice's and bob's jobs run as their own accounts (`id -un` in the job's log); alice's job cannot read
bob's log, spec or checkpoints, plant a file in bob's checkpoint directory, read the cluster token or
the master's state, or kill bob's job; its files are alice's. A process a job leaves behind in a
session of its own dies with the job (its cgroup). System accounts, users without a Unix account and
unknown users are refused at submit with the reason. Needs root (to create accounts and switch to
them): skipped otherwise, with the reason.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.node import cgroup
from tests.integration.cluster import REPO, LocalCluster, Node, wait_for
from tests.integration.sshd import Sshd, require_sshd

PROBE = str(REPO / "tests" / "integration" / "isolation_probe.py")


def world_executable(path: str) -> bool:
    """Whether any account may run `path` (every directory on its real path passable by others)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


# the jobs' interpreter must be one the job's account may run (this venv's may sit under /root, 0700)
JOB_PYTHON = next((p for p in (sys.executable, "/usr/bin/python3") if world_executable(p)), "")
ACCOUNTS = {"alice": "hopst-alice", "bob": "hopst-bob"}
SYSTEM = "hopst-sys"
TEAM = "hopst-team"  # a supplementary group of alice's

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: it creates Unix accounts and runs jobs as them (CI runs as root)",
)
needs_python = pytest.mark.skipif(not JOB_PYTHON, reason="no Python interpreter other accounts may run")


def _userdel(name: str) -> None:
    subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    made = {}
    try:
        subprocess.run(["groupdel", TEAM], capture_output=True, check=False)
        subprocess.run(["groupadd", TEAM], check=True, capture_output=True)
        for name in [*ACCOUNTS.values(), SYSTEM]:
            _userdel(name)  # left over from an interrupted run
            system = ["--system"] if name == SYSTEM else ["--create-home"]
            groups = ["--groups", TEAM] if name == ACCOUNTS["alice"] else []
            argv = ["useradd", *system, *groups, "--shell", "/bin/sh", name]
            subprocess.run(argv, check=True, capture_output=True)
            made[name] = pwd.getpwnam(name)
        assert made[SYSTEM].pw_uid < 1000 <= min(made[a].pw_uid for a in ACCOUNTS.values())
        yield made
    finally:
        for name in made:
            _userdel(name)
        subprocess.run(["groupdel", TEAM], capture_output=True, check=False)


def cluster_file(root: Path, sshd: Sshd) -> Path:
    users = "".join(
        f'[[users]]\nname = "{name}"\ntenant = "lab"\nunix_user = "{account}"\n'
        for name, account in (*ACCOUNTS.items(), ("sys", SYSTEM))
    )
    text = f"""
[cluster]
name = "runas"
[[servers]]
id = "n1"
gpu_type = "v100"
gpus = 2
address = "127.0.0.1"
ssh_port = {sshd.port}
[scheduler]
round_seconds = 2
min_attempt_s = 0
[master]
listen = "127.0.0.1:0"
heartbeat_interval_s = 0.3
suspect_after_s = 1.5
lost_after_s = 4
stop_grace_s = 10
executor = "ssh"
ssh_key = "{sshd.user_key}"
known_hosts = "{sshd.known_hosts}"
remote_python = "env PYTHONPATH={REPO}:{REPO / "agent"} {sys.executable}"
run_as_users = true
checkpoint_shared = false
[[tenants]]
name = "lab"
{users}[[users]]
name = "nobody-mapped"
tenant = "lab"
"""
    path = root / "cluster.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def cl(accounts: dict[str, pwd.struct_passwd]) -> Iterator[LocalCluster]:
    require_sshd()
    # a directory every account may pass through (pytest's own temp directories are root's, 0700)
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-runas-", dir="/tmp"))
    os.chmod(root, 0o711)
    sshd = Sshd.start(root / "sshd")
    c = LocalCluster(root, [Node("n1", "v100", 2, 1.0)])
    cluster_file(root, sshd)
    try:
        yield c.start()
    finally:
        c.close()
        sshd.stop()
        for account in accounts:
            subprocess.run(["pkill", "-KILL", "-u", account], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tokens(cl: LocalCluster) -> dict[str, str]:
    return {
        n: cl.cli("token", "create", "--user", n).stdout.strip() for n in (*ACCOUNTS, "sys", "nobody-mapped")
    }


def submit(
    cl: LocalCluster, token: str, *, iters: int, env: dict[str, str] | None = None, name: str = "job"
) -> str:
    args = ["submit", "--gpus", "1", "--batch-size", "8", "--iters", str(iters), "--name", name]
    for key, value in {"PYTHONPATH": str(REPO), **(env or {})}.items():
        args += ["--env", f"{key}={value}"]
    args += [
        "--",
        JOB_PYTHON,
        PROBE,
        "--iters",
        str(iters),
        "--batch-size",
        "8",
        "--step-seconds",
        "0.05",
    ]
    return cl.cli(*args, token=token).stdout.strip()


def running_attempt(cl: LocalCluster, job_id: str) -> Path:
    """The node directory of the job's attempt that runs (not the profiling one), once it logged."""

    def found() -> Path | None:
        job = cl.job(job_id)
        live = [a for a in job["attempts"] if not a["profiling"] and a["started"] and a["ended"] is None]
        if job["state"] != "RUNNING" or not live:
            return None
        path = cl.root / "nodes" / "n1" / "attempts" / live[-1]["id"]
        return path if (path / "job" / "log").exists() and (path / "pid").exists() else None

    wait_for(lambda: found() is not None, 90, f"{job_id} running", lambda: cl.job(job_id))
    path = found()
    assert path is not None
    return path


def live_processes(uid: int) -> list[int]:
    """Processes of `uid` that still run (not zombies: a killed orphan's parent may not reap it)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                out.append(int(status.parent.name))
    return out


def probes(log: str) -> tuple[str, dict[str, Any]]:
    who = next(line.split(None, 1)[1] for line in log.splitlines() if line.startswith("whoami "))
    found = [json.loads(line.split(None, 1)[1]) for line in log.splitlines() if line.startswith("PROBES ")]
    return who, found[-1]


@needs_python
def test_each_job_runs_as_its_user_and_cannot_touch_the_others(
    cl: LocalCluster, tokens: dict[str, str], accounts: dict[str, pwd.struct_passwd]
) -> None:
    alice, bob = accounts[ACCOUNTS["alice"]], accounts[ACCOUNTS["bob"]]
    bob_job = submit(cl, tokens["bob"], iters=100_000, env={"SECRET": "bob-secret"}, name="bob-job")
    bob_dir = running_attempt(cl, bob_job)
    bob_pid = int((bob_dir / "pid").read_text())
    bob_ckpt = cl.root / "nodes" / "n1" / "checkpoints" / bob_job
    state = cl.state_dir
    targets = {
        "read": [
            str(bob_dir / "job" / "log"),
            str(bob_dir / "spec.json"),
            str(state / "cluster.token"),
            str(state / "admin.token"),
            str(state / "state.db"),
        ],
        "list": [str(bob_ckpt), str(bob_dir / "job")],
        "write": [str(bob_ckpt / "ckpt-000000001.json")],
        # the node's own state and the agent's token file, and the wrapper's bookkeeping of alice's own
        # attempt: none of it is the job's to change
        "append": [str(cl.root / "nodes" / "n1" / "epoch"), str(state / "cluster.token")],
        "append own": ["spec.json", "pid", "child.json", "run_as"],
        "kill": [bob_pid],
    }
    alice_job = submit(
        cl, tokens["alice"], iters=20, env={"PROBE_TARGETS": json.dumps(targets)}, name="probe"
    )
    done = cl.wait_state(alice_job, "COMPLETED", "FAILED", timeout=120)
    assert done["state"] == "COMPLETED", done
    assert done["user"] == "alice" and done["run_as"] == ACCOUNTS["alice"]
    log = cl.cli("logs", alice_job, token=tokens["alice"]).stdout
    who, results = probes(log)
    assert who == ACCOUNTS["alice"]
    identity = json.loads(next(x.split(None, 1)[1] for x in log.splitlines() if x.startswith("identity ")))
    team = grp.getgrnam(TEAM).gr_gid
    assert identity["uid"] == alice.pw_uid and identity["gid"] == alice.pw_gid, identity
    assert team in identity["groups"] and identity["home"] == alice.pw_dir, identity
    assert len([k for k in results if k.startswith("append")]) == 6, results
    denied = {k: v for k, v in results.items() if k != "own files"}
    assert denied and all(v in ("PermissionError", "ProcessLookupError") for v in denied.values()), results
    assert results[f"kill {bob_pid}"] == "PermissionError" and results["own files"] == "mine"
    assert not (bob_ckpt / "ckpt-000000001.json").exists()
    # bob's job runs on, as bob; bob reads his own log
    assert cl.job(bob_job)["state"] == "RUNNING"
    bob_log = cl.cli("logs", bob_job, token=tokens["bob"]).stdout
    assert probes(bob_log)[0] == ACCOUNTS["bob"]
    # alice's files are alice's, closed to everyone else; the wrapper's bookkeeping is the wrapper's
    alice_dirs = sorted((cl.root / "nodes" / "n1" / "attempts").glob("*/job"))
    mine = [d for d in alice_dirs if d.stat().st_uid == alice.pw_uid]
    assert len(mine) == 2  # the profiling run and the run
    for d in mine:
        assert d.stat().st_mode & 0o007 == 0
        assert (d / "log").stat().st_uid == alice.pw_uid and (d / "log").stat().st_mode & 0o077 == 0o040
        for name in ("spec.json", "pid", "child.json", "run_as"):
            st = (d.parent / name).stat()
            assert st.st_uid == 0 and st.st_mode & 0o077 == 0, (d.parent / name, oct(st.st_mode))
    ckpt = (cl.root / "nodes" / "n1" / "checkpoints" / alice_job).stat()
    assert ckpt.st_uid == alice.pw_uid and ckpt.st_mode & 0o007 == 0
    assert bob_ckpt.stat().st_uid == bob.pw_uid
    cl.cli("cancel", bob_job, token=tokens["bob"])


@needs_python
def test_stop_reaches_every_process_of_the_job(
    cl: LocalCluster, tokens: dict[str, str], accounts: dict[str, pwd.struct_passwd]
) -> None:
    alice = accounts[ACCOUNTS["alice"]]
    job = submit(cl, tokens["alice"], iters=100_000, env={"PROBE_ORPHAN": "1"}, name="orphans")
    attempt = running_attempt(cl, job)
    pid = int((attempt / "pid").read_text())
    wait_for(lambda: len(live_processes(alice.pw_uid)) >= 2, 20, "the job and the process it left")
    sessions = {os.getsid(p) for p in live_processes(alice.pw_uid)}
    assert len(sessions) >= 2 and os.getsid(pid) in sessions  # one outside the job's session
    cg = cgroup.attempt_cgroup(attempt.parent.parent, attempt.name)
    if cg is not None:  # the host has a hierarchy: the attempt must have been put in it
        assert cg.exists(), cg
        assert set(live_processes(alice.pw_uid)) <= set(cg.members())
    assert cl.cli("cancel", job, token=tokens["alice"]).stdout.strip() == f"{job}: CANCELLED"
    wait_for(lambda: not live_processes(alice.pw_uid), 30, f"no process of {alice.pw_name} left")
    if cg is not None:
        wait_for(lambda: not cg.exists(), 10, "the attempt's cgroups removed")


def test_refused_accounts_get_the_reason_at_submit(cl: LocalCluster, tokens: dict[str, str]) -> None:
    before = cl.api("GET", "/api/v1/jobs?limit=1000")["jobs"]
    argv = ["submit", "--gpus", "1", "--batch-size", "8", "--iters", "5", "--", JOB_PYTHON, PROBE]
    cases = {
        "sys": f"user: user 'sys': the Unix account '{SYSTEM}' (uid ",
        "nobody-mapped": "user: user 'nobody-mapped' has no Unix account",
    }
    for user, message in cases.items():
        proc = cl.cli(*argv, token=tokens[user], check=False)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
        assert not proc.stdout.strip()
    proc = cl.cli(*argv, check=False)  # the admin token's user has no account either
    assert proc.returncode == 1 and "user: user 'admin' has no Unix account" in proc.stderr
    assert "system account" in cl.cli(*argv, token=tokens["sys"], check=False).stderr
    proc = cl.cli("user", "set", "nobody-mapped", "--unix-user", "no-such-account", check=True)
    proc = cl.cli(*argv, token=tokens["nobody-mapped"], check=False)
    assert proc.returncode == 1 and "no Unix account 'no-such-account' on the master" in proc.stderr
    assert cl.api("GET", "/api/v1/jobs?limit=1000")["jobs"] == before  # nothing stored


@needs_python
def test_limits_are_enforced_or_refused_with_the_reason(cl: LocalCluster, tokens: dict[str, str]) -> None:
    found = cgroup.hierarchies()
    job_id = cl.cli(
        "submit", "--gpus", "1", "--batch-size", "8", "--iters", "20", "--mem", "512M", "--cpus", "1",
        "--env", f"PYTHONPATH={REPO}", "--", JOB_PYTHON, PROBE, "--iters", "20", "--batch-size", "8",
        "--step-seconds", "0.05", token=tokens["alice"],
    ).stdout.strip()  # fmt: skip
    job = cl.job(job_id)
    assert (job["mem_mb"], job["cpus"]) == (512, 1.0)
    if found.home("memory") and found.home("cpu"):  # from cgroup v2 where it offers them, else v1
        attempt = running_attempt(cl, job_id)
        cg = cgroup.attempt_cgroup(attempt.parent.parent, attempt.name)
        assert cg is not None
        limited = [cg.unified if found.home(c) == "v2" else cg.v1.get(c) for c in ("memory", "cpu")]
        pid = int((attempt / "pid").read_text())
        # the step writes the job's log before it makes and enters its cgroups: wait until it did
        wait_for(
            lambda: all(d is not None and pid in cgroup.procs(d) for d in limited),
            30,
            f"pid {pid} in the cgroups holding its limits ({limited})",
        )
        if found.home("memory") == "v2":
            assert cg.unified is not None and (cg.unified / "memory.max").read_text().strip() == str(
                512 << 20
            )
        else:
            assert (cg.v1["memory"] / "memory.limit_in_bytes").read_text().strip() == str(512 << 20)
        if found.home("cpu") == "v2":
            assert cg.unified is not None and (cg.unified / "cpu.max").read_text().split() == [
                "100000",
                "100000",
            ]
        else:
            assert (cg.v1["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "100000"
        assert all(pid in cgroup.procs(d) for d in cg.dirs() if d.exists()), cg
        cl.wait_state(job_id, "COMPLETED", timeout=120)
    else:  # this host cannot enforce them: the job fails at once, saying why
        done = cl.wait_state(job_id, "FAILED", timeout=60)
        assert "controller is not available on this node" in (done["reason"] or ""), done


@needs_python
def test_up_as_root_runs_each_job_as_its_user(accounts: dict[str, pwd.struct_passwd]) -> None:
    """`hopsmgr up` as root with [[users]] naming Unix accounts (and nothing else said): each job runs
    as its user, on the local executor."""
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-up-", dir="/tmp"))
    os.chmod(root, 0o711)
    config = root / "lab.toml"
    config.write_text(
        '[[servers]]\nid = "n1"\ngpu_type = "v100"\ngpus = 1\n'
        '[[tenants]]\nname = "lab"\n'
        f'[[users]]\nname = "alice"\ntenant = "lab"\nunix_user = "{ACCOUNTS["alice"]}"\n'
    )
    run = [sys.executable, "-m", "hopsmgr.cli.main"]

    def hopsmgr(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*run, *args],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **(env or {})},
        )

    up = hopsmgr("up", "--config", str(config), "--dir", "lc")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "jobs run as their users" in up.stdout
        url = up.stdout.split("HOPSMGR_URL=")[1].split()[0]
        admin = (root / "lc" / "state" / "admin.token").read_text().strip()
        conn = {"HOPSMGR_URL": url, "HOPSMGR_TOKEN": admin}
        token = hopsmgr("token", "create", "--user", "alice", env=conn).stdout.strip()
        user = {"HOPSMGR_URL": url, "HOPSMGR_TOKEN": token}
        job = hopsmgr(
            "submit", "--gpus", "1", "--batch-size", "8", "--iters", "10", "--env", f"PYTHONPATH={REPO}",
            "--", JOB_PYTHON, PROBE, "--iters", "10", "--batch-size", "8", "--step-seconds", "0.02", env=user,
        ).stdout.strip()  # fmt: skip
        assert job.startswith("j-"), job

        def state() -> str:
            return str(json.loads(hopsmgr("show", job, "--json", env=user).stdout)["state"])

        wait_for(lambda: state() in ("COMPLETED", "FAILED"), 90, f"{job} ended")
        assert state() == "COMPLETED", hopsmgr("show", job, env=user).stdout
        assert probes(hopsmgr("logs", job, env=user).stdout)[0] == ACCOUNTS["alice"]
    finally:
        down = hopsmgr("down", "--dir", "lc")
        shutil.rmtree(root, ignore_errors=True)
    assert down.returncode == 0, down.stderr
