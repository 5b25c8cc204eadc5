"""Atomic file writes (temp file, fsync, rename) and tolerant JSON reads, shared by runtime and node."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TEMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (best effort: some filesystems refuse a directory fsync)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True, mode: int | None = None) -> None:
    """Write `data` to `path` so a reader sees either the old file or the whole new one, never a part.

    The data goes to a temp file in the same directory, is fsynced (when `durable`), then renamed over
    `path`. On any error the temp file is removed. The file is 0600 unless `mode` says otherwise.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True, mode: int | None = None) -> None:
    """`atomic_write_bytes` of `obj` as JSON (sorted keys, one trailing newline)."""
    text = json.dumps(obj, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable, mode=mode)


def read_json(path: Path) -> Any | None:
    """The JSON value in `path`, or None when the file is missing, unreadable or not valid JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
