"""The agent's main loop: heartbeat the master, report attempts, apply its answers, reap strays.

Each beat reads the node's attempt records (hopsmgr.node.ops.status), reports running attempts with
their progress and finished ones with exit status, profile and log tail; the master's answer acks
finished attempts (the agent then forgets them) and lists attempts that must not run (the agent stops
them: grace, then kill). Answers from an older master epoch than one already seen are ignored (fencing).
Connection failures back off exponentially up to 30 s; the agent never gives up.

Devices: "nvml" discovers the GPUs at start (hopsmgr_agent.devices; a missing driver stops the agent with
a message), "cpu" offers the configured CPU slots, "emulated" reports its configured type, count and
speed, labelled "emulated" and never mixed with measured numbers. On "nvml" and "cpu" nodes the
calibration kernels (hopsmgr_agent.calibrate) run at start (calibrate = "start") and again whenever a
heartbeat reply asks (calibrate = true), in a child process watched by a thread
(hopsmgr_agent.calibrator): heartbeats go out from the first second, with no calibration until the first
run ends, then with its factors. Each run's raw report is written to <workdir>/calibration.json; with
calibrate = "never" the agent reports the one saved there, if any.
With probe_port set, the agent serves the network-probe sink that other agents measure B_net against.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import ssl
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from hopsmgr.config import ConfigError
from hopsmgr.logs import configure_logging
from hopsmgr.node import ops
from hopsmgr.node.layout import WrapperError
from hopsmgr.protocol import (
    PROGRESS,
    FinishedAttempt,
    Heartbeat,
    HeartbeatReply,
    Progress,
    RunningAttempt,
    WireError,
    parse_heartbeat_reply,
)
from hopsmgr_agent import __version__
from hopsmgr_agent.calibrator import Calibrator
from hopsmgr_agent.config import AgentConfig, load_agent_config
from hopsmgr_agent.devices import DeviceError, Inventory, discover
from hopsmgr_agent.probe import ProbeSink

log = structlog.get_logger("hopsmgr.agent")
LOG_TAIL_BYTES = 4000
# JSON bytes of finished attempts per beat: the master takes bodies of at most 64 KiB, and a tail of
# 4,000 bytes can take 24,000 in JSON (control characters and non-ASCII as \uXXXX), so eight ended
# attempts at once could exceed it, and a beat refused with 413 would be sent again and again. Those
# over the budget wait for the next beat (they are reported until the master acknowledges them).
FINISHED_BUDGET = 40 * 1024
RETENTION_S = 7 * 24 * 3600.0  # finished attempts (and their logs) are kept this long on the node


def within_budget(
    finished: Sequence[FinishedAttempt], budget: int = FINISHED_BUDGET
) -> tuple[FinishedAttempt, ...]:
    """The first of `finished` whose JSON fits `budget` bytes (at least one: a single one always fits
    the master's limit); the others are reported in later beats."""
    kept: list[FinishedAttempt] = []
    used = 0
    for attempt in finished:
        size = len(json.dumps(asdict(attempt)))
        if kept and used + size > budget:
            log.info("finished_deferred", reported=len(kept), deferred=len(finished) - len(kept))
            break
        kept.append(attempt)
        used += size
    return tuple(kept)


class Agent:
    def __init__(self, config: AgentConfig, inventory: Inventory | None = None) -> None:
        self.config = config
        if config.devices == "nvml" and inventory is None:
            inventory = discover()  # DeviceError says what is missing
        self.inventory = inventory
        self.epoch = 0
        self.interval_s = 5.0
        self.stopping: set[str] = set()
        self.beats = 0
        self.collected = 0.0
        self.current = 0  # index of the master URL beaten to (several masters: PostgreSQL store)
        self.leader = ""  # the leader a standby named
        self.tried = 0  # failed beats in a row (each URL tried before backing off)
        if inventory is not None:
            self.gpu_type, self.gpus = config.gpu_type or inventory.gpu_type, len(inventory.gpus)
        else:
            self.gpu_type, self.gpus = config.gpu_type, config.count
        self.calibrator = None if config.devices == "emulated" else Calibrator(config, self.gpu_type)

    def devices(self) -> dict[str, Any]:
        c = self.config
        if self.calibrator is None:
            calibration = {"compute_factor": c.speed, "memory_factor": c.speed, "data_factor": 1.0}
            return {
                "gpu_type": c.gpu_type,
                "gpus": c.count,
                "device_mode": "emulated",
                "calibration": calibration,
                "calibration_source": "emulated",
            }
        latest, error = self.calibrator.latest, self.calibrator.error
        return {
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "device_mode": c.devices,
            "calibration": None if latest is None else dict(latest[0]),
            "calibration_source": "" if latest is None else latest[1],
            "message": f"calibration failed: {error}"[:1024] if error else "",
        }

    def start_calibration(self, reason: str) -> bool:
        """Start a calibration run beside the heartbeats; False on emulated nodes or while one runs."""
        if self.calibrator is None:
            log.info("calibration_not_applicable", node=self.config.node, reason=reason, devices="emulated")
            return False
        return self.calibrator.start(reason)

    def start_background(self) -> None:
        """What runs beside the heartbeats from the start: the first calibration, or the saved one."""
        if self.calibrator is None:
            return
        if self.config.calibrate == "start":
            self.calibrator.start("start")
        else:
            self.calibrator.load_saved()

    def report(self) -> Heartbeat:
        """This beat's message: identity, devices, and what the node's attempt records say."""
        records = ops.status(self.config.workdir)["attempts"]
        running: list[RunningAttempt] = []
        finished: list[FinishedAttempt] = []
        for rec in records:
            if rec.get("job") is None or self._acked(rec["attempt"]):
                continue
            if rec["state"] == "running":
                running.append(RunningAttempt(rec["attempt"], rec["job"], _progress(rec)))
                continue
            exit_rec = rec.get("exit") or {}
            try:
                tail = ops.logs(self.config.workdir, rec["attempt"], LOG_TAIL_BYTES)["log"]
            except WrapperError:
                tail = ""
            finished.append(
                FinishedAttempt(
                    attempt=rec["attempt"],
                    job=rec["job"],
                    code=exit_rec.get("code"),
                    signal=exit_rec.get("signal"),
                    checkpointed=bool(exit_rec.get("checkpointed", False)),
                    profile=_numbers(rec.get("profile")),
                    progress=_progress(rec),
                    log_tail=tail,
                )
            )
        return Heartbeat(
            node=self.config.node,
            agent_version=__version__,
            epoch_seen=self.epoch,
            workdir=self.config.workdir,
            running=tuple(running),
            finished=within_budget(finished),
            **self.devices(),
        )

    async def apply(self, reply: HeartbeatReply) -> None:
        if reply.epoch < self.epoch:
            log.warning("stale_master_reply", epoch=reply.epoch, seen=self.epoch)
            return
        self.epoch = reply.epoch
        self.interval_s = reply.interval_s
        for attempt in reply.ack:
            # Keep the attempt's directory (its log stays readable); stop reporting it; drop it later.
            with contextlib.suppress(OSError):
                (self._dir(attempt) / "acked").touch()
        self._collect()
        if reply.calibrate:
            self.start_calibration("master")
        for attempt in reply.stop:
            if attempt not in self.stopping:
                self.stopping.add(attempt)
                asyncio.get_running_loop().create_task(self._reap(attempt))

    def _dir(self, attempt: str) -> Path:
        return Path(self.config.workdir) / "attempts" / attempt

    def _acked(self, attempt: str) -> bool:
        return (self._dir(attempt) / "acked").exists()

    def _collect(self) -> None:
        """Forget acknowledged attempts older than the retention period (their logs go with them)."""
        now = time.time()
        if now - self.collected < 600:
            return
        self.collected = now
        for marker in Path(self.config.workdir).glob("attempts/*/acked"):
            with contextlib.suppress(OSError, WrapperError):
                if now - marker.stat().st_mtime > RETENTION_S:
                    ops.forget(self.config.workdir, marker.parent.name)

    async def _reap(self, attempt: str) -> None:
        try:
            # No grace: a stale attempt must not answer SIGTERM with a checkpoint of its own (the job
            # runs elsewhere now and owns its checkpoints).
            await asyncio.to_thread(ops.stop, self.config.workdir, attempt, self.epoch, grace=0.0)
            log.info("reaped", attempt_id=attempt, node=self.config.node)
        except WrapperError as exc:
            log.warning("reap_failed", attempt_id=attempt, error=str(exc))
        finally:
            self.stopping.discard(attempt)

    @property
    def max_backoff_s(self) -> float:
        """Retry at least every two intervals, so a restarted master sees us within its grace period."""
        return min(30.0, max(1.0, 2 * self.interval_s))

    @property
    def master_url(self) -> str:
        """The master this agent beats to now (of several on PostgreSQL: the one that leads)."""
        masters = self.config.masters
        return self.leader if self.leader in masters else masters[self.current % len(masters)]

    def next_master(self, leader: str | None) -> bool:
        """After a failed beat: the leader a standby named, else the next URL; whether to retry at once
        (each URL is tried once before backing off)."""
        masters = self.config.masters
        self.tried += 1
        if leader and leader in masters and leader != self.master_url:
            self.leader = leader
        else:
            self.leader = ""
            self.current += 1
        if self.tried < 2 * len(masters):
            return True
        self.tried = 0
        return False

    async def beat(self, session: aiohttp.ClientSession) -> None:
        body = (await asyncio.to_thread(self.report)).to_json()
        url = f"{self.master_url}/api/v1/agents/heartbeat"
        headers = {"Authorization": f"Bearer {self.config.token}"}
        async with session.post(url, json=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                error = data.get("error", {}) if isinstance(data, dict) else {}
                leader = data.get("leader") if isinstance(data, dict) else None
                raise RefusedError(resp.status, str(error.get("message", data)), leader)
        await self.apply(parse_heartbeat_reply(data))
        self.beats += 1
        self.tried = 0

    async def run(self, stop: asyncio.Event) -> None:
        sink = await self._start_sink()
        self.start_background()
        try:
            await self._beat_loop(stop)
        finally:
            if self.calibrator is not None:
                await asyncio.to_thread(self.calibrator.stop, 10.0)
            if sink is not None:
                await sink.close()

    async def _start_sink(self) -> ProbeSink | None:
        if not self.config.probe_port:
            return None
        sink = ProbeSink("", self.config.probe_port)
        try:
            await sink.start()
        except OSError as exc:
            log.error("probe_sink_failed", port=self.config.probe_port, error=str(exc), node=self.config.node)
            return None
        log.info("probe_sink_listening", port=sink.port, node=self.config.node)
        return sink

    async def _beat_loop(self, stop: asyncio.Event) -> None:
        ssl_ctx: ssl.SSLContext | bool = True
        if self.config.tls_ca:
            ssl_ctx = ssl.create_default_context(cafile=self.config.tls_ca)
        backoff = 1.0
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(ssl=ssl_ctx)
        ) as session:
            while not stop.is_set():
                try:
                    await self.beat(session)
                    backoff = 1.0
                    delay = self.interval_s
                except RefusedError as exc:
                    if exc.status == 503 and len(self.config.masters) > 1 and self.next_master(exc.leader):
                        log.info("master_is_standby", message=exc.message, next=self.master_url)
                        continue
                    log.error(
                        "heartbeat_refused", status=exc.status, message=exc.message, node=self.config.node
                    )
                    delay = backoff = min(backoff * 2, self.max_backoff_s)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, WireError, ValueError) as exc:
                    if len(self.config.masters) > 1 and self.next_master(None):
                        log.info("master_unreachable", error=repr(exc), next=self.master_url)
                        continue
                    log.warning("heartbeat_failed", error=repr(exc), node=self.config.node, retry_s=backoff)
                    delay = backoff
                    backoff = min(backoff * 2, self.max_backoff_s)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay * random.uniform(0.9, 1.1))


