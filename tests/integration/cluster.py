"""A real local cluster for integration tests: a master process, agent processes, the CLI and HTTP.

Everything runs as real processes on 127.0.0.1 in a temporary directory: `hopsmgr master` with a
temporary SQLite file, one `hopsmgr-agent` per node in emulated-device mode, jobs started by the local
executor through the node wrapper. Waiting is always `wait_for(predicate, deadline)`, never a blind sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
EXAMPLE = str(REPO / "examples" / "emulated_train.py")
FAIL_EXAMPLE = str(REPO / "examples" / "fail_train.py")


@dataclass
class Node:
    id: str
    gpu_type: str
    gpus: int
    speed: float = 1.0
    devices: str = "emulated"  # "cpu" or "nvml": measured devices (tests/integration/test_real_node.py)


@dataclass
class LocalCluster:
    root: Path
    nodes: list[Node]
    tenants: str = ""
    scheduler: str = ""
    master_extra: str = ""
    # extra environment of the master process (e.g. {"HOPSMGR_FAULT": "launch.after_store"}, see
    # hopsmgr.master.faults) and a command the master runs under (e.g. ["prlimit", "--fsize=N"])
    master_env: dict[str, str] = field(default_factory=dict)
    master_prefix: list[str] = field(default_factory=list)
    master: subprocess.Popen[bytes] | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    def write_config(self) -> Path:
        lines = ["[cluster]", 'name = "it"']
        for n in self.nodes:
            lines += ["[[servers]]", f'id = "{n.id}"', f'gpu_type = "{n.gpu_type}"', f"gpus = {n.gpus}"]
        lines += ["[scheduler]", "round_seconds = 2", "min_attempt_s = 0", self.scheduler]
        lines += [
            "[master]",
            'listen = "127.0.0.1:0"',
            "heartbeat_interval_s = 0.3",
            "suspect_after_s = 1.5",
            "lost_after_s = 4",
            "stop_grace_s = 10",
            self.master_extra,
        ]
        lines.append(self.tenants)
        path = self.root / "cluster.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- processes ------------------------------------------------------------------------------------

    def start_master(self) -> None:
        """Start the master (same port as before, if any) and wait for /healthz. A master started with a
        crash point (`master_env["HOPSMGR_FAULT"]`) may exit on its own before it answers: then this
        returns once it exited; any other early exit fails with the master's exit code."""
        config = self.root / "cluster.toml"
        if not config.exists():
            self.write_config()
        info = self.state_dir / "master.json"
        if info.exists():
            info.unlink()
        listen = (
            ["--listen", f"127.0.0.1:{self.url.rsplit(':', 1)[1]}"] if self.url else []
        )  # same port again
        with open(self.root / "master.log", "ab") as log:  # the child keeps its own descriptor
            self.master = subprocess.Popen(
                [
                    *self.master_prefix,
                    PYTHON,
                    "-m",
                    "hopsmgr.cli.main",
                    "master",
                    "--config",
                    str(config),
                    "--state-dir",
                    str(self.state_dir),
                    "--json-logs",
                    *listen,
                ],
                stdout=log,
                stderr=log,
                cwd=self.root,
                env={**os.environ, **self.master_env} if self.master_env else None,
            )
        master = self.master

        def exited() -> bool:
            code = master.poll()
            if code is not None and not self.master_env.get("HOPSMGR_FAULT"):
                raise AssertionError(f"the master exited with {code} while starting (see master.log)")
            return code is not None

        def listening() -> bool:
            try:
                return bool(json.loads(info.read_text() or "{}").get("pid") == master.pid)
            except (OSError, json.JSONDecodeError):
                return False

        wait_for(lambda: listening() or exited(), 20, "master.json")
        if listening():
            self.url = json.loads(info.read_text())["url"]
        if exited():
            return
        wait_for(lambda: self.healthz() is not None or exited(), 20, "master /healthz")

    def wait_master_exit(self, timeout: float) -> int:
        """Wait until the master process exits by itself (a crash point fired); its exit code."""
        assert self.master is not None
        master = self.master
        wait_for(lambda: master.poll() is not None, timeout, "the master to exit")
        self.master = None
        return int(master.returncode)

    def kill_master(self, sig: int = signal.SIGKILL) -> None:
        assert self.master is not None
        self.master.send_signal(sig)
        self.master.wait(20)
        self.master = None

    def start_agent(self, node_id: str, master_url: str | None = None) -> None:
        """Start a node's agent; `master_url` (default: the master's) lets it talk through a proxy."""
        node = next(n for n in self.nodes if n.id == node_id)
        cfg = self.root / f"agent-{node_id}.toml"
        cfg.write_text(
            f'node = "{node.id}"\nmaster = "{master_url or self.url}"\n'
            f'cluster_token_file = "{self.state_dir / "cluster.token"}"\n'
            f'workdir = "{self.root / "nodes" / node.id}"\ndevices = "{node.devices}"\n'
            + (
                f'[emulated]\ngpu_type = "{node.gpu_type}"\ncount = {node.gpus}\nspeed = {node.speed}\n'
                if node.devices == "emulated"
                else "calibration_budget_s = 20\n"  # measured devices: a short calibration run
                + (
                    f'[cpu]\ngpu_type = "{node.gpu_type}"\ncount = {node.gpus}\n'
                    if node.devices == "cpu"
                    else ""
                )
            )
        )
        with open(self.root / f"agent-{node_id}.log", "ab") as log:
            self.agents[node_id] = subprocess.Popen(
                [PYTHON, "-m", "hopsmgr_agent.main", "--config", str(cfg), "--json-logs"],
                stdout=log,
                stderr=log,
            )

    def stop_agent(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.agents.pop(node_id)
        proc.send_signal(sig)
        proc.wait(20)

    def start(self) -> LocalCluster:
        self.start_master()
        for n in self.nodes:
            self.start_agent(n.id)
        wait_for(
            lambda: all(x["health"] == "HEALTHY" for x in self.api("GET", "/api/v1/nodes")["nodes"]),
            20,
            "nodes healthy",
        )
        return self

    def close(self) -> None:
        for node_id in list(self.agents):
            self.stop_agent(node_id, signal.SIGTERM)
        if self.master is not None:
            self.kill_master(signal.SIGTERM)
        # jobs are detached from the master: stop whatever still runs in the node work dirs
        for pidfile in self.root.glob("nodes/*/attempts/*/pid"):
            with contextlib.suppress(ValueError, OSError):
                os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)

    # -- clients --------------------------------------------------------------------------------------

    def healthz(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return None

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        tok = self.admin_token if token is None else token
        if tok:
            req.add_header("Authorization", f"Bearer {tok}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw)
        except json.JSONDecodeError:
            return status, raw.decode()

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        status, data = self.request(method, path, body, token)
        assert status < 300, f"{method} {path} -> {status}: {data}"
        return data

    def cli(
        self, *args: str, token: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HOPSMGR_URL": self.url,
            "HOPSMGR_TOKEN": self.admin_token if token is None else token,
        }
        proc = subprocess.run(
            [PYTHON, "-m", "hopsmgr.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
        )
        if check:
            assert proc.returncode == 0, (
                f"hopsmgr {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def submit(
        self,
        *,
        gpus: str = "1",
        iters: int = 40,
        step: float = 0.05,
        tenant: str | None = None,
        name: str = "job",
        token: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> str:
        args = ["submit", "--gpus", gpus, "--batch-size", "8", "--iters", str(iters), "--name", name]
        if tenant:
            args += ["--tenant", tenant]
        args += [
            "--",
            PYTHON,
            EXAMPLE,
            "--iters",
            str(iters),
            "--batch-size",
            "8",
            "--step-seconds",
            str(step),
            *extra,
        ]
        return self.cli(*args, token=token).stdout.strip()

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/api/v1/jobs/{job_id}"))

    def wait_state(self, job_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        wait_for(
            lambda: self.job(job_id)["state"] in states,
            timeout,
            f"{job_id} in {states}",
            lambda: self.job(job_id),
        )
        return self.job(job_id)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, show: Callable[[], Any] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    detail = f"; last: {show()}" if show else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
