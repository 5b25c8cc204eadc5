"""The soak's cluster: a LocalCluster with a drained "probe" server, the HTTP client and the samplers.

Part of bench/soak.py (run that script, not this module). It holds the soak's constants (servers,
tenants, timings), the cluster file, the shared mutable figures (`Stats`) and `SoakCluster`, the base of
the soak: it sets the cluster up and closes it, talks to the master over HTTP (counting every answer),
times the probe server's heartbeats, and samples duplicate runs, the master's VmHWM and /metrics in
background threads. The fault injection (soak_faults.py) and the figures (soak_report.py) build on it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hopsmgr.config import load_cluster_config
from hopsmgr.local.cluster import LocalCluster, LocalClusterError, stop_recorded
from hopsmgr.node import ops
from hopsmgr.protocol import PROTOCOL_VERSION

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "emulated_train.py")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
LIVE = ("PENDING", "PROFILING", "QUEUED", "LAUNCHING", "RUNNING", "CHECKPOINTING")
SERVERS = (("node-a100", "a100", 2), ("node-v100", "v100", 2), ("node-p100", "p100", 2))
PROBE = ("probe", "p100", 1)
TENANTS = (("research", 2, None, 1.0), ("batch", 0, 4, 0.5))  # name, guaranteed, cap, weight
HEARTBEAT_S, SUSPECT_S, LOST_S = 0.5, 2.0, 6.0


def cluster_toml() -> str:
    lines = ['[cluster]\nname = "soak"\n']
    for sid, gpu_type, gpus in (*SERVERS, PROBE):
        lines.append(f'[[servers]]\nid = "{sid}"\ngpu_type = "{gpu_type}"\ngpus = {gpus}\n')
    lines.append("[scheduler]\nround_seconds = 5\nmin_attempt_s = 5\nprofiling_iterations = 10\n")
    lines.append(
        f'[master]\nlisten = "127.0.0.1:0"\nheartbeat_interval_s = {HEARTBEAT_S}\n'
        f"suspect_after_s = {SUSPECT_S}\nlost_after_s = {LOST_S}\nstop_grace_s = 10\n"
    )
    for name, guaranteed, cap, weight in TENANTS:
        lines.append(f'[[tenants]]\nname = "{name}"\nguaranteed_gpus = {guaranteed}\nweight = {weight}\n')
        if cap is not None:
            lines.append(f"cap_gpus = {cap}\n")
    return "\n".join(lines)


def metric(text: str, name: str, quantile: str | None = None) -> float | None:
    label = re.escape(f'{{quantile="{quantile}"}}') if quantile else ""
    match = re.search(rf"^{re.escape(name)}{label} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Unreachable(Exception):
    """No HTTP answer (the master is down or restarting)."""


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[str] = field(default_factory=Counter)
    api_5xx: list[str] = field(default_factory=list)
    unreachable: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    killed: dict[str, str] = field(default_factory=dict)  # job -> attempt whose process was killed
    cancelled: set[str] = field(default_factory=set)
    bad_burst_statuses: Counter[str] = field(default_factory=Counter)
    bad_burst_not_json: int = 0
    probe_ms: list[float] = field(default_factory=list)
    server: dict[int, dict[str, float | None]] = field(default_factory=dict)  # master pid -> figures
    rss: dict[int, float] = field(default_factory=dict)  # master pid -> VmHWM MB
    duplicates: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = field(default_factory=dict)
    restart_failures: list[str] = field(default_factory=list)
    agent_down: dict[str, float] = field(default_factory=dict)  # node -> time its agent was killed
    agent_up: dict[str, float] = field(default_factory=dict)  # node -> time its agent was restarted

    def record(self, method: str, path: str, status: int, text: str) -> None:
        with self.lock:
            self.statuses[f"{status // 100}xx"] += 1
            if status >= 500 and len(self.api_5xx) < 1000:
                self.api_5xx.append(f"{method} {path[:80]} -> {status}: {text[:200]}")


class SoakCluster:
    """The cluster's processes and the soak's state; HTTP, set-up, background samplers and close."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.rng = random.Random(args.seed)
        self.fault_rng = random.Random(args.seed * 7919 + 1)
        self.stats = Stats()
        self.proc_lock = threading.RLock()  # guards the cluster's master/agent processes
        self.stop = threading.Event()
        self.cluster: LocalCluster | None = None
        self.tokens: dict[str, str] = {}
        self.submitted: dict[str, str] = {}  # name -> job id
        self.ambiguous: list[str] = []  # names whose submission got no answer
        self.refused: list[str] = []  # submissions answered 4xx (none expected)
        self.port = 0
        self.t0 = time.monotonic()

    # -- HTTP ----------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.cluster is not None
        return self.cluster.url

    def http(
        self, method: str, path: str, body: Any = None, token: str | None = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is None:
            token = self.tokens.get("admin", "")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text, status = r.read().decode("utf-8", "replace"), r.status
        except urllib.error.HTTPError as e:
            with e:
                text, status = e.read().decode("utf-8", "replace"), e.code
        except (OSError, ValueError) as exc:  # refused, reset, timed out, closed mid-answer
            with self.stats.lock:
                self.stats.unreachable += 1
            raise Unreachable(repr(exc)) from None
        self.stats.record(method, path, status, text)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def until_up(
        self, method: str, path: str, body: Any = None, token: str | None = None, wait_s: float = 90
    ) -> tuple[int, Any]:
        """Retry while the master is unreachable (restarting) or answers 5xx."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                status, doc = self.http(method, path, body, token)
                if status < 500 or time.monotonic() > deadline:
                    return status, doc
            except Unreachable:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    # -- set-up -------------------------------------------------------------------------------------------

    def setup(self) -> None:
        config_path = self.root / "soak.toml"
        config_path.write_text(cluster_toml())
        config = load_cluster_config(config_path)
        agents_config = replace(config, servers=tuple(s for s in config.servers if s.id != PROBE[0]))
        self.cluster = LocalCluster(config_path, agents_config, self.root)
        (self.root / "nodes" / PROBE[0]).mkdir(parents=True, exist_ok=True)
        threading.Thread(target=self.probe_loop, name="probe", daemon=True).start()
        self.cluster.start(timeout_s=90)  # waits for every node, the probe's too
        self.port = int(self.url.rsplit(":", 1)[1])
        self.tokens["admin"] = self.cluster.admin_token
        for (tenant, *_rest), user in zip(TENANTS, ("ana", "bo"), strict=True):
            status, doc = self.http("POST", "/api/v1/tokens", {"user": user, "tenant": tenant})
            if status != 201:
                raise LocalClusterError(f"cannot create a token for {user}: {status} {doc}")
            self.tokens[tenant] = doc["token"]
        status, doc = self.http("POST", f"/api/v1/nodes/{PROBE[0]}/drain", {})
        if status != 200 or not doc.get("drained"):
            raise LocalClusterError(f"cannot drain the probe node: {status} {doc}")
        for pid in self.pids():
            self.stats.rss[pid] = vm_hwm_mb(pid) or 0.0

    def pids(self) -> list[int]:
        with self.proc_lock:
            master = self.cluster.master if self.cluster else None
            return [master.pid] if master is not None and master.poll() is None else []

    # -- background loops -----------------------------------------------------------------------------------

    def probe_loop(self) -> None:
        """Heartbeats of the drained "probe" server, timed here (the client side of heartbeat handling)."""
        state = self.root / "state"
        body = {
            "node": PROBE[0],
            "gpu_type": PROBE[1],
            "gpus": PROBE[2],
            "device_mode": "emulated",
            "workdir": str(self.root / "nodes" / PROBE[0]),
            "protocol": PROTOCOL_VERSION,
            "agent_version": "soak-probe",
        }
        while not self.stop.is_set():
            time.sleep(HEARTBEAT_S)
            try:
                url = json.loads((state / "master.json").read_text())["url"]
                token = (state / "cluster.token").read_text().strip()
            except (OSError, ValueError, KeyError):
                continue
            req = urllib.request.Request(
                url + "/api/v1/agents/heartbeat", json.dumps(body).encode(), method="POST"
            )
            req.add_header("Authorization", f"Bearer {token}")
            req.add_header("Content-Type", "application/json")
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                    ms = (time.perf_counter() - t0) * 1000
                    self.stats.record("POST", "/api/v1/agents/heartbeat (probe)", r.status, "")
                    with self.stats.lock:
                        self.stats.probe_ms.append(ms)
            except urllib.error.HTTPError as e:
                with e:
                    self.stats.record(
                        "POST", "/api/v1/agents/heartbeat (probe)", e.code, e.read().decode(errors="replace")
                    )
            except (OSError, ValueError):
                pass  # the master is restarting

    def sampler_loop(self) -> None:
        """Every second: duplicate runs in the node work dirs, the master's VmHWM; every 5 s /metrics."""
        tick = 0
        while not self.stop.is_set():
            time.sleep(1.0)
            tick += 1
            now = time.monotonic()
            for pid in self.pids():
                hwm = vm_hwm_mb(pid)
                if hwm is not None:
                    with self.stats.lock:
                        self.stats.rss[pid] = max(self.stats.rss.get(pid, 0.0), hwm)
            for job, attempts in self.running_runs().items():
                if len(attempts) < 2:
                    continue
                key = (job, tuple(sorted(attempts)))
                trouble = self.agent_trouble(now)
                with self.stats.lock:
                    seen = self.stats.duplicates.setdefault(
                        key,
                        {"job": job, "attempts": list(key[1]), "first_s": round(now - self.t0, 1), "samples": 0,
                         "agent_down": trouble},
                    )  # fmt: skip
                    seen["samples"] += 1
                    seen["agent_down"] = seen["agent_down"] or trouble
            if tick % 5 == 0:
                self.scrape_metrics()

    def agent_trouble(self, now: float) -> bool:
        """Whether some node's agent is down now, or came back less than 5 s ago (it has not yet been
        told to stop the attempts the master ended while it was away)."""
        with self.stats.lock:
            for node, down in self.stats.agent_down.items():
                up = self.stats.agent_up.get(node, -math.inf)
                if up < down or now - up < 5.0:
                    return True
        return False

    def running_runs(self) -> dict[str, set[str]]:
        """Job -> ids of its "run" attempts with a live process, over every node's work dir."""
        by_job: dict[str, set[str]] = defaultdict(set)
        for sid, _, _ in SERVERS:
            try:
                status = ops.status(self.root / "nodes" / sid)
            except Exception:  # a work dir being written to: try again next second
                continue
            for a in status["attempts"]:
                if a["state"] == "running" and a["mode"] == "run" and a["pid"] is not None and a["job"]:
                    by_job[str(a["job"])].add(str(a["attempt"]))
        return by_job

    def scrape_metrics(self) -> None:
        """The server-side figures of the master now running (its summaries start afresh at each start)."""
        pids = self.pids()
        try:
            status, text = self.http("GET", "/metrics")
        except Unreachable:
            return
        if status != 200 or not isinstance(text, str) or not pids or self.pids() != pids:
            return
        figures = {
            "round_p95_s": metric(text, "hopsmgr_round_seconds", "0.95"),
            "round_count": metric(text, "hopsmgr_round_seconds_count"),
            "heartbeat_p99_ms": metric(text, "hopsmgr_heartbeat_handling_ms", "0.99"),
            "heartbeat_count": metric(text, "hopsmgr_heartbeat_handling_ms_count"),
        }
        with self.stats.lock:
            self.stats.server[pids[0]] = figures

    # -- jobs and close -------------------------------------------------------------------------------------

    def jobs(self) -> dict[str, dict[str, Any]]:
        status, doc = self.until_up("GET", "/api/v1/jobs?limit=100000")
        if status != 200:
            raise RuntimeError(f"cannot list jobs: {status} {doc}")
        return {j["id"]: j for j in doc["jobs"]}

    def close(self) -> None:
        self.stop.set()
        if self.cluster is not None:
            with self.proc_lock:
                self.cluster._record()
            stop_recorded(self.root)
