"""Failover benchmark: two masters on one PostgreSQL, N failovers under a stream of submissions.

    python bench/failover.py --failovers 5 --json failover.json

Everything is real: a throwaway PostgreSQL server (Debian's binaries, tests/helpers/postgres.py), two
`hopsmgr master` processes sharing it (tests/faults/pgcluster.py), two emulated-device agents of 2 GPUs
given both masters' URLs, and jobs that are real processes (examples/emulated_train.py, 60..150
iterations of 0.05 s). A thread submits a job every --submit-every seconds through the CLI's client
(hopsmgr.cli.client.ApiClient with both URLs: it follows the leader and retries a request once).

Each failover waits until jobs run, then takes the leader down, alternately by SIGKILL and by
terminating its lease connection (pg_terminate_backend; the leader steps down and exits), waits for the
other master's first plan, and starts the old one again as a standby. Timings are the product's defaults
(lease_s 10, lease_check_s 2) unless given; heartbeats every 0.3 s. After the failovers the submissions
stop and every job is waited for (--drain-s). Figures (printed, and flat JSON with --json):

    failovers        failovers done
    takeover_p50_s   fault to the new leader's first plan (its /healthz leader.first_plan), median
    takeover_p95_s   the same, 95th percentile (goal <= 30 s)
    lost_jobs        accepted submissions (201) the store does not have
    unfinished_jobs  accepted jobs not ended by the end of the drain (a drain too short, or a stuck job)
    duplicate_runs   jobs seen with two run attempts alive at once (node work dirs sampled every 0.1 s)
    restarted_jobs   jobs whose run attempt running at a fault ended otherwise than by exiting (its own
                     end, or a checkpoint-and-stop the scheduler chose): vanished, node_lost, orphaned...
    submit_errors    submissions that failed even after the client's retry
    jobs, completed, failed

Speed is never asserted: the exit status is 0 whatever the figures, 1 when the cluster cannot be set up.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hopsmgr.cli.client import ApiClient, ApiError
from tests.faults.helpers import RunWatcher
from tests.faults.pgcluster import PYTHON, PgCluster
from tests.helpers.postgres import PostgresServer, missing_reason
from tests.integration.cluster import EXAMPLE, Node, wait_for


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


class Submitter(threading.Thread):
    def __init__(self, cluster: PgCluster, every_s: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.client = ApiClient(",".join(cluster.urls), cluster.admin_token, timeout=30)
        self.every_s = every_s
        self.rng = random.Random(seed)
        self.accepted: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(self.every_s):
            n += 1
            iters = self.rng.randint(60, 150)
            body = {
                "gpus": [1],
                "batch_size": 8,
                "iterations": iters,
                "name": f"s{n}",
                "command": [
                    PYTHON,
                    EXAMPLE,
                    "--iters",
                    str(iters),
                    "--batch-size",
                    "8",
                    "--step-seconds",
                    "0.05",
                ],
            }
            try:
                self.accepted.append(str(self.client.post("/api/v1/jobs", body)["id"]))
            except ApiError as exc:
                self.errors.append(str(exc))


def running(cluster: PgCluster) -> dict[str, str]:
    rows = cluster.rows(
        "SELECT job_id, id FROM attempts WHERE ended IS NULL AND started IS NOT NULL AND profiling = 0"
    )
    return {r["job_id"]: r["id"] for r in rows}


def failover(cluster: PgCluster, kind: str) -> tuple[float, dict[str, str], float]:
    """One fault of `kind` on the leader; (takeover seconds, what ran at the fault, fault time)."""
    old = cluster.leader()
    assert old is not None
    before = running(cluster)
    fault_at = time.time()
    if kind == "kill":
        cluster.kill_master(old, signal.SIGKILL)
    else:
        cluster.pg.terminate("hopsmgr-lease")
        wait_for(lambda: cluster.exit_code(old) is not None, 60, "the old leader to step down")
        cluster.procs.pop(old)
    new, _ = cluster.wait_leader(120, other_than=old)
    first_plan = float((cluster.health(new) or {})["leader"]["first_plan"])
    cluster.start_master(old)
    return first_plan - fault_at, before, fault_at


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--lease-s", type=float, default=10.0)
    ap.add_argument("--lease-check-s", type=float, default=2.0)
    ap.add_argument("--submit-every", type=float, default=2.0, help="seconds between submissions")
    ap.add_argument("--gap-s", type=float, default=8.0, help="seconds between failovers")
    ap.add_argument("--drain-s", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    reason = missing_reason()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="hopsmgr-failover-"))
    pg = PostgresServer()
    pg.start()
    nodes = [Node("n1", "v100", 2), Node("n2", "v100", 2)]
    cluster = PgCluster(root, pg, nodes, lease_s=args.lease_s, lease_check_s=args.lease_check_s)
    ended = ("COMPLETED", "FAILED", "CANCELLED")
    takeovers: list[float] = []
    at_fault: list[tuple[float, dict[str, str]]] = []
    try:
        try:
            cluster.start()
        except AssertionError as exc:
            print(f"cannot set up the cluster: {exc} (logs in {root})", file=sys.stderr)
            return 1
        with RunWatcher(root) as watcher:
            submitter = Submitter(cluster, args.submit_every, args.seed)
            submitter.start()
            for n in range(args.failovers):
                wait_for(lambda: len(running(cluster)) >= 1, 120, "a running job")
                kind = "kill" if n % 2 == 0 else "terminate"
                seconds, before, fault_at = failover(cluster, kind)
                takeovers.append(seconds)
                at_fault.append((fault_at, before))
                print(f"failover {n + 1} ({kind}): takeover {seconds:.1f} s, {len(before)} jobs running")
                time.sleep(args.gap_s)
            submitter.stop.set()
            submitter.join(60)

            def drained() -> bool:
                states = {r["id"]: r["state"] for r in cluster.rows("SELECT id, state FROM jobs")}
                return all(states.get(j) in ended for j in submitter.accepted)

            try:
                wait_for(drained, args.drain_s, "every job to end")
            except AssertionError as exc:
                print(f"drain: {exc}", file=sys.stderr)
            watcher.stop()
        jobs = {r["id"]: r for r in cluster.rows("SELECT id, state FROM jobs")}
        attempts = {a["id"]: a for a in cluster.rows("SELECT id, end_reason FROM attempts")}
        restarted = set()
        for _, before in at_fault:
            for job_id, attempt_id in before.items():
                # "exited": the job's own end, or a checkpoint-and-stop the scheduler asked for (a
                # preemption, which any round may do); anything else (vanished, node_lost, orphaned,
                # stop_failed, still open) means the failover cost the job its run
                if attempts[attempt_id]["end_reason"] != "exited":
                    restarted.add(job_id)
        figures: dict[str, Any] = {
            "failovers": len(takeovers),
            "takeover_p50_s": round(statistics.median(takeovers), 2) if takeovers else None,
            "takeover_p95_s": round(percentile(takeovers, 0.95), 2) if takeovers else None,
            "lost_jobs": sum(1 for j in submitter.accepted if j not in jobs),
            "unfinished_jobs": sum(
                1 for j in submitter.accepted if j in jobs and jobs[j]["state"] not in ended
            ),
            "duplicate_runs": len({o.job for o in watcher.overlaps}),
            "restarted_jobs": len(restarted),
            "submit_errors": len(submitter.errors),
            "jobs": len(submitter.accepted),
            "completed": sum(1 for j in submitter.accepted if jobs.get(j, {}).get("state") == "COMPLETED"),
            "failed": sum(1 for j in submitter.accepted if jobs.get(j, {}).get("state") == "FAILED"),
            "lease_s": args.lease_s,
            "lease_check_s": args.lease_check_s,
        }
        if submitter.errors:
            print("submit errors:", *submitter.errors[:5], sep="\n  ")
    finally:
        cluster.close()
        pg.close()
    for key, value in figures.items():
        print(f"{key:16} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
