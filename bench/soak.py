"""Soak benchmark: a real local cluster under a stream of small jobs while faults are injected at random.

    python bench/soak.py --minutes 3 --seed 1 --json soak.json

The cluster is hopsmgr.local.cluster.LocalCluster (the `hopsmgr demo` machinery): a real `hopsmgr
master` process with the local executor and one emulated-device `hopsmgr-agent` per server (three
servers of 2 GPUs: a100, v100, p100), with short timings (heartbeat 0.5 s, SUSPECT after 2 s, LOST
after 6 s, rounds of 5 s). Jobs are real processes (examples/emulated_train.py, 30..150 iterations of
0.05 s) submitted over the HTTP API by two tenants' users with Poisson arrivals (--rate per minute).

Faults come one at a time, at Poisson times (--fault-every seconds on average), of these kinds (seeded):

    master_kill        SIGKILL the master, restart it 0.5..3 s later on the same port and state dir
    agent_kill_short   SIGKILL a node's agent, restart it before lost_after_s (node SUSPECT at most)
    agent_kill_long    SIGKILL a node's agent, restart it after lost_after_s (node LOST: its jobs requeue)
                       (both pick a node that runs some of the soak's attempts when there is one)
    job_kill           SIGKILL the process group of a running attempt (its pid file under
                       <root>/nodes/<node>/attempts/<id>/pid); the product FAILS such a job (exit -9)
    cancel             cancel a random live job of the soak through the API
    bad_burst          30 invalid API requests (bad bodies, paths, queries, tokens); all must be 4xx

After --minutes the arrivals and faults stop, every process is made sure to run, and the soak waits up to
--drain-s for every job to end. Figures (printed as a table, and written with --json):

    jobs, completed, failed (failed_killed: jobs whose process the soak killed, with the exit -9 in the
    reason; failed_other), cancelled (cancelled_by_soak, cancelled_other), lost_jobs (submitted ids the
    master does not list, or not ended after the drain), duplicate_runs (sampled every second from the
    node work dirs with hopsmgr.node.ops.status: two "run" attempts of one job alive at once, split by
    whether a node's agent was down then or a few seconds before), api_5xx (every request of the soak:
    submissions, probes, cancels, bad bursts), round_p95_s and heartbeat_p99_ms (server side, from
    /metrics; the worst of the master's lifetimes; the server's heartbeat time leaves out the wait for its
    commit to disk), heartbeat_client_p99_ms (a client-side probe: a 4th server "probe" in the cluster
    file, drained, whose heartbeats this script sends every 0.5 s and times, commit included), master_rss_mb (VmHWM of the master process, max over its restarts), faults_injected.

Known input bugs of the master (non-UTF-8 Authorization, lone surrogates in submissions; see
tests/fuzz/test_api_fuzz.py) are left out of the bad bursts so that api_5xx shows new problems. Speed
is never asserted: the exit status is 0 whatever the figures, 1 when the cluster cannot be set up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
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
FAULT_WEIGHTS = {
    "master_kill": 2,
    "agent_kill_short": 2,
    "agent_kill_long": 1,
    "job_kill": 2,
    "cancel": 2,
    "bad_burst": 2,
}


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


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


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


class Soak:
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

    # -- faults ---------------------------------------------------------------------------------------------

    def fault_loop(self, end: float) -> None:
        kinds = list(FAULT_WEIGHTS)
        weights = [FAULT_WEIGHTS[k] for k in kinds]
        while not self.stop.is_set():
            wait = self.fault_rng.expovariate(1.0 / self.args.fault_every)
            if time.monotonic() + wait >= end:
                return
            if self.stop.wait(wait):
                return
            kind = self.fault_rng.choices(kinds, weights)[0]
            t = round(time.monotonic() - self.t0, 1)
            try:
                detail = getattr(self, f"fault_{kind}")()
            except Exception as exc:  # a fault that could not be carried out is logged, not fatal
                detail = f"error: {exc!r}"
                self.stats.skipped[kind] += 1
            else:
                if detail is None:
                    self.stats.skipped[kind] += 1
                    continue
                self.stats.faults[kind] += 1
            self.stats.fault_log.append({"t_s": t, "kind": kind, "detail": detail})

    def restart_master(self) -> str:
        assert self.cluster is not None
        c = self.cluster
        info = c.state_dir / "master.json"
        with contextlib.suppress(FileNotFoundError):
            info.unlink()
        argv = [c.python, "-m", "hopsmgr.cli.main", "master", "--config", str(c.config_path)]
        argv += ["--state-dir", str(c.state_dir), "--json-logs", "--listen", f"127.0.0.1:{self.port}"]
        for attempt in range(3):
            with self.proc_lock:
                c.master = c._spawn("master", argv)
                proc = c.master
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(info.read_text() or "{}").get("pid") == proc.pid:
                        c._record()
                        return f"restarted as pid {proc.pid}" + (
                            f" (after {attempt} failed starts)" if attempt else ""
                        )
                time.sleep(0.1)
            self.stats.restart_failures.append(f"master start {attempt + 1}: exit {proc.poll()}")
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
            time.sleep(2)
        raise RuntimeError("the master did not restart (see master.log)")

    def fault_master_kill(self) -> str:
        assert self.cluster is not None
        self.scrape_metrics()  # the last figures of this master's lifetime
        with self.proc_lock:
            proc = self.cluster.master
            assert proc is not None
            hwm = vm_hwm_mb(proc.pid)
            if hwm is not None:
                self.stats.rss[proc.pid] = max(self.stats.rss.get(proc.pid, 0.0), hwm)
            proc.send_signal(signal.SIGKILL)
            proc.wait(20)
            self.cluster.master = None
        down = self.fault_rng.uniform(0.5, 3.0)
        time.sleep(down)
        return f"pid {proc.pid} killed, down {down:.1f} s, " + self.restart_master()

    def _kill_agent(self, down_s: float) -> str:
        assert self.cluster is not None
        busy = sorted({sid for sid, _ in self.running_attempts()})
        node = self.fault_rng.choice(busy or [s[0] for s in SERVERS])  # a node with work, if any
        running = sorted(a["attempt"] for sid, a in self.running_attempts() if sid == node)
        with self.proc_lock:
            proc = self.cluster.agents[node]
            proc.send_signal(signal.SIGKILL)
            proc.wait(20)
        with self.stats.lock:
            self.stats.agent_down[node] = time.monotonic()
        time.sleep(down_s)
        with self.proc_lock:
            self.cluster.start_agent(node)
            self.cluster._record()
        with self.stats.lock:
            self.stats.agent_up[node] = time.monotonic()
        return f"{node} (running {', '.join(running) or 'nothing'}): agent pid {proc.pid} killed, restarted after {down_s:.1f} s"

    def fault_agent_kill_short(self) -> str:
        return self._kill_agent(self.fault_rng.uniform(0.5, SUSPECT_S + 1.0))

    def fault_agent_kill_long(self) -> str:
        return self._kill_agent(LOST_S + self.fault_rng.uniform(2.0, 4.0))

    def running_attempts(self) -> list[tuple[str, dict[str, Any]]]:
        """(node, attempt record) of the soak's attempts with a live process, over every node's work dir."""
        found = []
        jobs = set(self.submitted.values())
        for sid, _, _ in SERVERS:
            with contextlib.suppress(Exception):
                for a in ops.status(self.root / "nodes" / sid)["attempts"]:
                    if a["state"] == "running" and a["pid"] is not None and a["job"] in jobs:
                        found.append((sid, a))
        return found

    def fault_job_kill(self) -> str | None:
        candidates = self.running_attempts()
        if not candidates:
            return None
        sid, a = self.fault_rng.choice(sorted(candidates, key=lambda c: c[1]["attempt"]))
        try:
            os.killpg(int(a["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            return None
        with self.stats.lock:
            self.stats.killed[str(a["job"])] = str(a["attempt"])
        return f"{a['job']} {a['attempt']} ({a['mode']}) on {sid}: process group {a['pid']} killed"

    def fault_cancel(self) -> str | None:
        query = "&".join(f"state={s}" for s in LIVE)
        status, doc = self.http("GET", f"/api/v1/jobs?limit=100000&{query}")
        if status != 200:
            return None
        live = sorted(j["id"] for j in doc["jobs"] if j["id"] in self.submitted.values())
        if not live:
            return None
        job = self.fault_rng.choice(live)
        status, doc = self.http("POST", f"/api/v1/jobs/{job}/cancel", {})
        if status == 200:
            with self.stats.lock:
                self.stats.cancelled.add(job)
        return f"{job}: cancel -> {status} {doc.get('state') if isinstance(doc, dict) else doc}"

    def bad_requests(self) -> list[tuple[str, str, Any, str | None]]:
        """(method, path, body or raw bytes, token) of requests the master must refuse with a 4xx."""
        py = sys.executable
        base = {"command": [py, "-c", "pass"], "gpus": [1], "batch_size": 8, "iterations": 10}
        user, cluster_token = (
            self.tokens["batch"],
            (self.root / "state" / "cluster.token").read_text().strip(),
        )
        return [
            ("POST", "/api/v1/jobs", {}, None),
            ("POST", "/api/v1/jobs", {**base, "gpus": [0]}, None),
            ("POST", "/api/v1/jobs", {**base, "gpus": [64]}, None),
            ("POST", "/api/v1/jobs", {**base, "command": []}, None),
            ("POST", "/api/v1/jobs", {**base, "env": {"HOPS_JOB_ID": "x"}}, None),
            ("POST", "/api/v1/jobs", {**base, "workdir": "/a/../b"}, None),
            ("POST", "/api/v1/jobs", {**base, "tenant": "research"}, user),
            ("POST", "/api/v1/jobs", b"{not json", None),
            ("POST", "/api/v1/jobs", b'{"iterations": ' + b"9" * 5000 + b"}", None),
            ("POST", "/api/v1/jobs", b'{"env": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, None),
            ("POST", "/api/v1/jobs", json.dumps({**base, "name": "x" * 70_000}).encode(), None),
            ("POST", "/api/v1/jobs", json.dumps(base)[:-1].encode() + b', "iterations": NaN}', None),
            ("GET", "/api/v1/jobs?limit=abc", None, None),
            ("GET", "/api/v1/jobs?state=BOGUS", None, None),
            ("GET", "/api/v1/jobs/..%2F..%2Fetc", None, None),
            ("GET", "/api/v1/jobs/j-999999/logs?tail=0", None, None),
            ("POST", "/api/v1/jobs/j-999999/cancel", {}, None),
            ("GET", "/api/v1/nodes/nowhere", None, None),
            ("POST", "/api/v1/nodes/node-a100/drain", {}, user),
            ("POST", "/api/v1/tokens", {"user": "x", "tenant": "batch"}, user),
            ("POST", "/api/v1/tokens", {"user": "a/b", "tenant": "batch"}, None),
            ("POST", "/api/v1/agents/heartbeat", {"node": "node-a100"}, None),
            ("POST", "/api/v1/agents/heartbeat", {"node": "nowhere", "gpu_type": "x", "gpus": 1,
                                                  "device_mode": "emulated", "workdir": "/x"}, cluster_token),
            ("POST", "/api/v1/agents/heartbeat", [1, 2, 3], cluster_token),
            ("GET", "/metrics", None, "not-a-token"),
            ("GET", "/api/v1/cluster", None, cluster_token),
            ("DELETE", "/api/v1/jobs", None, None),
        ]  # fmt: skip

    def fault_bad_burst(self) -> str:
        requests = self.bad_requests()
        seen: Counter[int] = Counter()
        for _ in range(30):
            method, path, body, token = self.fault_rng.choice(requests)
            raw = body if isinstance(body, bytes) else None
            try:
                status, doc = self.http(method, path, None if raw is not None else body, token, raw=raw)
            except Unreachable:
                continue
            seen[status] += 1
            with self.stats.lock:
                self.stats.bad_burst_statuses[str(status)] += 1
                if not (isinstance(doc, dict) and isinstance(doc.get("error"), dict)):
                    self.stats.bad_burst_not_json += 1
        return "statuses " + ", ".join(f"{s}x{n}" for s, n in sorted(seen.items()))

    # -- the job stream ---------------------------------------------------------------------------------------

    def submit(self, k: int) -> None:
        tenant = self.rng.choice([t[0] for t in TENANTS])
        iters = self.rng.randint(30, 150)
        gpus = self.rng.choice([[1], [1], [1, 2], [2]])
        name = f"soak-{self.args.seed}-{k:04d}"
        body = {
            "command": [
                sys.executable,
                EXAMPLE,
                "--iters",
                str(iters),
                "--batch-size",
                "8",
                "--step-seconds",
                "0.05",
            ],
            "gpus": gpus,
            "batch_size": 8,
            "iterations": iters,
            "name": name,
        }
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                status, doc = self.http("POST", "/api/v1/jobs", body, self.tokens[tenant])
            except Unreachable:  # perhaps stored before the master died: look it up once it is back
                found = self.find(name, deadline)
                if found is not None:
                    self.submitted[name] = found
                    return
                continue
            if status == 201:
                self.submitted[name] = doc["id"]
                return
            if status < 500:
                self.refused.append(f"{name}: {status} {doc}")
                return
            time.sleep(0.5)  # a 5xx (counted): try again
        self.ambiguous.append(name)

    def find(self, name: str, deadline: float) -> str | None:
        """The id of the soak's job called `name` once the master answers again (None: not stored)."""
        while time.monotonic() < deadline:
            try:
                status, doc = self.http("GET", "/api/v1/jobs?limit=100000")
            except Unreachable:
                time.sleep(0.3)
                continue
            if status == 200:
                ids = [j["id"] for j in doc["jobs"] if j["name"] == name]
                return ids[0] if ids else None
            time.sleep(0.5)
        return None

    def jobs(self) -> dict[str, dict[str, Any]]:
        status, doc = self.until_up("GET", "/api/v1/jobs?limit=100000")
        if status != 200:
            raise RuntimeError(f"cannot list jobs: {status} {doc}")
        return {j["id"]: j for j in doc["jobs"]}

    def run(self) -> dict[str, Any]:
        args = self.args
        self.t0 = time.monotonic()
        end = self.t0 + args.minutes * 60
        sampler = threading.Thread(target=self.sampler_loop, name="sampler", daemon=True)
        faults = threading.Thread(target=self.fault_loop, args=(end,), name="faults", daemon=True)
        sampler.start()
        faults.start()
        k = 0
        next_at = self.t0 + self.rng.expovariate(args.rate / 60)
        while time.monotonic() < end:
            if time.monotonic() >= next_at:
                k += 1
                self.submit(k)
                next_at += self.rng.expovariate(args.rate / 60)
            time.sleep(max(0.0, min(0.2, next_at - time.monotonic())))
        faults.join()
        # every process runs again before the drain
        assert self.cluster is not None
        with self.proc_lock:
            if self.cluster.master is None or self.cluster.master.poll() is not None:
                self.restart_master()
            for sid, _, _ in SERVERS:
                proc = self.cluster.agents.get(sid)
                if proc is None or proc.poll() is not None:
                    self.cluster.start_agent(sid)
            self.cluster._record()
        drain_t0 = time.monotonic()
        for name in list(self.ambiguous):  # submissions without an answer: stored or not?
            found = [j for j in self.jobs().values() if j["name"] == name]
            if found:
                self.submitted[name] = found[0]["id"]
                self.ambiguous.remove(name)
        ids = set(self.submitted.values())
        while time.monotonic() - drain_t0 < args.drain_s:
            states = {i: j["state"] for i, j in self.jobs().items() if i in ids}
            if len(states) == len(ids) and all(s in TERMINAL for s in states.values()):
                break
            time.sleep(2)
        drain_s = time.monotonic() - drain_t0
        self.scrape_metrics()
        for pid in self.pids():
            self.stats.rss[pid] = max(self.stats.rss.get(pid, 0.0), vm_hwm_mb(pid) or 0.0)
        self.stop.set()
        sampler.join(5)
        return self.figures(k, drain_s)

    # -- figures ------------------------------------------------------------------------------------------------

    def figures(self, offered: int, drain_s: float) -> dict[str, Any]:
        final = self.jobs()
        ids = set(self.submitted.values())
        prefix = f"soak-{self.args.seed}-"
        names = Counter(j["name"] for j in final.values() if str(j["name"]).startswith(prefix))
        mine = {i: final[i] for i in ids if i in final}
        by_state = Counter(j["state"] for j in mine.values())
        failed = {i: j for i, j in mine.items() if j["state"] == "FAILED"}
        killed_failed = {i for i in failed if i in self.stats.killed}
        clear = {
            i for i in killed_failed if re.search(r"-9\b|signal 9|SIGKILL", failed[i].get("reason") or "")
        }
        cancelled = {i for i, j in mine.items() if j["state"] == "CANCELLED"}
        lost = sorted(i for i in ids if i not in final or final[i]["state"] not in TERMINAL)
        killed_not_failed = {
            i: {"state": mine[i]["state"], "attempt": a, "exit": self.exit_record(a)}
            for i, a in self.stats.killed.items()
            if i in mine and i not in failed
        }
        details = {i: self.http("GET", f"/api/v1/jobs/{i}")[1] for i in sorted(mine)}
        counters: Counter[str] = Counter()
        for d in details.values():
            if isinstance(d, dict):
                counters.update(d.get("counters", {}))
        server = self.stats.server
        round_p95 = [v for f in server.values() if (v := f.get("round_p95_s")) is not None]
        hb_p99 = [v for f in server.values() if (v := f.get("heartbeat_p99_ms")) is not None]
        dups = list(self.stats.duplicates.values())
        return {
            "minutes": self.args.minutes,
            "seed": self.args.seed,
            "rate_per_min": self.args.rate,
            "fault_every_s": self.args.fault_every,
            "faults_injected": {
                "total": sum(self.stats.faults.values()),
                **dict(sorted(self.stats.faults.items())),
            },
            "faults_skipped": dict(self.stats.skipped),
            "jobs_offered": offered,
            "jobs": len(ids),
            "completed": by_state["COMPLETED"],
            "failed": len(failed),
            "failed_killed": len(killed_failed),
            "failed_killed_with_exit_reason": len(clear),
            "failed_other": len(failed) - len(killed_failed),
            "failed_other_reasons": sorted(
                {(failed[i].get("reason") or "")[:160] for i in failed if i not in killed_failed}
            )[:10],
            "killed_jobs_not_failed": killed_not_failed,
            "cancelled": len(cancelled),
            "cancelled_by_soak": len(cancelled & self.stats.cancelled),
            "cancelled_other": len(cancelled - self.stats.cancelled),
            "lost_jobs": len(lost) + len(self.ambiguous),
            "lost_job_ids": lost,
            "lost_job_states": {i: (final[i]["state"] if i in final else "MISSING") for i in lost},
            "lost_job_details": {i: self.why(i) for i in lost[:5]},
            "unanswered_submissions": list(self.ambiguous),
            "refused_submissions": self.refused[:10],
            "duplicate_submissions": sorted(n for n, c in names.items() if c > 1),
            "restarts": counters.get("restarts", 0),
            "preemptions": counters.get("preemptions", 0),
            "node_losses": counters.get("node_losses", 0),
            "duplicate_runs": len(dups),
            "duplicate_runs_agent_down": sum(1 for d in dups if d["agent_down"]),
            "duplicate_runs_other": sum(1 for d in dups if not d["agent_down"]),
            "duplicate_run_samples": dups[:20],
            "api_requests": dict(self.stats.statuses),
            "api_5xx": len(self.stats.api_5xx),
            "api_5xx_samples": self.stats.api_5xx[:10],
            "api_unreachable": self.stats.unreachable,
            "bad_burst_statuses": dict(self.stats.bad_burst_statuses),
            "bad_burst_not_json": self.stats.bad_burst_not_json,
            "round_p95_s": max(round_p95) if round_p95 else None,
            "heartbeat_p99_ms": max(hb_p99) if hb_p99 else None,
            "heartbeat_client_p99_ms": pct(self.stats.probe_ms, 99),
            "heartbeat_client_p50_ms": pct(self.stats.probe_ms, 50),
            "heartbeat_client_samples": len(self.stats.probe_ms),
            "server_figures_by_master_pid": {str(k): v for k, v in sorted(server.items())},
            "master_rss_mb": max(self.stats.rss.values()) if self.stats.rss else None,
            "master_pids": len(self.stats.rss),
            "master_restart_failures": self.stats.restart_failures,
            "drain_s": round(drain_s, 1),
            "fault_log": self.stats.fault_log,
        }

    def why(self, job: str) -> dict[str, Any]:
        """A lost job's history, attempts and the planner's explanation (for the report)."""
        out: dict[str, Any] = {}
        with contextlib.suppress(Unreachable):
            _, detail = self.http("GET", f"/api/v1/jobs/{job}")
            if isinstance(detail, dict):
                out["history"] = detail.get("history", [])[-8:]
                out["attempts"] = detail.get("attempts", [])[-6:]
            _, explain = self.http("GET", f"/api/v1/jobs/{job}/explain")
            out["explain"] = explain
            _, nodes = self.http("GET", "/api/v1/nodes")
            if isinstance(nodes, dict):
                out["nodes"] = [
                    {k: n.get(k) for k in ("id", "health", "drained", "free_gpus", "running")}
                    for n in nodes["nodes"]
                ]
        return out

    def exit_record(self, attempt: str) -> dict[str, Any] | None:
        """What the node wrapper recorded when the attempt ended (a kill that came too late finds exit 0)."""
        for sid, _, _ in SERVERS:
            with contextlib.suppress(Exception):
                return dict(ops.status(self.root / "nodes" / sid, attempt)["attempts"][0]["exit"] or {})
        return None

    def close(self) -> None:
        self.stop.set()
        if self.cluster is not None:
            with self.proc_lock:
                self.cluster._record()
            stop_recorded(self.root)


