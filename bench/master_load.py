"""Master load benchmark: a real master process under submissions, heartbeats, rounds and API reads.

The master runs unchanged as a child process (this script with `--serve`) except for its executor,
`AcceptingExecutor`, which accepts every launch at once and answers checkpoint/stop without acting.
Only the nodes are emulated: no agent, job wrapper or job process runs. Each configured server is an
emulated agent (a coroutine here) that beats like hopsmgr_agent (every interval_s +-10 %). A node
learns of a launch the way a real one does, when the master's executor launches it: the accepting
executor writes one line per launch to a Unix socket this process listens on (`--learn push`, the
default; it costs the master a small write per launch, where the SSH executor costs more). With
`--learn poll` the nodes instead poll GET /api/v1/nodes (--poll-seconds), as this benchmark did until
2026-12-03: load on the master (1,000 nodes encoded every 2 s) and on this process that real agents
do not cause, and a node that learns of a launch late can make the master end the attempt as
"vanished" (see attempts_vanished). Profiling attempts then report a fixed profile ~2 s later, run
attempts report growing progress and exit 0 after 20-120 s. Attempts in a reply's `stop` list are
dropped; acknowledged finished attempts are not reported again.

Phase 1 submits --jobs jobs (admin token, tenants round-robin), --concurrency requests in flight.
Phase 2 runs the agents for --duration seconds while a prober reads the API at ~20 requests/s.
Latencies are client-side (client_lag_* is this process's own event-loop lag); round and heartbeat
handling times come from /metrics; CPU (utime + stime over phase 2) and peak RSS (VmHWM) from
/proc/<pid>. Client and master share the machine. Speed is never asserted.

    python bench/master_load.py --agents 1000 --jobs 10000 --duration 60 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from hopsmgr.core.metrics import percentile as pct

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # the master_load_* modules beside it (when imported as bench.master_load)

from master_load_clients import Counters, Load, Node, request, submit_all  # noqa: E402
from master_load_figures import (  # noqa: E402
    ended_attempts,
    log_events,
    loop_blocks,
    metric,
    proc_cpu_s,
    proc_status_mb,
)
from master_load_server import cluster_toml, serve, start_master, stop_master  # noqa: E402


async def fetch(url: str, token: str, path: str, c: Counters) -> Any:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        return await request(session, c, "final", "GET", url + path)


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    text, servers, tenants = cluster_toml(args.agents, args.gpus_per_node, args.round_seconds)
    (workdir / "cluster.toml").write_text(text)
    c = Counters()
    load = Load("", "", "", [Node(s, t, args.gpus_per_node) for s, t in servers], args.seed, c)
    launches = ""
    listening: asyncio.Server | None = None
    if args.learn == "push":
        launches = str(workdir / "launches.sock")
        listening = await asyncio.start_unix_server(load.told, launches)
    try:
        proc, url, admin, cluster = start_master(workdir, args.loopwatch_ms, launches)
    except BaseException:
        if listening is not None:
            listening.close()
        raise
    load.url, load.admin = url, {"Authorization": f"Bearer {admin}"}
    load.cluster = {"Authorization": f"Bearer {cluster}"}
    load.poll_s = args.poll_seconds if args.learn == "poll" else 0.0
    try:
        print(f"master pid {proc.pid} at {url}; submitting {args.jobs} jobs", flush=True)
        t0 = time.perf_counter()
        ids = await submit_all(url, admin, args.jobs, args.concurrency, tenants, c)
        submit_wall = time.perf_counter() - t0
        print(f"submitted {len(ids)} in {submit_wall:.1f}s; {args.agents} agents for {args.duration}s")
        before = metric(str(await fetch(url, admin, "/metrics", c)), "hopsmgr_round_seconds_count") or 0
        if args.loopwatch_ms:
            proc.send_signal(signal.SIGUSR1)  # count the event loop's blocks of phase 2 only
        cpu0, mine0, w0 = proc_cpu_s(proc.pid), time.process_time(), time.perf_counter()
        await load.run(args.duration, ids)
        cpu1, mine1, wall = proc_cpu_s(proc.pid), time.process_time(), time.perf_counter() - w0
        metrics = str(await fetch(url, admin, "/metrics", c))
        state = await fetch(url, admin, "/api/v1/cluster", c)
        if proc.poll() is not None:
            raise RuntimeError(f"the master exited ({proc.returncode}) during the run; see {workdir}")
        rss_peak, rss_now = proc_status_mb(proc.pid, "VmHWM"), proc_status_mb(proc.pid, "VmRSS")
    finally:
        code = stop_master(proc)
        if listening is not None:
            listening.close()
    state = state if isinstance(state, dict) else {}
    last = state.get("last_round") or {}
    lat, errors = c.lat, c.errors
    options = (
        "agents",
        "gpus_per_node",
        "jobs",
        "duration",
        "concurrency",
        "round_seconds",
        "learn",
        "poll_seconds",
    )
    result: dict[str, Any] = {k: getattr(args, k) for k in (*options, "seed")}
    result.update(
        gpus=args.agents * args.gpus_per_node,
        submit_per_s=args.jobs / submit_wall,
        heartbeats_sent=len(lat.get("heartbeat", [])) + errors.get("heartbeat", 0),
        heartbeat_server_p99_ms=metric(metrics, "hopsmgr_heartbeat_handling_ms", "0.99"),
        heartbeat_replies_deferred=metric(metrics, "hopsmgr_heartbeat_deferred_total"),
    )
    api_kinds = ("api_list", "api_cluster", "api_job")
    lat["api"] = [v for k in api_kinds for v in lat.get(k, [])]
    errors["api"] = sum(errors.get(k, 0) for k in api_kinds)
    result["api_requests"] = len(lat["api"]) + errors["api"]
    for kind in ("submit", "heartbeat", "api", *api_kinds, "nodes_poll", "client_lag"):
        if kind in ("submit", "heartbeat", "api", "client_lag"):
            result[f"{kind}_p50_ms"] = pct(lat.get(kind, []), 50)
        result[f"{kind}_p99_ms"] = pct(lat.get(kind, []), 99)
        if kind != "client_lag":
            result[f"{kind}_errors"] = errors.get(kind, 0)
    rounds = metric(metrics, "hopsmgr_round_seconds_count")
    result.update(
        rounds=None if rounds is None else int(rounds),
        rounds_phase2=None if rounds is None else int(rounds - before),
        round_p50_s=metric(metrics, "hopsmgr_round_seconds", "0.5"),
        round_p95_s=metric(metrics, "hopsmgr_round_seconds", "0.95"),
        solver_p95_s=metric(metrics, "hopsmgr_solver_seconds", "0.95"),
        last_round_age_s=time.time() - last["time"] if "time" in last else None,
        master_cpu_percent=(cpu1 - cpu0) / wall * 100,
        master_rss_mb=rss_peak,
        master_rss_end_mb=rss_now,
        master_exit_code=code,
        client_cpu_percent=(mine1 - mine0) / wall * 100,
        **loop_blocks(workdir / "state" / "loopwatch.json"),
        profiles_reported=c.profiled,
        jobs_completed=c.completed,
        end_used_gpus=state.get("used_gpus"),
        end_pending=state.get("pending"),
        end_queued=state.get("queued"),
        end_running=state.get("running"),
    )
    result.update(ended_attempts(workdir / "state" / "state.db"), **log_events(workdir / "master.log"))
    for line in c.samples:
        print(f"error sample: {line}", file=sys.stderr)
    age = result["last_round_age_s"]
    if age is not None and age > 2 * args.round_seconds:
        print(f"warning: no round for {age:.0f}s (round_seconds {args.round_seconds}): the loop stopped?")
    if code != 0:
        tail = (workdir / "master.log").read_text(errors="replace").splitlines()[-3:]
        print(f"warning: the master exited with {code} on SIGTERM; its log ends:", *tail, sep="\n  ")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1], argv[2])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000, help="emulated agents (servers)")
    parser.add_argument("--jobs", type=int, default=10000, help="jobs submitted in phase 1")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of phase 2")
    parser.add_argument("--concurrency", type=int, default=32, help="submissions in flight")
    parser.add_argument("--round-seconds", type=float, default=30.0)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument(
        "--learn",
        choices=("push", "poll"),
        default="push",
        help="how the nodes learn of launches: told by the executor, or by polling GET /api/v1/nodes",
    )
    parser.add_argument(
        "--poll-seconds", type=float, default=2.0, help="GET /api/v1/nodes period (--learn poll)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the flat result object here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (config, state, log)")
    parser.add_argument(
        "--loopwatch-ms",
        type=float,
        default=0.0,
        help="report the master's event-loop callbacks of phase 2 longer than this (bench/loopwatch.py)",
    )
    args = parser.parse_args(argv)
    if min(args.agents, args.jobs, args.concurrency, args.gpus_per_node) < 1 or args.duration <= 0:
        parser.error("--agents, --jobs, --concurrency, --gpus-per-node and --duration must be > 0")
    if args.agents * args.gpus_per_node < 8 or args.gpus_per_node > 64:
        parser.error("the cluster needs at least 8 GPUs and at most 64 per node")
    workdir = Path(tempfile.mkdtemp(prefix="hopsmgr-master-load-"))
    try:
        result = asyncio.run(bench(args, workdir))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    width = max(len(k) for k in result)
    for key, value in result.items():
        shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
