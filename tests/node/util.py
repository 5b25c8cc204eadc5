"""Helpers for the node tests: polling with deadlines, running the wrapper, example paths."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from hopsmgr.node.layout import is_alive
from hopsmgr.runtime.files import read_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EMULATED = EXAMPLES / "emulated_train.py"
FAIL = EXAMPLES / "fail_train.py"
PY = sys.executable
T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wrapper(*args: str, timeout: float = 40.0) -> tuple[int, dict[str, Any]]:
    """Run `python -m hopsmgr.node.wrapper ARGS`; (exit code, the one JSON object it printed)."""
    proc = subprocess.run(
        [PY, "-m", "hopsmgr.node.wrapper", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line, got {proc.stdout!r} (stderr {proc.stderr!r})"
    return proc.returncode, json.loads(lines[0])


def run_script(
    argv: list[str], env: Mapping[str, str], timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOPS_")}
    full.update(env)
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def load_example(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_checksum(iters: int, seed: int = 0) -> int:
    """What emulated_train prints for an uninterrupted run of `iters` iterations."""
    advance = load_example(EMULATED).advance
    checksum = seed
    for it in range(iters):
        checksum = advance(checksum, it, seed)
    return int(checksum)


def kill_leftovers(workdir: Path) -> None:
    """SIGKILL any job process group and monitor a test left running under `workdir`."""
    for attempt in (workdir / "attempts").glob("*"):
        for name, group in (("child.json", True), ("monitor.json", False)):
            rec = read_json(attempt / name)
            if isinstance(rec, dict) and is_alive(rec.get("pid"), rec.get("start")):
                try:
                    if group:
                        os.killpg(rec["pid"], signal.SIGKILL)
                    else:
                        os.kill(rec["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
