"""The master's state: one interface (`Store`), on SQLite (the default: a file, WAL, synchronous=FULL) or
on PostgreSQL (hopsmgr.master.pgstore, for several masters with a leader lease); one writer, the schema
versioned with the same migrations on both (hopsmgr.master.migrations, in SQLite's dialect; pgstore
translates them).

Tables: meta (epoch, id counters), tenants, users (name, tenant, Unix account, role), tokens (hashed,
each a user's; `id` is a public handle for listing and revoking), jobs, attempts, events (append-only job
history), nodes (with calibration), throughput (the estimator's measured history), estimator (its
exported state) and rounds. The master is the only writer; every change that must survive a crash is
committed before the master acts on it (`transaction()` groups a change into one commit).

Rows travel as plain dicts (`JobRow`, `AttemptRow` ... are TypedDict-free dicts keyed by column); the
master's in-memory records (hopsmgr.master.state) convert to and from them. Queries are written once,
with `?` and `:name` parameters; a backend overrides only the connection, transaction and schema-version
hooks (`_begin`, `_commit`, `_rollback`, `_exec`, `_migrate`...), so a method added here works on both.
The commit rules on top of those hooks (`transaction`, `grouped`, `savepoint`) live in
hopsmgr.master.transactions.
`open_store(location)` (hopsmgr.master.stores) picks the backend: a path (SQLite) or a postgresql:// URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hopsmgr.core.model import TenantQuota
from hopsmgr.master.migrations import MIGRATIONS, SCHEMA_VERSION
from hopsmgr.master.transactions import TransactionalStore
from hopsmgr.protocol import ROLES

Row = dict[str, Any]

_JSON_COLUMNS = {
    "spec",
    "command",
    "env",
    "placement",
    "calibration",
    "devices",
    "guaranteed_gpus_by_type",
    "cap_gpus_by_type",
}


class StoreError(RuntimeError):
    """The state file cannot be used (newer schema, unreadable, disk full...)."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenant_row(quota: TenantQuota) -> Row:
    """A tenant's row in the tenants table: its quota as configured."""
    return {
        "name": quota.name,
        "guaranteed_gpus": quota.guaranteed_gpus,
        "cap_gpus": quota.cap_gpus,
        "weight": quota.weight,
        "guaranteed_gpus_by_type": dict(quota.type_guarantees),
        "cap_gpus_by_type": dict(quota.type_caps),
    }


def _decode(row: Any) -> Row:
    out: Row = {}
    for key in row.keys():  # noqa: SIM118 - sqlite3.Row has keys(), no __iter__ over names
        value = row[key]
        out[key] = json.loads(value) if key in _JSON_COLUMNS and value is not None else value
    return out


def _encode(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: json.dumps(v, sort_keys=True) if k in _JSON_COLUMNS and v is not None else v
        for k, v in values.items()
    }


def json_in_pieces(state: Mapping[str, Any]) -> str:
    """`json.dumps(state, sort_keys=True)`, made one list item at a time: one call of the C encoder over
    a large state (the estimator's: 2.5 MB at 4,000 profiles, 40 ms) holds the interpreter lock, and
    with it the event loop, for as long as it runs; between items the writer's thread lets it go."""
    parts = []
    for key in sorted(state):
        value = state[key]
        if isinstance(value, list):
            text = "[" + ", ".join(json.dumps(item, sort_keys=True) for item in value) + "]"
        else:
            text = json.dumps(value, sort_keys=True)
        parts.append(f"{json.dumps(key)}: {text}")
    return "{" + ", ".join(parts) + "}"


