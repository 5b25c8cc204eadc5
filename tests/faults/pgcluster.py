"""A local cluster whose state is on PostgreSQL, with several masters: real processes throughout.

A throwaway PostgreSQL server (tests.helpers.postgres), `masters` master processes on fixed loopback
ports sharing one database and one cluster token, and one agent per node given every master's URL.
Jobs run through the local executor and the node wrapper, detached from the master that started them,
so a master can be killed while they run. Used by tests/faults/test_failover.py and bench/failover.py.
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

from tests.helpers.postgres import PostgresServer, free_port
from tests.integration.cluster import EXAMPLE, Node, wait_for

PYTHON = sys.executable


@dataclass
class PgCluster:
    root: Path
    pg: PostgresServer
    nodes: list[Node]
    masters: int = 2
    lease_s: float = 3.0
    lease_check_s: float = 0.5
    tenants: str = ""
    store_url: str = ""  # default: a new database on `pg` (through a unix socket)
    master_store: dict[int, str] = field(default_factory=dict)  # a master's own URL of it (e.g. a proxy)
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.store_url:
            self.store_url = self.pg.url(self.pg.new_database())
        self.ports = [free_port() for _ in range(self.masters)]
        (self.root / "cluster.token").write_text("cluster-token-" + os.urandom(12).hex() + "\n")
        for i in range(self.masters):
            self.write_config(i)

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in range(self.masters)]

    def write_config(self, i: int) -> Path:
        """Master `i`'s cluster file (all alike but for the store's URL)."""
        lines = ["[cluster]", 'name = "ha"']
        for n in self.nodes:
            lines += ["[[servers]]", f'id = "{n.id}"', f'gpu_type = "{n.gpu_type}"', f"gpus = {n.gpus}"]
        # min_attempt_s: a running job keeps its GPUs (no preemption, no move), so a job that gets a
        # second run attempt after a failover was restarted by it
        lines += ["[scheduler]", "round_seconds = 2", "min_attempt_s = 600", "profiling_iterations = 10"]
        lines += [
            "[master]",
            f'store = "{self.master_store.get(i, self.store_url)}"',
            f'cluster_token_file = "{self.root / "cluster.token"}"',
            f'checkpoint_root = "{self.root / "checkpoints"}"',
            "heartbeat_interval_s = 0.3",
            "suspect_after_s = 1.5",
            "lost_after_s = 6",
            "stop_grace_s = 10",
            f"lease_s = {self.lease_s}",
            f"lease_check_s = {self.lease_check_s}",
            self.tenants,
        ]
        path = self.root / f"cluster{i}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- processes ------------------------------------------------------------------------------------

    def start_master(self, i: int, wait: bool = True) -> None:
        state = self.root / f"m{i}"
        with open(self.root / f"master{i}.log", "ab") as log:
            self.procs[i] = subprocess.Popen(
                [
                    PYTHON,
                    "-m",
                    "hopsmgr.cli.main",
                    "master",
                    "--config",
                    str(self.root / f"cluster{i}.toml"),
                    "--state-dir",
                    str(state),
                    "--listen",
                    f"127.0.0.1:{self.ports[i]}",
                    "--json-logs",
                ],
                stdout=log,
                stderr=log,
                cwd=self.root,
            )
        if wait:
            wait_for(lambda: self.health(i) is not None or self._exited(i), 30, f"master {i} /healthz")

    def _exited(self, i: int) -> bool:
        code = self.procs[i].poll()
        if code is not None:
            raise AssertionError(f"master {i} exited with {code} (see master{i}.log)")
        return False

    def start_agent(self, node_id: str) -> None:
        node = next(n for n in self.nodes if n.id == node_id)
        cfg = self.root / f"agent-{node_id}.toml"
        masters = ", ".join(f'"{u}"' for u in self.urls)
        cfg.write_text(
            f'node = "{node.id}"\nmaster = [{masters}]\n'
            f'cluster_token_file = "{self.root / "cluster.token"}"\n'
            f'workdir = "{self.root / "nodes" / node.id}"\ndevices = "emulated"\n'
            f'[emulated]\ngpu_type = "{node.gpu_type}"\ncount = {node.gpus}\nspeed = {node.speed}\n'
        )
        with open(self.root / f"agent-{node_id}.log", "ab") as log:
            self.agents[node_id] = subprocess.Popen(
                [PYTHON, "-m", "hopsmgr_agent.main", "--config", str(cfg), "--json-logs"],
                stdout=log,
                stderr=log,
            )

    def start(self) -> PgCluster:
        for i in range(self.masters):
            self.start_master(i)
        for n in self.nodes:
            self.start_agent(n.id)
        wait_for(lambda: self.leader() is not None, 30, "a leader")
        wait_for(
            lambda: all(x["health"] == "HEALTHY" for x in self.api("GET", "/api/v1/nodes")["nodes"]),
            30,
            "nodes healthy",
        )
        return self

    def kill_master(self, i: int, sig: int = signal.SIGKILL) -> None:
        _end(self.procs.pop(i), sig)

    def exit_code(self, i: int) -> int | None:
        return self.procs[i].poll() if i in self.procs else None

    def close(self) -> None:
        # Every process is ended whatever happens to the others: one left running (a master retrying a
        # stopped PostgreSQL) would load the machine for every later test.
        for node_id in list(self.agents):
            with contextlib.suppress(OSError):
                _end(self.agents.pop(node_id), signal.SIGTERM)
        for i in list(self.procs):
            with contextlib.suppress(OSError):
                self.kill_master(i, signal.SIGTERM)
        for pidfile in self.root.glob("nodes/*/attempts/*/pid"):
            with contextlib.suppress(ValueError, OSError):
                os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)

    # -- clients --------------------------------------------------------------------------------------

    def health(self, i: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url(i) + "/healthz", timeout=5) as r:
                return dict(json.loads(r.read()))
        except OSError:
            return None

    def leaders(self) -> list[int]:
        """The masters whose /healthz says they lead (running ones only)."""
        out = []
        for i in range(self.masters):
            if i in self.procs and self.procs[i].poll() is None:
                h = self.health(i)
                if h is not None and h.get("role") == "leader":
                    out.append(i)
        return out

    def leader(self) -> int | None:
        found = self.leaders()
        assert len(found) <= 1, f"two masters say they lead: {found}"
        return found[0] if found else None

    @property
    def admin_token(self) -> str:
        for path in sorted(self.root.glob("m*/admin.token")):
            return path.read_text().strip()
        raise AssertionError("no master wrote admin.token")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        leader = self.leader()
        assert leader is not None, "no leader"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(leader) + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def api(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.request(method, path, body)
        assert status < 300, f"{method} {path} -> {status}: {data}"
        return data

    def cli(self, *args: str, check: bool = True, first: int = 0) -> subprocess.CompletedProcess[str]:
        """The CLI given every master's URL, master `first`'s first."""
        urls = [self.url(first)] + [u for i, u in enumerate(self.urls) if i != first]
        env = {**os.environ, "HOPSMGR_URL": ",".join(urls), "HOPSMGR_TOKEN": self.admin_token}
        proc = subprocess.run(
            [PYTHON, "-m", "hopsmgr.cli.main", *args], capture_output=True, text=True, env=env, timeout=90
        )
        if check:
            assert proc.returncode == 0, (
                f"hopsmgr {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def submit(
        self, *, iters: int = 40, step: float = 0.05, name: str = "job", check: bool = True, first: int = 0
    ) -> str:
        args = ["submit", "--gpus", "1", "--batch-size", "8", "--iters", str(iters), "--name", name, "--"]
        args += [PYTHON, EXAMPLE, "--iters", str(iters), "--batch-size", "8", "--step-seconds", str(step)]
        return self.cli(*args, check=check, first=first).stdout.strip()

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in self.api("GET", "/api/v1/jobs")["jobs"]}

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/api/v1/jobs/{job_id}"))

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        import psycopg
        from psycopg.rows import dict_row

        with contextlib.closing(psycopg.connect(self.store_url, autocommit=True, row_factory=dict_row)) as c:
            return list(c.execute(sql, params).fetchall())

    def wait_leader(self, timeout: float, other_than: int | None = None) -> tuple[int, float]:
        """Wait for a leader (not `other_than`) that has planned; (its index, seconds waited)."""
        t0 = time.monotonic()

        def planned() -> bool:
            i = self.leader()
            if i is None or i == other_than:
                return False
            h = self.health(i) or {}
            return bool((h.get("leader") or {}).get("first_plan"))

        wait_for(planned, timeout, "a new leader's first plan")
        i = self.leader()
        assert i is not None
        return i, time.monotonic() - t0


def _end(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig`; a process still running 20 s later is killed."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
