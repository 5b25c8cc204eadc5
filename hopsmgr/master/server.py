"""Running the master: config -> state file, tokens, executor, HTTP server, round and health loops.

`hopsmgr master --config FILE` calls `main`. The master binds 127.0.0.1 unless the config gives TLS
(cert and key) or says `insecure = true` (then it logs a warning on every start). On its first start it
creates an admin token (<state_dir>/admin.token, mode 0600) and the cluster token agents use. It writes
<state_dir>/master.json (url, pid, epoch, role) once it listens, so local tools and tests find it. With
`[master] store = "postgresql://..."` several masters share the state and one leads (see MasterProcess).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import ssl
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import structlog
from aiohttp import web

from hopsmgr.config import ClusterConfig
from hopsmgr.logs import configure_logging
from hopsmgr.master import commands, dashboard, identity
from hopsmgr.master.api import FORECASTER, make_app
from hopsmgr.master.controller import Controller
from hopsmgr.master.executor import Executor, LocalExecutor
from hopsmgr.master.forecasts import Forecaster
from hopsmgr.master.leader import LeaderInfo, Lease, write_leader
from hopsmgr.master.rounds import RoundLoop
from hopsmgr.master.ssh import SshExecutor
from hopsmgr.master.standby import make_standby_app
from hopsmgr.master.store import Store, StoreError
from hopsmgr.master.stores import open_store
from hopsmgr.master.tokens import new_token

log = structlog.get_logger("hopsmgr.master")
# The collector's young generation every 10,000 allocations (default 700): at 10,000 jobs the default
# promoted a plan's short-lived objects into full collections of 0.1-0.3 s each (bench/master_load.py
# --loopwatch-ms), event-loop stalls every heartbeat waiting then saw.
GC_THRESHOLDS = (10_000, 10, 20)


def tune_gc() -> None:
    """For a process that is the master (not for tests that run masters inside their own process)."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_started_state() -> None:
    """After start: what the master restored lives on, so full collections need not scan it again."""
    gc.collect()
    gc.freeze()