class Store(TransactionalStore):
    """One SQLite file; all methods run on the master's event-loop thread (the only writer)."""

    backend = "sqlite"
    _db: Any  # the backend's connection (sqlite3.Connection here, psycopg's in pgstore)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the state file {self.path}: {exc}") from exc
        self._db.row_factory = sqlite3.Row
        self._depth = 0
        self._group_open = False
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"{self.path} is not a usable hopsmgr state file: {exc}") from exc

    def close(self) -> None:
        self.commit_group()
        self._db.close()

    # -- schema -----------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this hopsmgr ({SCHEMA_VERSION}): "
                "upgrade hopsmgr or restore a backup"
            )
        for number in range(version, SCHEMA_VERSION):
            with self.transaction():
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number + 1}")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _begin(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot write the state file {self.path}: {exc}") from exc

    def _commit(self) -> None:
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()  # a failed COMMIT may leave it open, or SQLite rolled it back
            raise StoreError(f"cannot write the state file {self.path}: {exc}") from exc

    def _in_transaction(self) -> bool:
        return self._db.in_transaction

    def _rollback(self) -> None:
        if self._in_transaction():  # SQLite may have rolled back already (disk full, I/O error)
            self._db.execute("ROLLBACK")

    def sibling(self) -> Store:
        """A second connection to the same state (the store writer's thread), fenced like this one."""
        return Store(self.path)

    def _exec(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        """Run one statement (`?` or `:name` parameters); a cursor with fetchone/fetchall."""
        try:
            return self._db.execute(sql, params)
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot write the state file {self.path}: {exc}") from exc

    def _insert(self, table: str, values: Mapping[str, Any]) -> None:
        enc = _encode(values)
        cols = ", ".join(enc)
        marks = ", ".join(f":{k}" for k in enc)
        self._exec(f"INSERT INTO {table} ({cols}) VALUES ({marks})", enc)

    def _update(self, table: str, key: str, values: Mapping[str, Any]) -> None:
        if not values:
            return
        enc = _encode(values)
        sets = ", ".join(f"{k} = :{k}" for k in enc)
        self._exec(f"UPDATE {table} SET {sets} WHERE id = :__id", {**enc, "__id": key})

    # -- meta: epoch and id counters ---------------------------------------------------------------------

    def meta(self, key: str, default: str = "") -> str:
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else default

    def set_meta(self, key: str, value: str) -> None:
        self._exec(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def next_epoch(self, now: float | None = None) -> int:
        """A new master epoch, above any before (commands of older epochs are refused on nodes). With
        `now` it is at least the wall-clock second, so it still rises after restoring an older backup."""
        with self.transaction():
            epoch = max(int(self.meta("epoch", "0")) + 1, int(now or 0))
            self.set_meta("epoch", str(epoch))
        return epoch

    def next_seq(self, counter: str) -> int:
        """The next value of a counter that never repeats (call inside the transaction that uses it)."""
        with self.transaction():
            value = int(self.meta(counter, "0")) + 1
            self.set_meta(counter, str(value))
        return value

    # -- tenants and tokens --------------------------------------------------------------------------------

    def tenants(self) -> list[Row]:
        """The tenants the master last started with (its config's `[[tenants]]`), by name."""
        return [_decode(r) for r in self._exec("SELECT * FROM tenants ORDER BY name").fetchall()]

    def sync_tenants(self, tenants: Sequence[Row]) -> list[tuple[str, Row | None, Row | None]]:
        """Make the tenants table `tenants` (the config's, at each start); returns the tenants that
        differ from the last start's, as (name, row before or None, row now or None), by name."""
        with self.transaction():
            before = {r["name"]: r for r in self.tenants()}
            self._exec("DELETE FROM tenants")
            for t in tenants:
                self._insert("tenants", t)
            now = {r["name"]: r for r in self.tenants()}
        return [
            (name, before.get(name), now.get(name))
            for name in sorted(before.keys() | now.keys())
            if before.get(name) != now.get(name)
        ]

    def add_token(self, token: str, user: str, tenant: str, admin: bool, now: float) -> str:
        """Store a token of `user` (hashed); returns its public id."""
        digest = hash_token(token)
        with self.transaction():
            self._insert(
                "tokens",
                {
                    "hash": digest,
                    "id": digest[:16],
                    "user": user,
                    "tenant": tenant,
                    "admin": int(admin),
                    "created": now,
                },
            )
        return digest[:16]

    def tokens(self, user: str | None = None) -> list[Row]:
        """Tokens (public id, user, tenant, created; never the hash), oldest first."""
        sql = "SELECT id, user, tenant, created FROM tokens"
        params: tuple[str, ...] = ()
        if user is not None:
            sql, params = sql + " WHERE user = ?", (user,)
        return [dict(r) for r in self._exec(sql + " ORDER BY created, id", params).fetchall()]

    def token_by_id(self, token_id: str) -> Row | None:
        row = self._exec("SELECT id, user, tenant, created FROM tokens WHERE id = ?", (token_id,)).fetchone()
        return None if row is None else dict(row)

    def delete_token(self, token_id: str) -> None:
        with self.transaction():
            self._exec("DELETE FROM tokens WHERE id = ?", (token_id,))

    # -- users ------------------------------------------------------------------------------------------

    def user(self, name: str) -> Row | None:
        row = self._exec("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
        return None if row is None else dict(row)

    def users(self, tenant: str | None = None) -> list[Row]:
        params: tuple[str, ...]
        sql, params = "SELECT * FROM users", ()
        if tenant is not None:
            sql, params = sql + " WHERE tenant = ?", (tenant,)
        return [dict(r) for r in self._exec(sql + " ORDER BY name", params).fetchall()]

    def put_user(self, name: str, tenant: str, unix_user: str, role: str, now: float) -> None:
        """Create or change a user (its tokens keep working and follow the new tenant and role)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        with self.transaction():
            if self.user(name) is None:
                self._insert(
                    "users",
                    {"name": name, "tenant": tenant, "unix_user": unix_user, "role": role, "created": now},
                )
            else:
                self._exec(
                    "UPDATE users SET tenant = ?, unix_user = ?, role = ? WHERE name = ?",
                    (tenant, unix_user, role, name),
                )
            self._exec(
                "UPDATE tokens SET tenant = ?, admin = ? WHERE user = ?", (tenant, int(role == "admin"), name)
            )

    def delete_user(self, name: str) -> int:
        """Remove a user and revoke its tokens; how many tokens were revoked."""
        with self.transaction():
            revoked = self._exec("DELETE FROM tokens WHERE user = ?", (name,)).rowcount
            self._exec("DELETE FROM users WHERE name = ?", (name,))
        return int(revoked)

    def find_token(self, token: str) -> Row | None:
        digest = hash_token(token)
        row = self._exec("SELECT * FROM tokens WHERE hash = ?", (digest,)).fetchone()
        if row is None or not hmac.compare_digest(str(row["hash"]), digest):
            return None
        return _decode(row)

    def count_tokens(self, admin: bool | None = None) -> int:
        if admin is None:
            return int(self._exec("SELECT COUNT(*) FROM tokens").fetchone()[0])
        return int(self._exec("SELECT COUNT(*) FROM tokens WHERE admin = ?", (int(admin),)).fetchone()[0])

    # -- jobs -------------------------------------------------------------------------------------------

    def insert_job(self, row: Mapping[str, Any]) -> None:
        self._insert("jobs", row)

    def update_job(self, job_id: str, **values: Any) -> None:
        self._update("jobs", job_id, values)

    def job(self, job_id: str) -> Row | None:
        row = self._exec("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _decode(row)

    def jobs(
        self,
        *,
        states: Sequence[str] = (),
        tenant: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[Row]:
        where: list[str] = []
        params: list[Any] = []
        if states:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            params.extend(states)
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if user is not None:
            where.append("user = ?")
            params.append(user)
        sql = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY seq " + ("DESC" if newest_first else "ASC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_decode(r) for r in self._exec(sql, params).fetchall()]

    # -- attempts ---------------------------------------------------------------------------------------

    def insert_attempt(self, row: Mapping[str, Any]) -> None:
        self._insert("attempts", row)

    def update_attempt(self, attempt_id: str, **values: Any) -> None:
        self._update("attempts", attempt_id, values)

    def attempts(self, job_id: str) -> list[Row]:
        rows = self._exec("SELECT * FROM attempts WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [_decode(r) for r in rows]

    def open_attempts(self) -> list[Row]:
        rows = self._exec("SELECT * FROM attempts WHERE ended IS NULL ORDER BY seq").fetchall()
        return [_decode(r) for r in rows]

    def attempt(self, attempt_id: str) -> Row | None:
        row = self._exec("SELECT * FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        return None if row is None else _decode(row)

    # -- events -----------------------------------------------------------------------------------------

    def add_event(self, job_id: str, time: float, kind: str, state: str | None, message: str = "") -> None:
        self._exec(
            "INSERT INTO events (job_id, time, kind, state, message) VALUES (?, ?, ?, ?, ?)",
            (job_id, time, kind, state, message),
        )

    def events(self, job_id: str) -> list[Row]:
        rows = self._exec("SELECT * FROM events WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [_decode(r) for r in rows]

    # -- nodes ------------------------------------------------------------------------------------------

    def upsert_node(self, row: Mapping[str, Any]) -> None:
        enc = _encode(row)
        cols = ", ".join(enc)
        marks = ", ".join(f":{k}" for k in enc)
        updates = ", ".join(f"{k} = excluded.{k}" for k in enc if k != "id")
        self._exec(
            f"INSERT INTO nodes ({cols}) VALUES ({marks}) ON CONFLICT (id) DO UPDATE SET {updates}", enc
        )

    def nodes(self) -> list[Row]:
        return [_decode(r) for r in self._exec("SELECT * FROM nodes ORDER BY id").fetchall()]

    # -- estimator, throughput history, rounds ----------------------------------------------------------

    def save_estimator(self, state: Mapping[str, Any], now: float) -> None:
        text = json_in_pieces(state)
        self._exec(
            "INSERT INTO estimator (id, state, saved) VALUES (1, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET state = excluded.state, saved = excluded.saved",
            (text, now),
        )

    def load_estimator(self) -> dict[str, Any] | None:
        row = self._exec("SELECT state FROM estimator WHERE id = 1").fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def add_profile(
        self,
        job_id: str,
        gpu_type: str,
        profile: Mapping[str, float],
        calibration: Mapping[str, Any],
        time: float,
    ) -> None:
        self._exec(
            "INSERT INTO profiles (job_id, gpu_type, profile, calibration, time) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (job_id, gpu_type) DO UPDATE SET profile = excluded.profile, "
            "calibration = excluded.calibration, time = excluded.time",
            (job_id, gpu_type, json.dumps(dict(profile)), json.dumps(dict(calibration)), time),
        )

    def profiles(self, job_ids: Sequence[str]) -> list[Row]:
        out: list[Row] = []
        for start in range(0, len(job_ids), 500):
            part = list(job_ids[start : start + 500])
            marks = ", ".join("?" for _ in part)
            for r in self._exec(f"SELECT * FROM profiles WHERE job_id IN ({marks})", part).fetchall():
                out.append(
                    {
                        **dict(r),
                        "profile": json.loads(r["profile"]),
                        "calibration": json.loads(r["calibration"]),
                    }
                )
        return out

    def add_throughput(
        self,
        job_id: str,
        time: float,
        placement: Mapping[str, int],
        rate: float,
        estimate: float | None = None,
    ) -> None:
        self._exec(
            "INSERT INTO throughput (job_id, time, placement, samples_per_s, estimated_per_s)"
            " VALUES (?, ?, ?, ?, ?)",
            (job_id, time, json.dumps(dict(placement), sort_keys=True), rate, estimate),
        )

    def throughput(self, job_id: str) -> list[Row]:
        rows = self._exec("SELECT * FROM throughput WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [_decode(r) for r in rows]

    def add_round(self, row: Mapping[str, Any]) -> None:
        self._insert("rounds", row)

    def rounds(self, limit: int = 100) -> list[Row]:
        rows = self._exec("SELECT * FROM rounds ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [_decode(r) for r in rows]

    def describe(self) -> str:
        """Where the state is, for logs and status (no secrets)."""
        return str(self.path)

    def fence(self, epoch: int) -> None:
        """Refuse transactions once a newer epoch was taken: a no-op on SQLite, whose file one master
        holds (PostgreSQL: hopsmgr.master.pgstore)."""

    def integrity_ok(self) -> bool:
        return str(self._db.execute("PRAGMA integrity_check").fetchone()[0]) == "ok"
