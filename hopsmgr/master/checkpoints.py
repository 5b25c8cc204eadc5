"""Moving a job's latest verified checkpoint between nodes that share no filesystem.

With `[master] checkpoint_shared = false` each node keeps a job's checkpoints under its own work
directory, at `<workdir>/checkpoints/<job id>` (`node_checkpoint_dir`; the wrapper's default when a
launch gives no --checkpoint-dir, see hopsmgr.node.ops.launch). Before the job resumes on another node
the master calls `move_latest(executor, src, dst, job_id)`:

- an executor with `copy_checkpoint` (the SSH executor) copies over SFTP through the master;
- any other executor (the local one: every node's work directory is a local path) copies here with
  `copy_local`.

Both pick the newest checkpoint of the source whose bytes match its sidecar (iteration, size, sha256:
hopsmgr.runtime.checkpoint's format), hashing while they read, skip newer ones that do not verify,
write the data under a temp name in the destination (`.tmp-ckpt-...`, which the runtime's pruning
removes if left behind), fsync it and check its size, rename it into place, then write the sidecar
last, so the destination never shows a sidecar without its whole data file. Nothing on the source is
ever changed. No verified checkpoint raises `ExecutorError("failed")`: the caller resumes the job from
the start and records why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hopsmgr.master.executor import ExecutorError, NodeTarget
from hopsmgr.node.layout import BadRequest, validate_id
from hopsmgr.runtime.files import fsync_dir

CHECKPOINTS = "checkpoints"
CHUNK = 8 << 20  # bytes per read/write (SFTP splits it into parallel requests)
MAX_SIDECAR = 64 << 10
_SIDECAR = re.compile(r"^ckpt-(\d{9,})\.json$")


def node_checkpoint_dir(workdir: str, job_id: str) -> str:
    """A job's checkpoint directory on a node: `<workdir>/checkpoints/<job id>` (a POSIX path)."""
    return posixpath.join(workdir, CHECKPOINTS, checked_job_id(job_id))


def checked_job_id(job_id: str) -> str:
    try:
        return validate_id("job", job_id)
    except BadRequest as exc:
        raise ExecutorError("failed", str(exc)) from None


@dataclass(frozen=True, slots=True)
class Sidecar:
    """What a checkpoint's `.json` sidecar promises about its data file."""

    iteration: int
    size: int
    sha256: str
    raw: bytes  # the sidecar's bytes, copied verbatim

    @property
    def data_name(self) -> str:
        return f"ckpt-{self.iteration:09d}.pkl"

    @property
    def name(self) -> str:
        return f"ckpt-{self.iteration:09d}.json"


def candidates(names: Iterable[str]) -> list[tuple[int, str]]:
    """(iteration, sidecar name) of every checkpoint sidecar among `names`, newest first."""
    found = [(int(m.group(1)), n) for n in names if (m := _SIDECAR.match(n))]
    return sorted(found, reverse=True)


