"""Verified checkpoints: `ckpt-<iteration>.pkl` plus a `.json` sidecar with its size and sha256.

A checkpoint is written atomically (temp file, fsync, rename), then its sidecar; the new pair is read
back and verified before older files are dropped: what stays is the new checkpoint and the newest
earlier one whose size matches its sidecar (`KEEP` = 2). Higher-numbered leftovers (a corrupt newest
that a resume skipped) and stray temp files go too. `load_latest` returns the newest checkpoint whose
bytes match its sidecar, falling back to older ones when the newest is truncated or corrupt.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopsmgr.runtime.files import atomic_write_bytes, atomic_write_json, read_json

KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{9,})\.json$")
_ANY = re.compile(r"^(ckpt-(\d{9,})\.(pkl|json)|\.tmp-ckpt-.*)$")


class CheckpointError(RuntimeError):
    """A checkpoint just written did not verify."""


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    data: Path
    sidecar: Path


def data_path(directory: Path, iteration: int) -> Path:
    return Path(directory) / f"ckpt-{iteration:09d}.pkl"


def sidecar_path(directory: Path, iteration: int) -> Path:
    return Path(directory) / f"ckpt-{iteration:09d}.json"


def list_checkpoints(directory: Path) -> list[Checkpoint]:
    """Checkpoints that have a sidecar, newest first (not verified)."""
    directory = Path(directory)
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            it = int(m.group(1))
            found.append(Checkpoint(it, data_path(directory, it), sidecar_path(directory, it)))
    return sorted(found, key=lambda c: c.iteration, reverse=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_verified(ckpt: Checkpoint) -> bytes | None:
    """The checkpoint's bytes when they match its sidecar's iteration, size and sha256, else None."""
    meta = read_json(ckpt.sidecar)
    if not isinstance(meta, dict) or meta.get("iteration") != ckpt.iteration:
        return None
    try:
        data = ckpt.data.read_bytes()
    except OSError:
        return None
    if meta.get("size") != len(data) or meta.get("sha256") != _digest(data):
        return None
    return data


def save(directory: Path, iteration: int, state: Any, work: float | None = None) -> Path:
    """Write a checkpoint of `state` at `iteration` (with the job's `work` done, in iterations at its
    smallest GPU count; `iteration` when not given), verify it, and drop all but the latest `KEEP`."""
    if iteration < 0:
        raise ValueError(f"checkpoint iteration must be >= 0, got {iteration}")
    work = float(iteration) if work is None else float(work)
    if not (work >= 0 and work != float("inf")):
        raise ValueError(f"checkpoint work must be a finite number >= 0, got {work}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"iteration": iteration, "work": work, "state": state}
    payload = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    ckpt = Checkpoint(iteration, data_path(directory, iteration), sidecar_path(directory, iteration))
    atomic_write_bytes(ckpt.data, payload)
    atomic_write_json(
        ckpt.sidecar, {"iteration": iteration, "size": len(payload), "sha256": _digest(payload)}
    )
    if read_verified(ckpt) is None:
        raise CheckpointError(f"checkpoint {ckpt.data} did not verify after writing")
    _prune(directory, ckpt)
    return ckpt.data


def _size_matches(ckpt: Checkpoint) -> bool:
    meta = read_json(ckpt.sidecar)
    try:
        return isinstance(meta, dict) and meta.get("size") == ckpt.data.stat().st_size
    except OSError:
        return False


def _prune(directory: Path, newest: Checkpoint) -> None:
    keep = {newest.iteration}
    earlier = [c for c in list_checkpoints(directory) if c.iteration < newest.iteration]
    for c in earlier:
        if len(keep) >= KEEP:
            break
        if _size_matches(c):
            keep.add(c.iteration)
    for path in directory.iterdir():
        m = _ANY.match(path.name)
        if m and (m.group(2) is None or int(m.group(2)) not in keep):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def load_latest(directory: Path | None) -> tuple[int, Any] | None:
    """(iteration, state) of the newest verified checkpoint in `directory`, or None if there is none."""
    found = load_latest_record(directory)
    return None if found is None else (found[0], found[2])


def load_latest_record(directory: Path | None) -> tuple[int, float, Any] | None:
    """(iteration, work, state) of the newest verified checkpoint in `directory`, or None if there is
    none; a checkpoint written before work was recorded gives its iteration as its work."""
    if directory is None:
        return None
    for ckpt in list_checkpoints(Path(directory)):
        data = read_verified(ckpt)
        if data is None:
            continue
        try:
            payload = pickle.loads(data)
        except Exception:
            continue
        if isinstance(payload, dict) and payload.get("iteration") == ckpt.iteration:
            work = payload.get("work", ckpt.iteration)
            if isinstance(work, bool) or not isinstance(work, int | float) or not 0 <= work < float("inf"):
                work = ckpt.iteration
            return ckpt.iteration, float(work), payload.get("state")
    return None
