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
import json
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # the soak_* modules beside this script (when imported as bench.soak)

from soak_cluster import EXAMPLE, SERVERS, TENANTS, TERMINAL, Unreachable, vm_hwm_mb  # noqa: E402
from soak_faults import SoakFaults  # noqa: E402
from soak_report import SoakReport, print_report  # noqa: E402


class Soak(SoakFaults, SoakReport):
    """The whole soak: the cluster (soak_cluster), its faults (soak_faults), its figures (soak_report)
    and the job stream, with the run that ties them together."""

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
    print_report(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
