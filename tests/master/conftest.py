"""Fixtures of the store tests: every test that takes `backend` runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hopsmgr.master.store import Store
from hopsmgr.master.stores import open_store
from tests.helpers.postgres import PostgresServer, missing_reason


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@dataclass
class Backend:
    """Where a test's store lives, and a second connection that reads it as another process would."""

    name: str
    location: str

    def open(self) -> Store:
        return open_store(self.location)

    def read(self, sql: str) -> list[tuple[Any, ...]]:
        if self.name == "sqlite":
            with contextlib.closing(sqlite3.connect(self.location)) as db:
                return [tuple(r) for r in db.execute(sql)]
        import psycopg

        with contextlib.closing(psycopg.connect(self.location, autocommit=True)) as conn:
            return [tuple(r) for r in conn.execute(sql.replace(" user", ' "user"'))]

    def write(self, sql: str) -> None:
        if self.name == "sqlite":
            with contextlib.closing(sqlite3.connect(self.location)) as db:
                db.execute(sql)
                db.commit()
            return
        import psycopg

        with contextlib.closing(psycopg.connect(self.location, autocommit=True)) as conn:
            conn.execute(sql)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "s.db"))
    server: PostgresServer = request.getfixturevalue("pg_server")
    return Backend("postgresql", server.url(server.new_database()))
