"""The soak's faults: kills of the master, agents and job processes, cancels and bursts of bad requests.

Part of bench/soak.py (run that script, not this module). `SoakFaults` adds to the soak's cluster
(soak_cluster.SoakCluster) the fault loop, which injects one fault at a time at Poisson times with the
weights of FAULT_WEIGHTS, one `fault_<kind>` method per kind (each returns what it did, or None when
there was nothing to do), and the master restart that the end of the soak uses too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

from soak_cluster import LIVE, LOST_S, SERVERS, SUSPECT_S, SoakCluster, Unreachable, vm_hwm_mb

from hopsmgr.node import ops

FAULT_WEIGHTS = {
    "master_kill": 2,
    "agent_kill_short": 2,
    "agent_kill_long": 1,
    "job_kill": 2,
    "cancel": 2,
    "bad_burst": 2,
}


class SoakFaults(SoakCluster):
    """The fault loop and the faults it injects (methods `fault_<kind>`, one per FAULT_WEIGHTS key)."""

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