class StartError(RuntimeError):
    """The master cannot start with this configuration (the message says what to change)."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hopsmgr"


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def read_or_create_secret(path: Path) -> str:
    if path.exists():
        value = path.read_text().strip()
        if len(value) < 16:
            raise StartError(f"{path}: the token in it is too short (at least 16 characters)")
        return value
    value = new_token()
    write_secret(path, value)
    return value


def check_listen(config: ClusterConfig) -> ssl.SSLContext | None:
    m = config.master
    if m.tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(m.tls_cert, m.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise StartError(
                f"master.tls_cert / master.tls_key: cannot load {m.tls_cert}, {m.tls_key}: {exc}"
            ) from exc
        return context
    if not m.loopback:
        if not m.insecure:
            raise StartError(
                f"master.listen = {m.listen!r} is not a loopback address: configure tls_cert and tls_key, "
                "or set insecure = true in [master] to accept plain HTTP on the network"
            )
        log.warning(
            "insecure_listen", listen=m.listen, message="plain HTTP on a network address (insecure = true)"
        )
    return None


def make_executor(config: ClusterConfig, state_dir: Path) -> Executor:
    if config.master.executor == "local":
        return LocalExecutor()
    if config.master.executor == "ssh":
        return SshExecutor(config, state_dir)
    raise StartError(f"master.executor = {config.master.executor!r} is not available (use 'local' or 'ssh')")


STEPPED_DOWN = 75  # exit status of a leader that lost its lease (systemd restarts it as a standby)


class MasterProcess:
    """One running master: build with `start`, stop with `stop` (used by main and by tests in-process).

    On SQLite it leads at once. On PostgreSQL it starts as a standby (hopsmgr.master.standby answers
    /healthz and sends API callers to the leader), takes the lease when it is free (hopsmgr.master.leader),
    then leads on the same port: loads state with a new epoch, fences the store with it, waits for the
    nodes' heartbeats (at least `lease_s`) and only then plans. A leader that loses the lease exits."""

    def __init__(
        self,
        config: ClusterConfig,
        state_dir: Path,
        listen: str | None = None,
        executor: Executor | None = None,
    ) -> None:
        if listen:
            config = replace(config, master=replace(config.master, listen=listen))
        self.config = config
        self.state_dir = state_dir
        self.listen = config.master.listen
        self.runner: web.AppRunner | None = None
        self.ctl: Controller | None = None
        self.loop: RoundLoop | None = None
        self.forecaster: Forecaster | None = None
        self.url = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.executor = executor
        self.lease: Lease | None = None
        self.store: Store | None = None
        self.role = "starting"
        self.on_step_down: Callable[[str], None] = self._exit_stepped_down
        self._tls: ssl.SSLContext | None = None
        self._cluster_token = ""

    async def start(self) -> str:
        # The planner thread is mostly Python: hand the interpreter lock back to the event loop every
        # millisecond (default 5 ms) so heartbeats and API calls wait less while a plan is computed.
        sys.setswitchinterval(0.001)
        self._tls = check_listen(self.config)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        m = self.config.master
        if m.run_as_users:  # jobs run as other accounts: the master's own files are out of their reach
            os.chmod(self.state_dir, 0o700)
            root = Path(m.checkpoint_root or self.state_dir / "checkpoints").resolve()
            if m.checkpoint_shared and root.is_relative_to(self.state_dir.resolve()):
                raise StartError(
                    f"master.checkpoint_root = {str(root)!r} is inside the state directory, which jobs "
                    "running as their users cannot reach: give a directory outside it (shared with the "
                    "nodes), or checkpoint_shared = false"
                )
        try:
            self.store = open_store(m.store or self.state_dir / "state.db")
        except StoreError as exc:
            raise StartError(str(exc)) from exc
        self._cluster_token = read_or_create_secret(
            Path(m.cluster_token_file or self.state_dir / "cluster.token")
        )
        if not m.postgres:
            await self._lead()
            return self.url
        self.lease = Lease(m.store, m.lease_s, m.lease_check_s)
        self.role = "standby"
        await self._serve(make_standby_app(self))
        self._write_info()
        log.info("master_standby", url=self.url, store=self.store.describe())
        self.tasks.append(asyncio.create_task(self._standby()))
        return self.url

    async def _standby(self) -> None:
        assert self.lease is not None
        await self.lease.acquire()
        self.lease.watch(self._lost)  # from now on: the lease is confirmed, or this master stops
        try:
            assert self.runner is not None
            await self.runner.cleanup()  # the leader's API takes the same port
            self.runner = None
            await self._lead()
        except Exception as exc:  # a leader that cannot lead must not keep the lease
            log.exception("leader_takeover_failed", error=repr(exc))
            self._lost(f"the takeover failed: {exc!r}")

    def _lost(self, reason: str) -> None:
        """The lease is not certain any more (called from the lease's watchdog thread): stop at once."""
        log.critical("leader_step_down", reason=reason, epoch=self.ctl.epoch if self.ctl else 0)
        self.role = "stepped_down"
        self.on_step_down(reason)

    def _exit_stepped_down(self, reason: str) -> None:
        # Nothing more is written or sent: the new leader loads the state and adopts what runs.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(STEPPED_DOWN)

    async def _serve(self, app: web.Application) -> None:
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        host, _, port = self.listen.rpartition(":")
        if self.url:  # the port bound before (the standby's)
            port = self.url.rpartition(":")[2]
        site = web.TCPSite(
            self.runner, host.strip("[]"), int(port), ssl_context=self._tls, reuse_address=True
        )
        await site.start()
        bound = int(port)
        for address in self.runner.addresses:  # the port actually bound (the config may say 0)
            bound = int(address[1])
        self.url = f"{'https' if self._tls else 'http'}://{host}:{bound}"

    def _write_info(self) -> None:
        info = {
            "url": self.url,
            "pid": os.getpid(),
            "epoch": self.ctl.epoch if self.ctl else 0,
            "role": self.role,
        }
        (self.state_dir / "master.json").write_text(json.dumps(info))

    def advertised(self) -> str:
        return self.config.master.advertise_url or self.url

    async def _lead(self) -> None:
        store = self.store
        assert store is not None
        m = self.config.master
        ctl = Controller(self.config, store, self.executor or make_executor(self.config, self.state_dir))
        commands.attach(ctl)
        checkpoints = Path(m.checkpoint_root or self.state_dir / "checkpoints")
        checkpoints.mkdir(parents=True, exist_ok=True)
        ctl.open(str(checkpoints))
        store.fence(ctl.epoch)
        ctl.start_writer()  # records from here on are written off the event loop (fenced the same)
        identity.seed_users(store, self.config, ctl.clock())
        if store.count_tokens(admin=True) == 0:
            token = new_token()
            admin = store.user("admin")
            if admin is None or admin["role"] != "admin":
                store.put_user("admin", self.config.tenants[0].name, "", "admin", ctl.clock())
            store.add_token(token, "admin", self.config.tenants[0].name, True, ctl.clock())
            write_secret(self.state_dir / "admin.token", token)
            log.info("admin_token_created", path=str(self.state_dir / "admin.token"))
        loop = RoundLoop(ctl)
        self.ctl = ctl
        if self.lease is not None:
            # the deposed leader has stopped (lease_s), and the nodes reported what runs, before any plan
            loop.settle_s = (m.lease_s, m.lease_s + m.suspect_after_s)
        self.role = "leader"
        app = make_app(ctl, loop, self._cluster_token, Forecaster(ctl))
        dashboard.setup(app, ctl)  # the web pages at / (hopsmgr.master.dashboard)
        await self._serve(app)
        ctl.listening()
        ctl.leader = {"url": self.advertised(), "since": ctl.started, "epoch": ctl.epoch}
        if self.lease is not None:
            write_leader(store, LeaderInfo(self.advertised(), ctl.started, ctl.epoch))
        self.loop = loop
        self.forecaster = app[FORECASTER]
        self.tasks += [
            asyncio.create_task(loop.run()),
            asyncio.create_task(loop.health()),
            asyncio.create_task(self.forecaster.run()),
        ]
        self._write_info()
        log.info(
            "master_listening",
            url=self.url,
            epoch=ctl.epoch,
            executor=ctl.executor.name,
            nodes=len(self.config.servers),
            store=store.backend,
        )

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.loop is not None:
            self.loop.close()
        if self.forecaster is not None:
            self.forecaster.close()
        if self.ctl is not None:
            for task in list(self.ctl.tasks):
                task.cancel()
            self.ctl.on_command = None  # writes still waiting commit below; their commands stay unsent
            self.ctl.flush()
            # what the estimator learnt since its last save
            with contextlib.suppress(Exception):
                state = self.ctl.estimator.export_state()
                self.ctl.store_ops([partial(Store.save_estimator, state=state, now=self.ctl.clock())])
            self.ctl.close_writer()
            await self.ctl.executor.close()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.store is not None:
            self.store.close()
        if self.lease is not None:
            self.lease.close()  # a clean stop hands the lease over at once


async def serve(config: ClusterConfig, state_dir: Path, listen: str | None = None) -> None:
    tune_gc()
    master = MasterProcess(config, state_dir, listen)
    await master.start()
    freeze_started_state()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("master_stopping")
    await master.stop()


def main(
    config: ClusterConfig, state_dir: str | None, listen: str | None, json_logs: bool | None = None
) -> int:
    configure_logging(json_logs)
    directory = Path(state_dir) if state_dir else Path(config.master.state_dir or default_state_dir())
    try:
        asyncio.run(serve(config, directory, listen))
    except StartError as exc:
        log.error("master_cannot_start", error=str(exc))
        print(f"error: {exc}")
        return 2
    return 0
