"""A node's work directory: attempt paths, id checks, epoch fencing, and process identity.

Layout: `WORK/epoch` (highest master epoch seen), `WORK/attempts/<attempt>/` with `spec.json`, `pid`,
`child.json`, `monitor.json`, `log`, `progress.json`, `profile.json`, `exit.json` and
`checkpoint.request`. An attempt that runs as another Unix account (`launch --run-as`) keeps the
files its job writes (log, progress.json, profile.json, checkpoint.request) in `job/`, a directory of
that account's (hopsmgr.node.runas); the rest (the wrapper's bookkeeping) stays the wrapper's own, out
of the job's reach. Processes are identified by pid and start time (from /proc where it exists),
so a recycled pid is never taken for the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopsmgr import nodecontract as nc
from hopsmgr.runtime.files import atomic_write_bytes, read_json

ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
JOB_SUBDIR = "job"
RUN_AS_FILE = "run_as"  # the account an isolated attempt runs as (written with its spec)
JOB_FILES = frozenset({nc.LOG_FILE, nc.PROGRESS_FILE, nc.PROFILE_FILE, nc.REQUEST_FILE})


class WrapperError(Exception):
    """A command failed; `exit_code` is what the CLI exits with."""

    exit_code = 1


class BadRequest(WrapperError):
    exit_code = 2


class StaleEpoch(WrapperError):
    exit_code = 3


class UnknownAttempt(WrapperError):
    exit_code = 4


class Conflict(WrapperError):
    exit_code = 5


def validate_id(field: str, value: object) -> str:
    """`value` when it is a safe id (1-64 of A-Z a-z 0-9 . _ -, not starting with '.'); else BadRequest."""
    if not isinstance(value, str) or not ID_PATTERN.match(value) or value.startswith("."):
        raise BadRequest(
            f"{field} {value!r} is not a valid id: use 1-64 characters from A-Z a-z 0-9 . _ -, "
            "not starting with '.'"
        )
    return value


def validate_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise BadRequest(f"epoch {epoch!r} must be an integer >= 0")
    return epoch


@dataclass(frozen=True)
class Attempt:
    """Paths of one attempt under a node work directory (ids already validated)."""

    workdir: Path
    attempt_id: str

    @property
    def dir(self) -> Path:
        return attempts_dir(self.workdir) / self.attempt_id

    @property
    def job_dir(self) -> Path:
        """Where the job's own files are: `job/` for an attempt run as another account, else the
        attempt directory itself."""
        sub = self.dir / JOB_SUBDIR
        return sub if sub.is_dir() or self.isolated else self.dir

    @property
    def isolated(self) -> bool:
        """Whether the attempt runs as another Unix account (its spec names one)."""
        return (self.dir / RUN_AS_FILE).exists()

    def file(self, name: str) -> Path:
        return (self.job_dir if name in JOB_FILES else self.dir) / name

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def pid(self) -> Path:
        return self.dir / "pid"

    @property
    def child(self) -> Path:
        return self.dir / "child.json"

    @property
    def monitor(self) -> Path:
        return self.dir / "monitor.json"

    @property
    def log(self) -> Path:
        return self.job_dir / nc.LOG_FILE

    @property
    def exit(self) -> Path:
        return self.dir / nc.EXIT_FILE

    @property
    def request(self) -> Path:
        return self.job_dir / nc.REQUEST_FILE

    @property
    def monitor_log(self) -> Path:
        """The monitor's own messages where the job's log is not the wrapper's to write."""
        return self.dir / "monitor.log"


def attempts_dir(workdir: Path) -> Path:
    return Path(workdir) / "attempts"


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


# --- epoch fencing ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(workdir: Path) -> Iterator[None]:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_epoch(workdir: Path) -> int:
    """The highest master epoch this node has seen (0 when none)."""
    return read_pid(Path(workdir) / "epoch") or 0


def fence(workdir: Path, epoch: int) -> int:
    """Refuse (StaleEpoch) an epoch below the node's; record a higher one. Returns the node's epoch."""
    epoch = validate_epoch(epoch)
    workdir = Path(workdir)
    with _locked(workdir):
        current = read_epoch(workdir)
        if epoch < current:
            raise StaleEpoch(f"epoch {epoch} is stale: this node has seen epoch {current}")
        if epoch > current:
            atomic_write_bytes(workdir / "epoch", f"{epoch}\n".encode("ascii"))
        return epoch


# --- process identity ------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc/<pid>/stat, or None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def proc_start(pid: int) -> int | None:
    """The start time of `pid` (clock ticks since boot), or None where /proc is not available."""
    st = _stat(pid)
    return st[1] if st else None


def process_record(pid: int) -> dict[str, Any]:
    return {"pid": pid, "start": proc_start(pid)}


def is_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, when `start` is known, is the same process as recorded."""
    if pid is None or pid <= 0:
        return False
    st = _stat(pid)
    if st is not None:
        return st[0] not in ("Z", "X") and (start is None or st[1] == start)
    if Path("/proc/self/stat").exists():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_alive(path: Path) -> tuple[int | None, bool]:
    """(pid, alive) for a `{"pid", "start"}` record file; (None, False) when there is none."""
    rec = read_json(path)
    if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int):
        return None, False
    start = rec.get("start")
    return rec["pid"], is_alive(rec["pid"], start if isinstance(start, int) else None)