TABLE = [
    ("faults injected", lambda f: f"{f['faults_injected']['total']}  "
     + " ".join(f"{k}={v}" for k, v in f["faults_injected"].items() if k != "total")),
    ("jobs (offered / submitted)", lambda f: f"{f['jobs_offered']} / {f['jobs']}"),
    ("completed", lambda f: f["completed"]),
    ("failed (killed by soak, with -9 reason / other)",
     lambda f: f"{f['failed']} ({f['failed_killed']}, {f['failed_killed_with_exit_reason']} / {f['failed_other']})"),
    ("cancelled (by soak / other)", lambda f: f"{f['cancelled']} ({f['cancelled_by_soak']} / {f['cancelled_other']})"),
    ("lost jobs", lambda f: f["lost_jobs"]),
    ("restarts / preemptions / node losses", lambda f: f"{f['restarts']} / {f['preemptions']} / {f['node_losses']}"),
    ("duplicate runs (agent down / other)",
     lambda f: f"{f['duplicate_runs']} ({f['duplicate_runs_agent_down']} / {f['duplicate_runs_other']})"),
    ("API 5xx / unreachable", lambda f: f"{f['api_5xx']} / {f['api_unreachable']}"),
    ("round p95 (s, server)", lambda f: f["round_p95_s"]),
    ("heartbeat p99 (ms, server / client)", lambda f: f"{f['heartbeat_p99_ms']} / {f['heartbeat_client_p99_ms']}"),
    ("master RSS (VmHWM MB, max over restarts)", lambda f: f["master_rss_mb"]),
    ("drain (s)", lambda f: f["drain_s"]),
]  # fmt: skip


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if math.isfinite(value) else str(value)
    return str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=3.0, help="how long jobs arrive and faults happen")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--rate", type=float, default=30.0, help="job arrivals per minute (Poisson)")
    p.add_argument("--fault-every", type=float, default=12.0, help="mean seconds between faults")
    p.add_argument("--drain-s", type=float, default=150.0, help="longest wait for every job to end")
    p.add_argument("--workdir", help="keep the cluster's files here (default: a temporary dir, removed)")
    args = p.parse_args(argv)

    root = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="hopsmgr-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, root)
    try:
        try:
            soak.setup()
        except Exception as exc:
            traceback.print_exc()
            print(f"soak: set-up failed: {exc} (logs in {root})", file=sys.stderr)
            return 1
        print(f"soak: cluster at {soak.url} ({root}); {args.minutes:g} min, seed {args.seed}", flush=True)
        figures = soak.run()
    finally:
        soak.close()
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    width = max(len(name) for name, _ in TABLE)
    for name, get in TABLE:
        print(f"{name:<{width}}  {show(get(figures))}")
    for key in ("lost_job_states", "killed_jobs_not_failed", "failed_other_reasons", "api_5xx_samples"):
        if figures[key]:
            print(f"{key}: {json.dumps(figures[key])[:1500]}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
