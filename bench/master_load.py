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
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hopsmgr.master.executor import ExecutorError, ExitInfo, LaunchOrder, NodeTarget

GPU_TYPES = ("v100", "p100", "k80", "a100")
REQUIREMENTS = ([1], [2], [1, 2, 4], [4], [8], [2, 4], [1, 2], [4, 8])
PROFILE = {"tf_s": 0.01, "tb_s": 0.02, "tu_s": 0.005, "td_s": 0.004, "samples_per_s": 100.0, "iterations": 20}
API_RATE = 20.0
TICK = os.sysconf("SC_CLK_TCK")
SCRIPT = str(Path(__file__).resolve())


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


# -- setup ------------------------------------------------------------------------------------------------


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


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def proc_status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


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


# -- the load ---------------------------------------------------------------------------------------------


@dataclass
class Counters:
    lat: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    completed: int = 0
    profiled: int = 0

    def ok(self, kind: str, seconds: float) -> None:
        self.lat.setdefault(kind, []).append(seconds * 1000)

    def fail(self, kind: str, what: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.samples) < 8:
            self.samples.append(f"{kind}: {what[:300]}")


async def request(
    session: aiohttp.ClientSession, c: Counters, kind: str, method: str, url: str, **kw: Any
) -> Any:
    t0 = time.perf_counter()
    try:
        async with session.request(method, url, **kw) as resp:
            text = await resp.text()
            if resp.status >= 300:
                c.fail(kind, f"HTTP {resp.status} {text}")
                return None
            c.ok(kind, time.perf_counter() - t0)
            return json.loads(text) if resp.content_type == "application/json" else text
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        c.fail(kind, repr(exc))
        return None


async def submit_all(url: str, token: str, n: int, conc: int, tenants: list[str], c: Counters) -> list[str]:
    ids: list[str] = []
    order = iter(range(n))
    headers = {"Authorization": f"Bearer {token}"}

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in order:
            body = {
                "command": ["/bin/true"],
                "gpus": REQUIREMENTS[i % len(REQUIREMENTS)],  # all fit every tenant's cap (>= 8)
                "batch_size": 32,
                "iterations": 1_000_000,
                "name": f"bench-{i}",
                "tenant": tenants[i % len(tenants)],
            }
            reply = await request(session, c, "submit", "POST", f"{url}/api/v1/jobs", json=body)
            if isinstance(reply, dict) and "id" in reply:
                ids.append(reply["id"])

    connector = aiohttp.TCPConnector(limit=conc)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(conc)))
    return ids


@dataclass
class Attempt:
    job: str
    profiling: bool
    seen: float
    end: float


@dataclass
class Node:
    id: str
    gpu_type: str
    gpus: int
    attempts: dict[str, Attempt] = field(default_factory=dict)
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    forgotten: set[str] = field(default_factory=set)


