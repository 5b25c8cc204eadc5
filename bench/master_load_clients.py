"""The load on the master: job submissions, emulated agents that heartbeat, and a prober of the API.

Part of bench/master_load.py (run that script, not this module). `request` times one HTTP request
into `Counters` (latencies by kind, errors and a few samples); `submit_all` is phase 1 (the jobs,
--concurrency in flight); `Load` is phase 2: one coroutine per emulated node (`Node`, its `Attempt`s)
that beats like hopsmgr_agent and reports its attempts' progress and ends, the nodes learning of
launches from the master's executor (`told`) or by polling the API (`poller`), plus the API prober
and a probe of this process's own event-loop lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

REQUIREMENTS = ([1], [2], [1, 2, 4], [4], [8], [2, 4], [1, 2], [4, 8])
PROFILE = {"tf_s": 0.01, "tb_s": 0.02, "tu_s": 0.005, "td_s": 0.004, "samples_per_s": 100.0, "iterations": 20}
API_RATE = 20.0


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
