"""A framework's checkpoint (a directory or one file) carried inside a hopsmgr checkpoint.

Hugging Face and Lightning save their own checkpoints (a directory, a file); the integrations put
those bytes into the runtime's verified `ckpt-<iteration>.pkl` (hopsmgr.runtime.checkpoint), so a
framework checkpoint is verified, pruned and moved between nodes like any other, and unpack it again
when an attempt resumes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT_KEY = "hopsmgr_bundle"


def pack_dir(directory: Path | str) -> dict[str, bytes]:
    """Every regular file under `directory`, by its relative POSIX path (symbolic links left out)."""
    root = Path(directory)
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def _safe(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if rel.is_absolute() or not rel.parts or ".." in rel.parts:
        raise ValueError(f"bundle file name {name!r} is not a relative path inside the bundle")
    return rel


def unpack_dir(files: dict[str, bytes], dest: Path | str) -> Path:
    """Write `files` into directory `dest` (replacing it whole: readers never see a part)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}.", dir=dest.parent))
    try:
        for name, data in files.items():
            target = staging.joinpath(*_safe(name).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def bundle(kind: str, step: int, files: dict[str, bytes]) -> dict[str, Any]:
    """The state a runtime checkpoint holds for a framework checkpoint of `kind` at `step`."""
    return {FORMAT_KEY: kind, "step": step, "files": files}


def unbundle(state: Any, kind: str) -> tuple[int, dict[str, bytes]] | None:
    """(step, files) of a bundle of `kind`; None when `state` is not one (e.g. no checkpoint yet)."""
    if not isinstance(state, dict) or state.get(FORMAT_KEY) != kind:
        return None
    step, files = state.get("step"), state.get("files")
    if not isinstance(step, int) or not isinstance(files, dict):
        return None
    return step, files
