"""A real cluster in one process: the master (aiohttp, SQLite, the local executor) and its agents
(emulated devices) on one event loop in a thread; jobs are real processes started by the node wrapper.

`InProcessCluster.check()` asserts the scheduler's invariants on the master's live state and store:
no GPU claimed beyond a node's size, no GPU index given twice, every live job counted in exactly one
state and stored in that state, attempt ids unique, every open attempt on a known node. The
`in_process_cluster` fixture (tests/control/conftest.py) calls it at teardown and gives each test a
deadline (SIGALRM), so a stuck test fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hopsmgr_agent.config import AgentConfig
from hopsmgr_agent.main import Agent

from hopsmgr.config import parse_cluster_config
from hopsmgr.core.lifecycle import TERMINAL
from hopsmgr.master.executor import LocalExecutor
from hopsmgr.master.server import MasterProcess


class InProcessCluster:
    def __init__(self, root: Path, config: dict[str, Any]) -> None:
        self.root = root
        self.config = parse_cluster_config(config)
        self.master = MasterProcess(
            self.config, root / "state", listen="127.0.0.1:0", executor=LocalExecutor()
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stop_agents = asyncio.Event()
        self.agent_tasks: list[Any] = []

    def start(self, speeds: dict[str, float] | None = None) -> InProcessCluster:
        self.thread.start()
        self.url = self.call(self.master.start())
        self.admin = (self.root / "state" / "admin.token").read_text().strip()
        token = (self.root / "state" / "cluster.token").read_text().strip()
        for server in self.config.servers:
            workdir = self.root / "nodes" / server.id
            workdir.mkdir(parents=True, exist_ok=True)
            agent = Agent(
                AgentConfig(
                    node=server.id,
                    master=self.url,
                    token=token,
                    workdir=str(workdir),
                    gpu_type=server.gpu_type,
                    count=server.gpus,
                    speed=(speeds or {}).get(server.id, 1.0),
                )
            )
            self.agent_tasks.append(asyncio.run_coroutine_threadsafe(agent.run(self.stop_agents), self.loop))
        return self

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.admin}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.1)

    def check(self) -> None:
        ctl = self.master.ctl
        assert ctl is not None
        state = ctl.machine.state

        async def snapshot() -> tuple[Any, ...]:  # read on the loop's thread: a consistent view
            while ctl.writer.pending():  # every record handed to the store writer committed
                await ctl.settled()
            rows = {r["id"]: r for r in ctl.store.jobs()}
            attempts = [a for job_id in rows for a in ctl.store.attempts(job_id)]
            held = state.held()
            assert held == state.held_recount(), (held, state.held_recount())
            assert state.profiling_gpus == state.profiling_gpus_recount()
            devices = Counter(
                (sid, d) for a in state.attempts.values() for sid, ds in a.devices.items() for d in ds
            )
            live = {j.id: j.state for j in state.jobs.values()}
            counts = {k: n for k, n in state.counts.items() if n}
            nodes = {a.id: a.placement.servers for a in state.attempts.values()}
            return rows, attempts, held, devices, live, counts, nodes

        rows, attempts, held, devices, live, counts, nodes = self.call(snapshot())
        for sid, n in held.items():
            assert n <= state.nodes[sid].server.gpus, f"{sid}: {n} GPUs claimed"
        assert all(n == 1 for n in devices.values()), f"GPU indices given twice: {devices}"
        assert Counter(live.values()) == Counter(counts), (live, counts)
        for job_id, job_state in live.items():
            assert rows[job_id]["state"] == job_state.value, (job_id, rows[job_id]["state"], job_state)
        for job_id, row in rows.items():
            if job_id not in live:
                assert row["state"] in {s.value for s in TERMINAL}, (job_id, row["state"])
        ids = [a["id"] for a in attempts]
        assert len(ids) == len(set(ids)), "attempt ids repeat"
        assert all(set(servers) <= set(state.nodes) for servers in nodes.values())

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every live job and wait until no GPU is held: a master that stops leaves its jobs
        running (by design), so a test cluster cancels them first or they outlive the tests."""
        live = ("PENDING", "PROFILING", "QUEUED", "LAUNCHING", "RUNNING")
        query = "&".join(f"state={s}" for s in live)
        for job in self.api("GET", f"/api/v1/jobs?{query}")["jobs"]:
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("POST", f"/api/v1/jobs/{job['id']}/cancel")
        self.wait(
            lambda: (
                not self.api("GET", f"/api/v1/jobs?{query}")["jobs"]
                and all(n["free_gpus"] == n["gpus"] for n in self.api("GET", "/api/v1/nodes")["nodes"])
            ),
            timeout,
            "every job ended and its GPUs free after cancelling",
        )
        time.sleep(1.0)  # the node wrappers that stopped them exit and are reaped on the loop

    def close(self) -> None:
        try:
            if getattr(self, "url", ""):
                with contextlib.suppress(Exception):
                    self.cancel_all()
            self.loop.call_soon_threadsafe(self.stop_agents.set)
            for task in self.agent_tasks:
                task.result(30)
            self.call(self.master.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
