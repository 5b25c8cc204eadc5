"""`python -m hopsmgr.node.runas_main start|signal|cleanup --workdir W --attempt A`: the one privileged step.

The node wrapper runs as the master's service account (or as root); jobs run as their users. This
program, run as root (directly when the wrapper is root, else through one sudoers rule for the
installed `/usr/local/sbin/hopsmgr-runas`, see docs/security.md), is the only thing that crosses
from the one to the other, and it takes nothing but a work directory and an attempt id:

- It checks the attempt is one the wrapper made: the work directory is one the node's policy
  (`/etc/hopsmgr/runas.toml`, root's) lists, no path component is a symlink, the attempt directory,
  its spec.json and run_as file belong to the caller (the sudo user, or root) and no one else may
  write them, the spec names this attempt and an epoch the node has not fenced off.
- It refuses root, accounts below the policy's `min_uid` (default 1000) and accounts that do not exist.
- `start`: makes the attempt's `job/` directory (the user's, group the wrapper's, 2770) and log
  (0640), hands the job's checkpoint directory (under `<workdir>/checkpoints/`) to the user, puts
  itself in the attempt's own cgroups with the submission's limits and with the node's GPUs it was
  not granted fenced off (hopsmgr.node.cgroup: a cgroup v1 devices rule, else a cgroup v2 eBPF
  device program; nothing where the node has neither hierarchy; where systemd manages the cgroups,
  the step first runs itself again inside a transient scope unit that `systemd-run` makes), drops to
  the user's uid, gid, supplementary groups and HOME with no_new_privs set, and execs the job's argv
  with the spec's environment (not the wrapper's: its secrets stay with it).
- `signal --signal TERM|USR1|INT|KILL`: signals every process of the attempt's cgroup (KILL also
  removes it); without a cgroup, the job's process group, only if its leader is the user's process.
- `cleanup`: removes an ended attempt's `job/` directory and cgroup.

Refusals print `hopsmgr-runas: refused: <why>` on stderr and exit 126.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

from hopsmgr import nodecontract as nc
from hopsmgr.node import cgroup, gpu_devices
from hopsmgr.node.layout import JOB_SUBDIR, RUN_AS_FILE, Attempt, BadRequest, read_epoch, validate_id
from hopsmgr.runtime.files import read_json

POLICY_FILE = Path("/etc/hopsmgr/runas.toml")
INSTALLED = "/usr/local/sbin/hopsmgr-runas"
DEFAULT_MIN_UID = 1000
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "USR1": signal.SIGUSR1, "INT": signal.SIGINT}
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
PR_SET_NO_NEW_PRIVS = 38
REFUSED = 126


class Refused(Exception):
    """The attempt cannot be run or acted on as its user (the message says why)."""


@dataclass(frozen=True)
class Policy:
    min_uid: int = DEFAULT_MIN_UID
    workdirs: tuple[str, ...] = ()  # empty: any (only when the caller is root itself)
    nvidia_gpus: str = str(gpu_devices.DRIVER_GPUS)  # where the driver lists the GPUs and their minors


def load_policy(path: Path | None = None) -> Policy:
    """The node's policy (root's file); the defaults when there is none. The installed program may
    name another file in HOPSMGR_RUNAS_POLICY (it sets it itself: sudo does not pass the caller's)."""
    path = path or Path(os.environ.get("HOPSMGR_RUNAS_POLICY") or POLICY_FILE)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Policy()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise Refused(f"{path} must be a file of root's that no one else may write")
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"{path}: {exc}") from None
    unknown = set(raw) - {"min_uid", "workdirs", "nvidia_gpus"}
    min_uid, workdirs = raw.get("min_uid", DEFAULT_MIN_UID), raw.get("workdirs", [])
    nvidia_gpus = raw.get("nvidia_gpus", Policy.nvidia_gpus)
    if unknown or isinstance(min_uid, bool) or not isinstance(min_uid, int) or min_uid < 1:
        raise Refused(
            f"{path}: takes min_uid (an integer >= 1), workdirs (a list of paths) and nvidia_gpus (a path)"
            + (f"; not {', '.join(sorted(unknown))}" if unknown else "")
        )
    if not isinstance(workdirs, list) or not all(isinstance(w, str) and w.startswith("/") for w in workdirs):
        raise Refused(f"{path}: workdirs must be a list of absolute paths")
    if not isinstance(nvidia_gpus, str) or not nvidia_gpus.startswith("/"):
        raise Refused(f"{path}: nvidia_gpus must be an absolute path, not {nvidia_gpus!r}")
    if os.path.normpath(nvidia_gpus) != nvidia_gpus or ".." in nvidia_gpus.split("/"):
        raise Refused(f"{path}: nvidia_gpus must be a plain absolute path, not {nvidia_gpus!r}")
    return Policy(min_uid, tuple(workdirs), nvidia_gpus)