def parse_sidecar(iteration: int, raw: bytes) -> Sidecar | None:
    """The sidecar when it is well formed and names `iteration`; else None."""
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("iteration") != iteration:
        return None
    size, digest = meta.get("size"), meta.get("sha256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or not isinstance(digest, str):
        return None
    return Sidecar(iteration, size, digest, raw)


def temp_name(final: str) -> str:
    """A temp name beside `final` that hopsmgr.runtime.checkpoint prunes if a copy is cut short."""
    return f".tmp-{final}.{secrets.token_hex(4)}"


def result(
    sidecar: Sidecar, src_dir: str, dst_dir: str, seconds: float, skipped: list[str]
) -> dict[str, Any]:
    """The reply of a copy: what moved, how much, how fast (MB = 10^6 bytes)."""
    return {
        "file": sidecar.data_name,
        "iteration": sidecar.iteration,
        "bytes": sidecar.size,
        "seconds": seconds,
        "mb_per_s": sidecar.size / 1e6 / seconds if seconds > 0 else 0.0,
        "src_dir": src_dir,
        "dst_dir": dst_dir,
        "skipped": skipped,
    }


@dataclass(frozen=True, slots=True)
class MoveResult:
    file: str  # the data file's name, e.g. ckpt-000001200.pkl
    iteration: int
    bytes: int
    seconds: float
    mb_per_s: float
    src_dir: str
    dst_dir: str
    skipped: tuple[str, ...] = field(default=())  # newer checkpoints that did not verify on the source

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> MoveResult:
        return cls(
            file=str(reply["file"]),
            iteration=int(reply["iteration"]),
            bytes=int(reply["bytes"]),
            seconds=float(reply["seconds"]),
            mb_per_s=float(reply["mb_per_s"]),
            src_dir=str(reply["src_dir"]),
            dst_dir=str(reply["dst_dir"]),
            skipped=tuple(str(s) for s in reply.get("skipped", ())),
        )


async def move_latest(
    executor: object, src: NodeTarget, dst: NodeTarget, job_id: str, *, spool_dir: str | None = None
) -> MoveResult:
    """Copy `job_id`'s newest verified checkpoint from node `src` to node `dst` (see the module doc).

    `spool_dir` is where the SSH executor keeps the master's temp copy (default: the system temp dir).
    Raises ExecutorError: "failed" when the source holds no verified checkpoint (resume from the start)
    or a file operation failed; "unreachable", "auth", "hostkey" as for any SSH command.
    """
    copy = getattr(executor, "copy_checkpoint", None)
    if copy is not None:
        reply = await copy(src, dst, job_id, spool_dir=spool_dir)
    else:
        src_dir = node_checkpoint_dir(src.workdir, job_id)
        dst_dir = node_checkpoint_dir(dst.workdir, job_id)
        reply = await asyncio.to_thread(copy_local, src_dir, dst_dir)
    return MoveResult.from_reply(reply)


# -- the local copy (every node's work directory is a path on this machine) --------------------------


def copy_local(src_dir: str | Path, dst_dir: str | Path) -> dict[str, Any]:
    """Copy the newest verified checkpoint of `src_dir` into `dst_dir` (created if missing).

    Returns the `result` dict; raises ExecutorError("failed") when none verifies or a file operation
    fails. `src_dir` is only read.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    started = time.monotonic()
    try:
        names = [p.name for p in src.iterdir()]
    except FileNotFoundError:
        raise ExecutorError("failed", f"no checkpoint directory {src}") from None
    except OSError as exc:
        raise ExecutorError("failed", f"cannot list {src}: {exc.strerror or exc}") from None
    skipped: list[str] = []
    try:
        for iteration, name in candidates(names):
            sidecar = _read_local_sidecar(src / name, iteration)
            if sidecar is None:
                skipped.append(name)
                continue
            if _copy_verified(src / sidecar.data_name, dst, sidecar):
                return result(sidecar, str(src), str(dst), time.monotonic() - started, skipped)
            skipped.append(sidecar.data_name)
    except OSError as exc:
        raise ExecutorError("failed", f"copying a checkpoint to {dst}: {exc.strerror or exc}") from None
    raise ExecutorError("failed", f"no verified checkpoint in {src} (not verified: {skipped or 'none'})")


def _read_local_sidecar(path: Path, iteration: int) -> Sidecar | None:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SIDECAR + 1)
    except OSError:
        return None
    return parse_sidecar(iteration, raw) if len(raw) <= MAX_SIDECAR else None


def _copy_verified(data: Path, dst: Path, sidecar: Sidecar) -> bool:
    """Copy `data` into `dst` when its bytes match `sidecar`; False (nothing left behind) when not."""
    try:
        if data.stat().st_size != sidecar.size:
            return False
    except FileNotFoundError:
        return False
    dst.mkdir(parents=True, exist_ok=True)
    tmp = dst / temp_name(sidecar.data_name)
    digest, size = hashlib.sha256(), 0
    try:
        with open(data, "rb") as source, open(tmp, "xb") as out:
            while size <= sidecar.size and (chunk := source.read(CHUNK)):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if size != sidecar.size or digest.hexdigest() != sidecar.sha256 or tmp.stat().st_size != size:
            tmp.unlink()
            return False
        os.replace(tmp, dst / sidecar.data_name)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _write_durably(dst, sidecar.name, sidecar.raw)
    fsync_dir(dst)
    return True


def _write_durably(directory: Path, name: str, data: bytes) -> None:
    tmp = directory / temp_name(name)
    try:
        with open(tmp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