class Load:
    def __init__(self, url: str, admin: str, cluster: str, nodes: list[Node], seed: int, c: Counters) -> None:
        self.url, self.nodes, self.seed, self.c = url, {n.id: n for n in nodes}, seed, c
        self.admin = {"Authorization": f"Bearer {admin}"}
        self.cluster = {"Authorization": f"Bearer {cluster}"}
        self.deadline = 0.0
        self.interval = 5.0
        self.poll_s = 2.0

    def known(self, node: Node, item: dict[str, Any], now: float) -> None:
        aid = item["attempt"]
        if aid in node.attempts or aid in node.finished or aid in node.forgotten:
            return
        if item.get("profiling"):
            end = now + 2.0
        else:  # the same end on every node of a multi-node attempt
            end = now + random.Random(f"{self.seed}/{aid}").uniform(20.0, 120.0)
        node.attempts[aid] = Attempt(item["job"], bool(item.get("profiling")), now, end)

    async def told(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The master's launches, a JSON line each (--learn push), until the master closes the socket."""
        try:
            with contextlib.suppress(asyncio.CancelledError):  # the bench ended before the master's close
                while line := await reader.readline():
                    item = json.loads(line)
                    node = self.nodes.get(item["node"])
                    if node is not None:
                        self.known(node, item, time.time())
        finally:
            writer.close()

    async def poller(self, session: aiohttp.ClientSession) -> None:
        if self.poll_s <= 0:  # the nodes are told of launches instead
            return
        while time.monotonic() < self.deadline:
            t0 = time.monotonic()
            reply = await request(session, self.c, "nodes_poll", "GET", f"{self.url}/api/v1/nodes")
            now = time.time()
            for item in reply.get("nodes", []) if isinstance(reply, dict) else []:
                node = self.nodes.get(item["id"])
                if node is not None:
                    for running in item["running"]:
                        self.known(node, running, now)
            await asyncio.sleep(max(0.0, self.poll_s - (time.monotonic() - t0)))

    def beat_body(self, node: Node, now: float) -> dict[str, Any]:
        running: list[dict[str, Any]] = []
        for aid, a in list(node.attempts.items()):
            k = int((now - a.seen) * 10)
            progress = dict(iteration=k, samples=k * 32.0, samples_per_s=100.0, time=now, mode="run")
            if now >= a.end:
                del node.attempts[aid]
                record: dict[str, Any] = {"attempt": aid, "job": a.job, "code": 0}
                record.update({"profile": PROFILE} if a.profiling else {"progress": progress})
                node.finished[aid] = record
            else:
                running.append(
                    {"attempt": aid, "job": a.job, **({} if a.profiling else {"progress": progress})}
                )
        return {
            "node": node.id,
            "gpu_type": node.gpu_type,
            "gpus": node.gpus,
            "device_mode": "emulated",
            "workdir": f"/nonexistent/bench/{node.id}",
            "agent_version": "bench",
            "calibration": {"compute_factor": 1.0},
            "calibration_source": "emulated",
            "running": running,
            "finished": list(node.finished.values()),
        }

    async def agent(self, session: aiohttp.ClientSession, node: Node, rng: random.Random) -> None:
        """Like hopsmgr_agent: beat, apply the reply, sleep interval_s (+-10 %), 30 s request timeout."""
        delay = rng.uniform(0, self.interval)
        while (left := self.deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(delay, left))
            if time.monotonic() >= self.deadline:
                return
            delay = self.interval * rng.uniform(0.9, 1.1)
            body = self.beat_body(node, time.time())
            url = f"{self.url}/api/v1/agents/heartbeat"
            reply = await request(session, self.c, "heartbeat", "POST", url, json=body, headers=self.cluster)
            if not isinstance(reply, dict):
                continue
            self.interval = float(reply.get("interval_s", self.interval))
            for aid in reply.get("ack", []):
                record = node.finished.pop(aid, None)
                node.forgotten.add(aid)
                if record is not None and "profile" in record:
                    self.c.profiled += 1
                elif record is not None:
                    self.c.completed += 1
            for aid in reply.get("stop", []):
                node.attempts.pop(aid, None)
                node.forgotten.add(aid)

    async def prober(self, session: aiohttp.ClientSession, ids: list[str], rng: random.Random) -> None:
        paths = ["/api/v1/jobs?limit=50", "/api/v1/cluster", ""]
        kinds = ["api_list", "api_cluster", "api_job"]
        next_at = time.monotonic()
        for i in itertools.count():
            if time.monotonic() >= self.deadline:
                return
            path = paths[i % 3] or f"/api/v1/jobs/{rng.choice(ids)}"
            await request(session, self.c, kinds[i % 3], "GET", self.url + path)
            next_at += 1.0 / API_RATE
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def run(self, duration: float, ids: list[str]) -> None:
        rng = random.Random(self.seed)
        self.deadline = time.monotonic() + duration
        beats = aiohttp.TCPConnector(limit=max(1, len(self.nodes)))
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), headers=self.admin) as api,
            aiohttp.ClientSession(connector=beats, timeout=aiohttp.ClientTimeout(total=30)) as agents,
        ):
            tasks = [self.agent(agents, n, random.Random(rng.random())) for n in self.nodes.values()]
            probe = self.prober(api, ids or ["j-000001"], rng)
            await asyncio.gather(self.poller(api), probe, self.lag(), *tasks)

    async def lag(self) -> None:
        """The bench's own event-loop lag: client-side latencies include it."""
        while time.monotonic() < self.deadline:
            t0 = time.monotonic()
            await asyncio.sleep(0.1)
            self.c.ok("client_lag", time.monotonic() - t0 - 0.1)


# -- main -------------------------------------------------------------------------------------------------


async def fetch(url: str, token: str, path: str, c: Counters) -> Any:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        return await request(session, c, "final", "GET", url + path)


def ended_attempts(db: Path) -> dict[str, int]:
    """How the master recorded the attempts' ends (read from its store after it stopped)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            sql = "SELECT coalesce(end_reason, 'open'), count(*) FROM attempts GROUP BY 1 ORDER BY 1"
            return {f"attempts_{reason}": n for reason, n in conn.execute(sql)}
    except sqlite3.Error as exc:
        print(f"warning: cannot read {db}: {exc}", file=sys.stderr)
        return {}


def log_events(path: Path) -> dict[str, int]:
    """Counts of the master's warning and error log events (round_failed, node_suspect, ...)."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, AttributeError):
            event = json.loads(line)
            if event.get("level") in ("warning", "error", "critical"):
                counts[f"log_{event['event']}"] = counts.get(f"log_{event['event']}", 0) + 1
    return counts


def loop_blocks(path: Path) -> dict[str, Any]:
    """The master's event-loop blocks of phase 2 (--loopwatch-ms): flat totals, the places printed."""
    if not path.exists():
        return {}
    found = json.loads(path.read_text())
    print(f"garbage collections of phase 2: {found['gc']}")
    print("event-loop blocks of phase 2 (count, total ms, CPU ms, max ms, where):")
    for row in found["top"]:
        print(
            f"  {row['count']:5d} {row['total_ms']:9.1f} {row['cpu_ms']:9.1f} {row['max_ms']:7.1f}  {row['where']}"
        )
    return {
        "loop_blocks": found["blocks"],
        "loop_blocked_ms": found["blocked_ms"],
        "loop_blocked_cpu_ms": found["blocked_cpu_ms"],
    }


def stop_master(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


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
