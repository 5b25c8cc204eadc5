"""Helpers for the node tests: polling with deadlines, running the wrapper, example paths, device files
for the GPU fence and a child process that opens them."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from hopsmgr.node import bpf_devices, cgroup
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


def bpf_refusal() -> str | None:
    """Why this host cannot fence devices with a cgroup v2 device program (not root, no cgroup2 mount,
    bpf(2) refused or absent), or None when it can."""
    if os.geteuid() != 0:
        return "needs root: it loads eBPF programs and makes cgroups"
    if cgroup.hierarchies().unified is None:
        return "no cgroup2 hierarchy is mounted"
    try:
        os.close(bpf_devices.load(bpf_devices.deny_program(195, [0])))
    except bpf_devices.BpfError as exc:
        if exc.errno in (errno.EPERM, errno.ENOSYS):
            return f"this host refuses bpf(2) (errno {errno.errorcode[exc.errno]}): {exc}"
        raise
    return None


def device_nodes(root: Path) -> dict[str, str]:
    """Character device files for the fence tests, by name: nvidia0-2 (195:0-2), nvidiactl (195:255)
    and null (1:3, /dev/null's numbers), made with mknod, mode 0666."""
    root.mkdir(exist_ok=True)
    os.chmod(root, 0o755)
    numbers = {
        "nvidia0": (195, 0),
        "nvidia1": (195, 1),
        "nvidia2": (195, 2),
        "nvidiactl": (195, 255),
        "null": (1, 3),
    }
    paths = {}
    for name, (major, minor) in numbers.items():
        path = root / name
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)
        paths[name] = str(path)
    return paths


def open_each(paths: Mapping[str, str]) -> dict[str, str]:
    """Open each file read-write: "opened", or the errno's name."""
    found = {}
    for name, path in paths.items():
        try:
            os.close(os.open(path, os.O_RDWR))
            found[name] = "opened"
        except OSError as exc:
            found[name] = errno.errorcode.get(exc.errno or 0, str(exc))
    return found


def open_in_child(
    paths: Mapping[str, str],
    *,
    move: Callable[[int], None] = lambda pid: None,
    enter: Callable[[], None] = lambda: None,
) -> dict[str, str]:
    """What `open_each(paths)` gives in a forked child that first waits for `move(its pid)` (e.g. a
    write to a cgroup's cgroup.procs) and then calls `enter()` itself."""
    go_read, go_write = os.pipe()
    out_read, out_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(go_write)
            os.close(out_read)
            if os.read(go_read, 1):
                enter()
                result: dict[str, str] = open_each(paths)
            else:
                result = {"error": "not moved"}
        except BaseException as exc:
            result = {"error": repr(exc)}
        try:
            os.write(out_write, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(go_read)
    os.close(out_write)
    chunks = []
    try:
        move(pid)
        os.write(go_write, b"x")
        while chunk := os.read(out_read, 65536):
            chunks.append(chunk)
    finally:
        os.close(go_write)
        os.close(out_read)
        os.waitpid(pid, 0)
    found: dict[str, str] = json.loads(b"".join(chunks))
    return found


def fake_driver(root: Path, minors_by_bus: dict[str, int]) -> Path:
    """/proc/driver/nvidia/gpus as the driver writes it: one directory per GPU, named by PCI bus id."""
    for bus, minor in minors_by_bus.items():
        (root / bus).mkdir(parents=True)
        (root / bus / "information").write_text(
            f"Model: \t\t Tesla V100-SXM2-16GB\nBus Type: \t PCIe\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    return root