class RefusedError(RuntimeError):
    def __init__(self, status: int, message: str, leader: object = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.leader = leader if isinstance(leader, str) else None
        self.message = message


def _numbers(value: Any) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    return {k: float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _progress(rec: dict[str, Any]) -> Progress | None:
    """The runtime's progress record as the wire's Progress; a malformed one is left out (and logged)."""
    p = rec.get("progress")
    if not isinstance(p, dict):
        return None
    try:
        return PROGRESS.check({k: v for k, v in p.items() if k in PROGRESS.fields}, "progress")
    except WireError as exc:
        log.warning("progress_unreadable", attempt_id=rec.get("attempt"), error=str(exc))
        return None


async def _amain(config: AgentConfig, inventory: Inventory | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "agent_started",
        node=config.node,
        master=config.master,
        devices=config.devices,
        emulated=config.devices == "emulated",
        calibrate=config.calibrate if config.devices != "emulated" else "n/a",
    )
    await Agent(config, inventory).run(stop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hopsmgr-agent", description="hopsmgr node agent")
    parser.add_argument("--config", required=True, help="agent TOML file")
    parser.add_argument("--json-logs", action="store_true", default=None)
    args = parser.parse_args(argv)
    configure_logging(args.json_logs)
    try:
        config = load_agent_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    inventory = None
    if config.devices == "nvml":
        try:
            inventory = discover()
            gpu_type = config.gpu_type or inventory.gpu_type
        except DeviceError as exc:
            print(f'error: {args.config}: devices = "nvml": {exc}', file=sys.stderr)
            return 2
        log.info("gpus_discovered", gpu_type=gpu_type, **inventory.to_json())
    asyncio.run(_amain(config, inventory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