def _gpu_listing(policy: Policy) -> Path:
    """The policy's GPU listing, if only root may change it (checked when a job starts, not when one
    is stopped: a stop must not fail on it)."""
    listing = Path(policy.nvidia_gpus)
    if listing.parts[:2] == ("/", "proc"):
        return listing
    try:
        st = listing.lstat()
    except FileNotFoundError:
        return listing
    real = os.path.realpath(listing)
    if real != str(listing) or stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise Refused(f"nvidia_gpus {listing} must be a directory of root's that no one else may write")
    return listing


def command() -> list[str]:
    """How the wrapper runs this program: directly as root, else through sudo (no password, no prompt)."""
    if os.geteuid() == 0:
        return [sys.executable, "-m", "hopsmgr.node.runas_main"]
    return ["sudo", "-n", os.environ.get("HOPSMGR_RUNAS", INSTALLED)]


def call(a: Attempt, action: str, *extra: str) -> str:
    """Run the privileged step for this attempt; "" on success, else its error text."""
    argv = [*command(), action, "--workdir", str(a.workdir), "--attempt", a.attempt_id, *extra]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    return "" if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")[-500:]


def check_account(name: str, policy: Policy) -> pwd.struct_passwd:
    """The account `name`, if jobs may run as it."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise Refused(f"no Unix account {name!r} on this node") from None
    if account.pw_uid == 0 or account.pw_uid < policy.min_uid:
        raise Refused(
            f"the account {name!r} (uid {account.pw_uid}) is root or a system account: jobs run only as "
            f"accounts with uid >= {policy.min_uid} (min_uid in {POLICY_FILE})"
        )
    return account


def _caller() -> int:
    if os.geteuid() != 0:
        raise Refused("must run as root (the wrapper runs it through sudo, see docs/security.md)")
    sudo = os.environ.get("SUDO_UID")
    return int(sudo) if sudo and sudo.isdigit() and os.getuid() == 0 else 0


def _owned(path: Path, uid: int, what: str) -> os.stat_result:
    try:
        st = path.lstat()
    except OSError as exc:
        raise Refused(f"{what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise Refused(f"{what} {path} is a symlink")
    if st.st_uid != uid or st.st_mode & 0o022:
        raise Refused(f"{what} {path} must belong to uid {uid} and be writable by it alone")
    return st


@dataclass(frozen=True)
class Verified:
    attempt: Attempt
    spec: dict[str, Any]
    account: pwd.struct_passwd
    wrapper_gid: int
    policy: Policy


def verify(workdir: str, attempt_id: str, *, fenced: bool = True) -> Verified:
    """The attempt the arguments name, checked as the module doc says (raises Refused)."""
    caller = _caller()
    policy = load_policy()
    if not workdir.startswith("/") or os.path.realpath(workdir) != os.path.normpath(workdir):
        raise Refused(f"work directory {workdir!r} must be an absolute path without symlinks")
    workdir = os.path.normpath(workdir)
    if policy.workdirs and workdir not in policy.workdirs:
        raise Refused(f"work directory {workdir} is not one of {POLICY_FILE}'s workdirs")
    if caller != 0 and not policy.workdirs:
        raise Refused(f"list the nodes' work directories in {POLICY_FILE} (workdirs = [...])")
    try:
        a = Attempt(Path(workdir), validate_id("attempt", attempt_id))
    except BadRequest as exc:
        raise Refused(str(exc)) from None
    _owned(a.workdir, caller, "work directory")
    _owned(a.dir.parent, caller, "attempts directory")
    st = _owned(a.dir, caller, "attempt directory")
    _owned(a.spec, caller, "spec")
    _owned(a.dir / RUN_AS_FILE, caller, "run_as file")
    try:
        spec = json.loads(a.spec.read_text())
        run_as = (a.dir / RUN_AS_FILE).read_text().strip()
    except (OSError, ValueError) as exc:
        raise Refused(f"attempt {attempt_id}: unreadable spec ({exc})") from None
    if not isinstance(spec, dict) or spec.get("attempt") != attempt_id or spec.get("run_as") != run_as:
        raise Refused(f"attempt {attempt_id}: the spec does not describe this attempt")
    epoch = spec.get("epoch")
    if fenced and (not isinstance(epoch, int) or epoch < read_epoch(a.workdir)):
        raise Refused(f"attempt {attempt_id}: epoch {epoch!r} is fenced off on this node")
    return Verified(a, spec, check_account(run_as, policy), st.st_gid, policy)


def _checkpoint_dir(v: Verified) -> None:
    """Hand the job's checkpoint directory, and what the wrapper or the master put in it (checkpoints
    brought from another node), to its user, if it is the node's own for this job."""
    text = str((v.spec.get("env") or {}).get(nc.CHECKPOINT_DIR, ""))
    expected = v.attempt.workdir / "checkpoints" / str(v.spec.get("job"))
    if not text or Path(text) != expected or os.path.realpath(text) != str(expected):
        return  # elsewhere (a shared filesystem): its owner's business, not root's
    caller, uid = _caller(), v.account.pw_uid
    st = expected.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid not in (caller, uid):
        raise Refused(f"checkpoint directory {expected} belongs to uid {st.st_uid}, not to the wrapper")
    if st.st_uid != uid:
        os.chown(expected, uid, v.wrapper_gid)
        os.chmod(expected, 0o2770)
    for entry in expected.iterdir():
        est = entry.lstat()
        if est.st_uid == caller and stat.S_ISREG(est.st_mode):  # not the user's: a copy made for it
            os.chown(entry, uid, v.wrapper_gid)
            os.chmod(entry, 0o640)


