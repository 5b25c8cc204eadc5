"""A whole hopsmgr cluster on this machine: one master and one emulated-device agent per server.

`LocalCluster.start` writes the agent configs, starts `hopsmgr master` and the agents as processes in
their own sessions, waits until every node is healthy, and records what it started in `<dir>/run.json`,
so `hopsmgr down` (`stop_recorded`) can stop them later, from another process. Agents run in
emulated-device mode (labelled as such in every report): each server's speed is its calibration hint
`compute_factor` when the config gives one, else a nominal figure for its GPU type (`EMULATED_SPEED`).
Jobs started on the nodes run from `<dir>/nodes/<server id>`; stopping the cluster stops them too.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hopsmgr.config import ClusterConfig
from hopsmgr.node import runas
from hopsmgr.node.layout import Attempt, is_alive

# Relative fp32 throughput of common GPU types (V100 = 1), from vendor datasheet peak figures; used only
# to give emulated servers plausible, different speeds.
EMULATED_SPEED = {
    "k80": 0.3,
    "p100": 0.6,
    "t4": 0.55,
    "v100": 1.0,
    "rtx3090": 2.3,
    "a100": 1.3,
    "l40s": 5.8,
    "h100": 3.8,
    "h200": 3.8,
}


class LocalClusterError(RuntimeError):
    """The local cluster could not start (the message says which part and where its log is)."""


def emulated_speed(config: ClusterConfig, server_id: str) -> float:
    server = next(s for s in config.servers if s.id == server_id)
    if server.calibration.source == "hint" and server.calibration.compute_factor != 1.0:
        return server.calibration.compute_factor
    return EMULATED_SPEED.get(server.gpu_type, 1.0)


@dataclass
class LocalCluster:
    config_path: Path
    config: ClusterConfig
    root: Path
    python: str = sys.executable
    master: subprocess.Popen[bytes] | None = None
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    def start(self, timeout_s: float = 60.0) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        info = self.state_dir / "master.json"
        with contextlib.suppress(FileNotFoundError):
            info.unlink()
        argv = [self.python, "-m", "hopsmgr.cli.main", "master", "--config", str(self.config_path)]
        self.master = self._spawn("master", [*argv, "--state-dir", str(self.state_dir), "--json-logs"])
        deadline = time.monotonic() + timeout_s
        while not (info.exists() and json.loads(info.read_text() or "{}").get("pid") == self.master.pid):
            self._check_alive(self.master, "master")
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"the master did not start within {timeout_s:.0f} s; see {self.root}/master.log"
                )
            time.sleep(0.1)
        self.url = json.loads(info.read_text())["url"]
        for server in self.config.servers:
            self.start_agent(server.id)
        self._record()
        while True:
            nodes = self.get("/api/v1/nodes")["nodes"]
            if all(n["health"] == "HEALTHY" for n in nodes):
                return self.url
            for node_id, proc in self.agents.items():
                self._check_alive(proc, f"agent {node_id}")
            if time.monotonic() > deadline:
                late = [n["id"] for n in nodes if n["health"] != "HEALTHY"]
                raise LocalClusterError(
                    f"agents {late} did not report within {timeout_s:.0f} s; see {self.root}"
                )
            time.sleep(0.2)

    def start_agent(self, node_id: str) -> None:
        server = next(s for s in self.config.servers if s.id == node_id)
        path = self.root / f"agent-{node_id}.toml"
        path.write_text(
            f'node = "{node_id}"\nmaster = "{self.url}"\n'
            f'cluster_token_file = "{self.state_dir / "cluster.token"}"\n'
            f'workdir = "{self.root / "nodes" / node_id}"\ndevices = "emulated"\n'
            f'[emulated]\ngpu_type = "{server.gpu_type}"\ncount = {server.gpus}\n'
            f"speed = {emulated_speed(self.config, node_id)}\n"
        )
        self.agents[node_id] = self._spawn(
            f"agent-{node_id}",
            [self.python, "-m", "hopsmgr_agent.main", "--config", str(path), "--json-logs"],
        )

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def _check_alive(self, proc: subprocess.Popen[bytes], name: str) -> None:
        if proc.poll() is not None:
            log = self.root / f"{name.replace(' ', '-')}.log"
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise LocalClusterError(f"the {name} exited with {proc.returncode}; {log}:\n{tail}")

    def _record(self) -> None:
        run = {
            "url": self.url,
            "master": self.master.pid if self.master else None,
            "agents": {k: p.pid for k, p in self.agents.items()},
            "root": str(self.root),
        }
        (self.root / "run.json").write_text(json.dumps(run, indent=1))

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.admin_token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        stop_recorded(self.root)
        self.master = None
        self.agents = {}


def _terminate(pids: list[int], grace_s: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        for pid in pids:  # reap our own children so they do not linger as zombies
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def stop_recorded(root: Path, grace_s: float = 10.0) -> int:
    """Stop what `<root>/run.json` records, then every job process still running under
    `<root>/nodes`. Returns how many processes it stopped."""
    run_file = root / "run.json"
    if not run_file.exists():
        return 0
    run = json.loads(run_file.read_text())
    agents = [int(p) for p in run.get("agents", {}).values()]
    _terminate(agents, grace_s)  # agents first, so none reaps or reports while the master stops
    master = [int(run["master"])] if run.get("master") else []
    _terminate(master, grace_s)
    stopped = len(agents) + len(master)
    for marker in root.glob("nodes/*/attempts/*/run_as"):  # jobs run as their users: whole cgroups
        attempt = Attempt(marker.parent.parent.parent, marker.parent.name)
        if not attempt.exit.exists():
            runas.call(attempt, "signal", "--signal", "KILL")
    for pidfile in root.glob("nodes/*/attempts/*/pid"):  # jobs outlive the master by design
        try:
            pgid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            stopped += 1
    run_file.unlink()
    return stopped


def read_run(root: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((root / "run.json").read_text()))
    except (OSError, ValueError):
        return None
