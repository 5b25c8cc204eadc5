"""A throwaway PostgreSQL server for tests: Debian's binaries, initdb in a temporary directory, listening
on a unix socket there and on a free loopback port, run as the `postgres` account when we are root.

`PostgresServer.start()` / `stop()` / `restart()`; `new_database()` gives each test a database of its
own; `terminate(application)` ends the backends of one application (pg_terminate_backend). Tests that need
one skip with the reason when the binaries or psycopg are absent (`require_postgres`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

try:
    import psycopg
except ImportError:
    psycopg = None  # type: ignore[assignment]


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def missing_reason() -> str | None:
    if psycopg is None:
        return 'psycopg is not installed (pip install "hopsmgr[postgres]")'
    if pg_bindir() is None:
        return (
            "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin (apt-get install postgresql)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' account to run the server as"
    return None


def require_postgres() -> None:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="hopsmgr-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self._databases = 0
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root)
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed ({out.returncode}): {out.stdout}\n{out.stderr}")

    @property
    def socket_dir(self) -> str:
        return str(self.root)

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-o", options, "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, database: str = "postgres", *, tcp: bool = False, port: int | None = None) -> str:
        if tcp:
            return f"postgresql://{self.user}@127.0.0.1:{port or self.port}/{database}"
        return f"postgresql://{self.user}@/{database}?host={self.root}&port={self.port}"

    def admin(self) -> Any:
        return psycopg.connect(self.url(), autocommit=True)

    def new_database(self) -> str:
        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        with contextlib.closing(self.admin()) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def terminate(self, application: str, database: str | None = None) -> int:
        """pg_terminate_backend on every backend of `application` (in `database`); how many."""
        with contextlib.closing(self.admin()) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
                "AND (%s::text IS NULL OR datname = %s)",
                (application, database, database),
            ).fetchall()
        return len(rows)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PgBouncer:
    """A real PgBouncer (Debian's /usr/sbin/pgbouncer) in front of `server`'s `database`, in `mode`
    (session, transaction or statement), as the postgres account when we are root."""

    BINARY = Path("/usr/sbin/pgbouncer")

    def __init__(self, server: PostgresServer, database: str, mode: str) -> None:
        self.server = server
        self.port = free_port()
        self.dir = server.root / f"pgbouncer-{self.port}"
        self.dir.mkdir()
        (self.dir / "users.txt").write_text(f'"{server.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{database} = host={server.root} port={server.port} dbname={database}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\npool_mode = {mode}\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\npidfile = {self.dir / 'pgbouncer.pid'}\n"
            "default_pool_size = 4\n"
        )
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            for f in self.dir.iterdir():
                shutil.chown(f, "postgres", "postgres")
        argv = [str(self.BINARY), str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"pgbouncer did not listen: {(self.dir / 'pgbouncer.log').read_text()}")

    def url(self, database: str) -> str:
        return f"postgresql://{self.server.user}@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