def start(workdir: str, attempt_id: str) -> NoReturn:
    v = verify(workdir, attempt_id)
    _into_scope(v)
    a, account = v.attempt, v.account
    job = a.dir / JOB_SUBDIR
    try:
        job.mkdir(mode=0o700)  # once per attempt: a second start finds it
    except FileExistsError:
        raise Refused(f"attempt {attempt_id} was started already") from None
    os.chown(job, account.pw_uid, v.wrapper_gid)
    os.chmod(job, 0o2770)
    log_fd = os.open(job / nc.LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
    os.fchown(log_fd, account.pw_uid, v.wrapper_gid)
    _checkpoint_dir(v)
    env = {str(key): str(value) for key, value in (v.spec.get("env") or {}).items()}
    _enter_cgroups(v, log_fd, env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(
        HOME=account.pw_dir,
        USER=account.pw_name,
        LOGNAME=account.pw_name,
        SHELL=account.pw_shell or "/bin/sh",
        **{nc.ATTEMPT_DIR: str(job)},
    )
    cwd = str(v.spec.get("cwd") or job)
    argv = [str(x) for x in v.spec.get("argv") or []]
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.initgroups(account.pw_name, account.pw_gid)
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.umask(0o027)
    try:
        os.chdir(job if cwd == str(a.dir) else cwd)
        os.execvpe(argv[0], argv, env)
    except (OSError, IndexError) as exc:
        print(f"hopsmgr: cannot start {argv[:1]!r} as {account.pw_name}: {exc}", flush=True)
        os._exit(127)


def _limits(v: Verified) -> tuple[int | None, float | None]:
    """The spec's `mem_mb` (an integer >= 1) and `cpus` (a positive number), each None when absent."""
    mem_mb, cpus = v.spec.get("mem_mb"), v.spec.get("cpus")
    if mem_mb is not None and (isinstance(mem_mb, bool) or not isinstance(mem_mb, int) or mem_mb < 1):
        raise Refused(f"attempt {v.attempt.attempt_id}: mem_mb {mem_mb!r} is not an integer >= 1")
    if cpus is not None and (
        isinstance(cpus, bool) or not isinstance(cpus, int | float) or not math.isfinite(cpus) or cpus <= 0
    ):
        raise Refused(f"attempt {v.attempt.attempt_id}: cpus {cpus!r} is not a positive number")
    return mem_mb, cpus


def _start_again(v: Verified) -> list[str]:
    """This step's own start command for `v`: the interpreter as it was started (its options and the
    module or `-c` program the installed program gave it, everything before this program's own
    arguments), then the verified values, not what the caller passed."""
    own = len(sys.argv) - 1  # this program's arguments, at the end of the interpreter's command line
    head = sys.orig_argv[: len(sys.orig_argv) - own]
    if own < 1 or len(head) < 2 or sys.orig_argv[len(head) :] != sys.argv[1:]:
        raise Refused("cannot run itself again in its scope: its command line is not known")
    workdir, attempt = str(v.attempt.workdir), v.attempt.attempt_id
    return [sys.executable, *head[1:], "start", "--workdir", workdir, "--attempt", attempt]


def _into_scope(v: Verified) -> None:
    """Where systemd manages the cgroups, run this step again inside the attempt's new transient
    scope (hopsmgr.node.cgroup.scope_command), before anything is made; return once in it."""
    where = cgroup.hierarchies()
    cg = cgroup.attempt_cgroup(v.attempt.workdir, v.attempt.attempt_id, where)
    if cg is None or cg.unit is None or cgroup.in_scope(cg, where):
        return
    mem_mb, cpus = _limits(v)
    if (v.attempt.dir / JOB_SUBDIR).exists():
        raise Refused(f"attempt {v.attempt.attempt_id} was started already")
    try:
        cgroup.check_controllers(mem_mb, cpus, where)
        argv = cgroup.scope_command(cg, mem_mb, cpus, _start_again(v))
    except cgroup.CgroupError as exc:
        raise Refused(str(exc)) from None
    sys.stdout.flush()
    os.execv(argv[0], argv)


def _enter_cgroups(v: Verified, log_fd: int, env: dict[str, str]) -> None:
    """Put the step (and so the job it becomes) in the attempt's cgroups, with its limits and the
    rules that keep it off the node's other GPUs; refuse the attempt when a limit or the GPU fence
    cannot be set up (the reason also in the job's log); say in the job's log what is not enforced."""
    hierarchies = cgroup.hierarchies()
    cg = cgroup.attempt_cgroup(v.attempt.workdir, v.attempt.attempt_id, hierarchies)
    limits = _limits(v)
    rules = gpu_devices.rules_for(env, _gpu_listing(v.policy))
    fence = bool(rules.deny) and cg is not None and cgroup.enforces_devices(cg)
    notes: list[str] = []
    made: cgroup.Made | None = None

    def refuse(why: str) -> Refused:
        os.write(log_fd, f"hopsmgr: refused: {why}\n".encode())
        return Refused(why)

    try:
        if cg is None:
            raise cgroup.CgroupError("no cgroup hierarchy is mounted")
        made = cgroup.create(cg, *limits, deny_devices=rules.deny if fence else (), where=hierarchies)
        notes += made.notes
    except cgroup.CgroupError as exc:
        if limits != (None, None) or fence:
            raise refuse(str(exc)) from None
        notes.append(f"hopsmgr: no cgroup of its own ({exc}): stop reaches its process group only")
    if made is not None:
        try:
            cgroup.enter(made)
        except cgroup.CgroupError as exc:  # a stop removed them meanwhile: the job is not to run
            raise refuse(str(exc)) from None
    if fence:
        env[nc.VISIBLE_DEVICES] = rules.visible or ""  # CUDA now counts the granted GPUs alone
        notes += [rules.note] if rules.note else []
    elif rules.deny:
        if nc.VISIBLE_DEVICES not in env:
            env[nc.VISIBLE_DEVICES] = ""  # granted none: CUDA is asked to show none
        notes.append(
            "hopsmgr: the node's other GPUs are not fenced off for this job (neither a cgroup v1 "
            "devices hierarchy nor a cgroup v2 one to attach a device program to): only "
            "CUDA_VISIBLE_DEVICES "
            f"({env[nc.VISIBLE_DEVICES]!r}) asks CUDA to keep to the GPUs granted"
        )
    for note in notes:
        os.write(log_fd, f"{note}\n".encode())


def _leader_is(pid: int, uid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1]) == uid
    except (OSError, ValueError, IndexError):
        return False
    return False


def send_signal(workdir: str, attempt_id: str, name: str) -> dict[str, Any]:
    if name not in SIGNALS:
        raise Refused(f"signal {name!r} is not one of {', '.join(SIGNALS)}")
    v = verify(workdir, attempt_id, fenced=False)
    sig = SIGNALS[name]
    places = cgroup.attempt_cgroups(v.attempt.workdir, attempt_id)
    cg = next((c for c in places if c.members()), None) or next((c for c in places if c.exists()), None)
    if cg is not None and cg.members():  # else (set up failed, or not yet entered): its process group
        count = cgroup.send(cg, sig)
        if sig == signal.SIGKILL:
            cgroup.kill_and_remove(cg)
        return {"signalled": count, "cgroup": str(cg.dirs()[0])}
    if cg is not None and sig == signal.SIGKILL and cg.exists():
        cgroup.kill_and_remove(cg)  # empty leftovers of a start that failed
    record: Any = read_json(v.attempt.child)
    pid = record.get("pid") if isinstance(record, dict) else None
    if isinstance(pid, int) and pid > 1 and _leader_is(pid, v.account.pw_uid):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return {"signalled": 0, "cgroup": None}
        return {"signalled": 1, "cgroup": None}
    return {"signalled": 0, "cgroup": None}


def cleanup(workdir: str, attempt_id: str) -> dict[str, Any]:
    v = verify(workdir, attempt_id, fenced=False)
    for cg in cgroup.attempt_cgroups(v.attempt.workdir, attempt_id):
        if cg.exists():
            cgroup.kill_and_remove(cg)
    shutil.rmtree(v.attempt.dir / JOB_SUBDIR, ignore_errors=True)
    return {"cleaned": True}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hopsmgr-runas", description=__doc__)
    parser.add_argument("action", choices=("start", "signal", "cleanup"))
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--attempt", required=True)
    parser.add_argument("--signal", default="TERM")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            start(args.workdir, args.attempt)
        result = (
            send_signal(args.workdir, args.attempt, args.signal)
            if args.action == "signal"
            else cleanup(args.workdir, args.attempt)
        )
    except Refused as exc:
        print(f"hopsmgr-runas: refused: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    print(json.dumps(result), flush=True)
    return 0
