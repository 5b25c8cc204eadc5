"""The master under test: its accepting executor, the child process that runs it, and its start and stop.

Part of bench/master_load.py (run that script, not this module). The master runs as a child process,
`python bench/master_load.py --serve CONFIG STATE_DIR` (SCRIPT), which calls `serve` here: the real
master with `AcceptingExecutor`, which accepts every launch at once and tells the benchmark of it over
a Unix socket. `cluster_toml` writes the cluster file (server groups of GPU_TYPES, three tenants),
`start_master` starts the child and waits for its URL and tokens, `stop_master` ends it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hopsmgr.master.executor import ExecutorError, ExitInfo, LaunchOrder, NodeTarget

GPU_TYPES = ("v100", "p100", "k80", "a100")
SCRIPT = str(Path(__file__).resolve().with_name("master_load.py"))  # its --serve runs the master


class AcceptingExecutor:
    """Executor for the benchmark: launches are accepted at once; the emulated nodes report them."""

    name = "bench-accept"

    def __init__(self, launches: str = "") -> None:
        self.launches = launches  # the bench's Unix socket, told of each launch ("": not told)
        self.writer: asyncio.StreamWriter | None = None
        self.connecting = asyncio.Lock()  # launches run concurrently: one connection for all

    async def launch(self, target: NodeTarget, order: LaunchOrder) -> None:
        if not self.launches:
            return
        try:
            async with self.connecting:
                if self.writer is None or self.writer.is_closing():
                    self.writer = (await asyncio.open_unix_connection(self.launches))[1]
            line = {"node": target.node, "attempt": order.attempt, "job": order.job}
            self.writer.write(json.dumps({**line, "profiling": order.mode == "profile"}).encode() + b"\n")
        except OSError as exc:  # the benchmark is gone: a launch failure the master handles (and logs)
            raise ExecutorError("unreachable", f"the benchmark's launch socket: {exc!r}") from exc

    async def checkpoint(
        self,
        target: NodeTarget,
        attempt: str,
        epoch: int,
        wait_s: float,
        grace_s: float,
        signal_name: str = "SIGUSR1",
    ) -> ExitInfo | None:
        return ExitInfo(code=75, checkpointed=True)

    async def stop(self, target: NodeTarget, attempt: str, epoch: int, grace_s: float) -> ExitInfo | None:
        return ExitInfo(code=None, signal=15)

    async def logs(self, target: NodeTarget, attempt: str, tail: int) -> str:
        return ""

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def serve(config_path: str, state_dir: str) -> int:
    """The child: mirrors hopsmgr.master.server.serve with the accepting executor, until SIGTERM."""
    from hopsmgr.config import load_cluster_config
    from hopsmgr.logs import configure_logging
    from hopsmgr.master.server import MasterProcess, freeze_started_state, tune_gc

    configure_logging(json_logs=True)
    watch_ms = float(os.environ.get("HOPS_LOOPWATCH_MS", "0"))
    if watch_ms:
        sys.path.insert(0, str(Path(SCRIPT).parent))
        import loopwatch

        loopwatch.watch(watch_ms)

    async def run() -> None:
        config = load_cluster_config(config_path)
        tune_gc()
        executor = AcceptingExecutor(os.environ.get("HOPS_BENCH_LAUNCHES", ""))
        master = MasterProcess(config, Path(state_dir), executor=executor)
        await master.start()
        freeze_started_state()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        if watch_ms:
            loop.add_signal_handler(signal.SIGUSR1, loopwatch.reset)  # phase 2 starts
        await stopping.wait()
        if watch_ms:
            (Path(state_dir) / "loopwatch.json").write_text(json.dumps(loopwatch.report(), indent=1))
        await master.stop()

    asyncio.run(run())
    return 0


def cluster_toml(agents: int, gpus: int, round_s: float) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The cluster file, the (server id, gpu type) list and the tenant names."""
    lines: list[str] = ['[cluster]\nname = "bench"\n']
    servers: list[tuple[str, str]] = []
    for i, gpu_type in enumerate(GPU_TYPES):
        count = agents // len(GPU_TYPES) + (1 if i < agents % len(GPU_TYPES) else 0)
        for chunk in range(0, count, 1024):
            n = min(1024, count - chunk)
            prefix = f"{gpu_type}-{chunk // 1024}-"
            lines.append(f'[[server_groups]]\nprefix = "{prefix}"\ncount = {n}\n')
            lines.append(f'gpu_type = "{gpu_type}"\ngpus = {gpus}\nhost_model = "bench"\n')
            servers += [(f"{prefix}{k:02d}", gpu_type) for k in range(1, n + 1)]
    total = agents * gpus
    tenants = [("vision", total * 3 // 10, 0), ("nlp", total * 3 // 10, 0)]
    tenants.append(("students", total // 10, max(8, total * 4 // 10)))  # caps stay >= 8 GPUs
    for name, guaranteed, cap in tenants:
        lines.append(f'[[tenants]]\nname = "{name}"\nguaranteed_gpus = {guaranteed}\n')
        lines.append(f"cap_gpus = {cap}\nweight = 0.5\n" if cap else "weight = 1.0\n")
    lines.append(f"[scheduler]\nround_seconds = {float(round_s)}\n")
    lines.append('[master]\nlisten = "127.0.0.1:0"\nheartbeat_interval_s = 5.0\n')
    lines.append("suspect_after_s = 30.0\nlost_after_s = 120.0\n")
    return "\n".join(lines), servers, [t[0] for t in tenants]


def start_master(
    workdir: Path, loopwatch_ms: float = 0.0, launches: str = ""
) -> tuple[subprocess.Popen[bytes], str, str, str]:
    state = workdir / "state"
    log = (workdir / "master.log").open("wb")
    cmd = [sys.executable, SCRIPT, "--serve", str(workdir / "cluster.toml"), str(state)]
    env = {**os.environ, "HOPS_LOOPWATCH_MS": str(loopwatch_ms), "HOPS_BENCH_LAUNCHES": launches}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    url = ""
    while not url:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            tail = (workdir / "master.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the master did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.1)
        with contextlib.suppress(OSError, ValueError, KeyError):  # absent or half written
            url = json.loads((state / "master.json").read_text())["url"]
    admin = (state / "admin.token").read_text().strip()
    cluster = (state / "cluster.token").read_text().strip()
    return proc, url, admin, cluster


def stop_master(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
