"""The store on SQLite and on PostgreSQL (the `backend` fixture runs a test on both): schema and
migrations, transactions, durability across reopen, group commits, epochs; then what each backend adds
(SQLite: WAL, a file that is not a database; PostgreSQL: types, concurrent migrations, fencing)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hopsmgr.master.migrations import MIGRATIONS, SCHEMA_VERSION
from hopsmgr.master.pgstore import DeposedError, PgStore, pg_ddl, pg_sql
from hopsmgr.master.settings import MasterSettings
from hopsmgr.master.store import Store, StoreError, hash_token
from hopsmgr.master.stores import open_store
from tests.helpers.postgres import PgBouncer, PostgresServer
from tests.master.conftest import Backend

try:
    import psycopg
except ImportError:
    psycopg = None  # type: ignore[assignment]


def job_row(job_id: str, seq: int, state: str = "PENDING") -> dict[str, object]:
    return {
        "id": job_id,
        "seq": seq,
        "tenant": "t",
        "user": "u",
        "name": "n",
        "state": state,
        "submitted": 1.0,
        "state_since": 1.0,
        "spec": {
            "gpus": [1, 2],
            "total_samples": 10.0,
            "batch_size": 2,
            "params_bytes": 0.0,
            "restart_s": 1.0,
        },
        "command": ["python", "train.py", "--x", "$(rm -rf /)"],
        "env": {"A": "1"},
        "workdir": "",
        "launcher": "plain",
    }


def test_new_file_has_the_current_schema_in_wal_mode(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    assert store.schema_version == SCHEMA_VERSION
    mode = sqlite3.connect(tmp_path / "s.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store.close()


def test_rows_survive_reopen_with_json_columns_decoded(backend: Backend) -> None:
    store = backend.open()
    with store.transaction():
        store.insert_job(job_row("j-1", 1))
        store.add_event("j-1", 1.0, "submitted", "PENDING", "hello")
    store.close()
    again = backend.open()
    row = again.job("j-1")
    assert row is not None and row["command"][-1] == "$(rm -rf /)" and row["spec"]["gpus"] == [1, 2]
    assert [e["kind"] for e in again.events("j-1")] == ["submitted"]
    again.close()


def test_a_failed_transaction_stores_nothing(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(RuntimeError), store.transaction():
        store.insert_job(job_row("j-1", 1))
        store.add_event("j-1", 1.0, "submitted", "PENDING")
        raise RuntimeError("boom")
    assert store.job("j-1") is None and store.events("j-1") == []
    with store.transaction():  # the store is usable afterwards
        store.insert_job(job_row("j-1", 1))
    assert store.job("j-1") is not None
    store.close()


def test_counters_and_epochs_never_repeat_across_reopen(backend: Backend) -> None:
    store = backend.open()
    assert [store.next_epoch(), store.next_epoch()] == [1, 2]
    assert [store.next_seq("attempt") for _ in range(3)] == [1, 2, 3]
    store.close()
    again = backend.open()
    assert again.next_epoch() == 3 and again.next_seq("attempt") == 4
    again.close()


def test_tokens_are_stored_hashed(backend: Backend) -> None:
    store = backend.open()
    store.add_token("secret-token-value", "ana", "vision", False, 1.0)
    raw = backend.read("SELECT hash FROM tokens")
    assert raw == [(hash_token("secret-token-value"),)]
    found = store.find_token("secret-token-value")
    assert found is not None and found["user"] == "ana" and not found["admin"]
    assert store.find_token("secret-token-valuf") is None
    store.close()


def test_filters_and_open_attempts(backend: Backend) -> None:
    store = backend.open()
    with store.transaction():
        for i, state in enumerate(["QUEUED", "RUNNING", "COMPLETED"], start=1):
            store.insert_job(job_row(f"j-{i}", i, state))
        store.insert_attempt(
            {
                "id": "a-1",
                "seq": 1,
                "job_id": "j-2",
                "placement": {"n1": 2},
                "profiling": 0,
                "epoch": 1,
                "created": 1.0,
            }
        )
    assert [r["id"] for r in store.jobs(states=["QUEUED", "RUNNING"])] == ["j-2", "j-1"]
    assert [r["id"] for r in store.jobs(newest_first=False, limit=2)] == ["j-1", "j-2"]
    assert [a["placement"] for a in store.open_attempts()] == [{"n1": 2}]
    store.update_attempt("a-1", ended=2.0, end_reason="completed")
    assert store.open_attempts() == []
    store.close()


def test_newer_schema_is_refused_and_left_untouched(backend: Backend) -> None:
    backend.open().close()
    if backend.name == "sqlite":
        backend.write(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        version = "PRAGMA user_version"
    else:
        backend.write(f"UPDATE hopsmgr_schema SET version = {SCHEMA_VERSION + 1}")
        version = "SELECT version FROM hopsmgr_schema"
    with pytest.raises(StoreError, match="newer than this hopsmgr"):
        backend.open()
    assert backend.read(version) == [(SCHEMA_VERSION + 1,)]


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a usable hopsmgr state file"):
        Store(path)
    assert path.read_bytes().startswith(b"this is not a database")


def test_estimator_state_round_trip(backend: Backend) -> None:
    store = backend.open()
    assert store.load_estimator() is None
    store.save_estimator({"version": 1, "x": [1, 2]}, 5.0)
    store.save_estimator({"version": 1, "x": [3]}, 6.0)
    assert store.load_estimator() == {"version": 1, "x": [3]}
    store.close()


def test_group_commit_savepoints_and_durability(backend: Backend) -> None:
    store = backend.open()
    with store.grouped():
        store.insert_job(job_row("j-1", 1))
    with pytest.raises(RuntimeError), store.grouped():
        store.insert_job(job_row("j-2", 2))
        raise RuntimeError("this caller's change alone is rolled back")
    with store.grouped():
        store.insert_job(job_row("j-3", 3))
    assert backend.read("SELECT COUNT(*) FROM jobs") == [(0,)]  # not committed yet
    store.commit_group()
    assert backend.read("SELECT id FROM jobs ORDER BY seq") == [("j-1",), ("j-3",)]
    with store.grouped():
        store.insert_job(job_row("j-4", 4))
    with store.transaction():  # a plain transaction first makes the open group durable
        store.add_event("j-4", 1.0, "x", None)
    assert backend.read("SELECT COUNT(*) FROM jobs") == [(3,)]
    store.close()


def test_epoch_rises_above_the_wall_clock_after_restoring_an_old_backup(backend: Backend) -> None:
    store = backend.open()
    assert store.next_epoch(1_800_000_000.5) == 1_800_000_000
    assert store.next_epoch(1_800_000_000.9) == 1_800_000_001  # same second: still one more
    store.close()


def test_every_row_kind_round_trips_with_its_types(backend: Backend) -> None:
    """Times keep their microseconds (REAL is DOUBLE PRECISION on PostgreSQL), flags stay 0/1 integers
    even when given as booleans, the `user` column (a reserved word there) reads back by name."""
    store = backend.open()
    now = 1_800_000_000.123456
    with store.transaction():
        store.insert_job({**job_row("j-1", 1), "submitted": now, "has_checkpoint": True})
        store.upsert_node({"id": "n1", "gpu_type": "v100", "gpus": 2, "drained": True, "last_beat": now})
        store.upsert_node({"id": "n1", "gpu_type": "v100", "gpus": 4, "drained": False})
        store.add_profile("j-1", "v100", {"td": 1.5}, {"compute_factor": 1.0}, now)
        store.add_profile("j-1", "v100", {"td": 2.5}, {"compute_factor": 1.0}, now)
        store.add_throughput("j-1", now, {"n1": 2}, 12.5)
        store.add_throughput("j-1", now + 1, {"n1": 2}, 12.75, 12.123456789)
        store.add_round(
            {
                "time": now,
                "kind": "first",
                "duration_s": 0.5,
                "solve_s": 0.25,
                "method": "milp",
                "proven": 1,
                "launches": 1,
                "stops": 0,
                "queued": 0,
                "running": 1,
                "idle_gpus": 2,
            }
        )
        tenant = {"name": "t", "guaranteed_gpus": 1, "cap_gpus": None, "weight": 1.5}
        store.sync_tenants([{**tenant, "cap_gpus_by_type": {"v100": 2}, "guaranteed_gpus_by_type": {}}])
    job = store.job("j-1")
    assert job is not None and job["submitted"] == now and job["has_checkpoint"] == 1 and job["user"] == "u"
    assert [r["id"] for r in store.jobs(user="u")] == ["j-1"] and store.jobs(user="v") == []
    (node,) = store.nodes()
    assert (node["gpus"], node["drained"], node["last_beat"]) == (4, 0, now)
    assert [p["profile"] for p in store.profiles(["j-1"])] == [{"td": 2.5}]
    assert [t["placement"] for t in store.throughput("j-1")] == [{"n1": 2}, {"n1": 2}]
    # the estimate beside a measurement: none, then one kept to the last digit
    assert [t["estimated_per_s"] for t in store.throughput("j-1")] == [None, 12.123456789]
    assert store.rounds()[0]["time"] == now
    assert store.tenants() == [{**tenant, "cap_gpus_by_type": {"v100": 2}, "guaranteed_gpus_by_type": {}}]
    store.add_token("another-secret-token", "ana", "t", True, now)
    assert store.count_tokens(admin=True) == 1 and store.count_tokens() == 1
    store.close()


def test_pg_two_masters_migrating_at_once_migrate_once(pg_server: PostgresServer) -> None:
    url = pg_server.url(pg_server.new_database())
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: open_store(url), range(4)))
    assert all(s.schema_version == SCHEMA_VERSION for s in stores)
    with contextlib.closing(psycopg.connect(url)) as conn:
        assert conn.execute("SELECT version FROM hopsmgr_schema").fetchall() == [(SCHEMA_VERSION,)]
    for s in stores:
        s.close()


def test_pg_a_deposed_master_can_commit_nothing(pg_server: PostgresServer) -> None:
    url = pg_server.url(pg_server.new_database())
    old, new = PgStore(url), PgStore(url)
    old.fence(old.next_epoch())
    with old.transaction():
        old.insert_job(job_row("j-1", 1))
    new.fence(new.next_epoch())  # a new leader took the epoch
    with pytest.raises(DeposedError, match="no longer the newest"), old.transaction():
        old.insert_job(job_row("j-2", 2))
    assert old.deposed and new.job("j-2") is None
    with new.transaction():
        new.insert_job(job_row("j-2", 2))
    assert [r["id"] for r in new.jobs()] == ["j-2", "j-1"]
    old.close()
    new.close()


def test_pg_the_new_leaders_epoch_waits_for_the_old_leaders_open_transaction(
    pg_server: PostgresServer,
) -> None:
    """The epoch row is read FOR SHARE by every fenced transaction: the bump waits, then fences."""
    url = pg_server.url(pg_server.new_database())
    old, new = PgStore(url), PgStore(url)
    old.fence(old.next_epoch())
    with ThreadPoolExecutor(1) as pool:
        with old.transaction():
            old.insert_job(job_row("j-1", 1))
            bump = pool.submit(new.next_epoch)
            with pytest.raises(TimeoutError):
                bump.result(timeout=0.5)  # blocked by the old leader's open transaction
        epoch = bump.result(timeout=10)
    assert epoch > old._fence and new.job("j-1") is not None
    with pytest.raises(DeposedError):
        old.next_seq("job")
    old.close()
    new.close()


def test_pg_the_store_reconnects_after_its_backend_was_terminated(pg_server: PostgresServer) -> None:
    db = pg_server.new_database()
    store = PgStore(pg_server.url(db))
    with store.transaction():
        store.insert_job(job_row("j-1", 1))
    assert pg_server.terminate("hopsmgr-master", db) == 1
    with pytest.raises(StoreError, match="cannot use the state database"):
        store.job("j-1")
    assert store.job("j-1") is not None  # the next statement opens a new session
    store.close()


def test_pg_an_unreachable_server_is_a_clear_error_naming_the_field(pg_server: PostgresServer) -> None:
    with pytest.raises(StoreError, match=r"master.store = 'postgresql://postgres:\*\*\*@127.0.0.1:1/x'"):
        open_store("postgresql://postgres:hunter2@127.0.0.1:1/x")


def test_pg_sql_translation() -> None:
    assert pg_sql("SELECT * FROM jobs WHERE user = ? AND id = :id") == (
        'SELECT * FROM jobs WHERE "user" = %s AND id = %(id)s'
    )
    assert pg_sql("SELECT 'user' FROM users WHERE x LIKE 'a%'", with_params=False) == (
        "SELECT 'user' FROM users WHERE x LIKE 'a%'"
    )
    assert pg_ddl("seq INTEGER PRIMARY KEY AUTOINCREMENT, t REAL, n INTEGER, b BLOB, user TEXT") == (
        'seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, t DOUBLE PRECISION, n BIGINT, b BYTEA, "user" TEXT'
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("mysql://db/x", "unknown scheme 'mysql://'"),
        ("postgresql://db.lab", "needs a database name"),
        ("postgresql:///hops", "needs a host"),
        ("postgresql://db:port/hops", "not a valid URL"),
    ],
)
def test_a_bad_store_setting_is_refused_naming_the_field(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"master.store: .*{why}.*got '{value}'"):
        MasterSettings(store=value)


def test_good_store_settings() -> None:
    assert not MasterSettings(store="/var/lib/hopsmgr/state.db").postgres
    assert MasterSettings(store="postgresql://hops@db.lab:5432/hops").postgres
    assert MasterSettings(store="postgresql:///hops?host=/run/postgresql").postgres


@pytest.mark.skipif(
    not PgBouncer.BINARY.exists(), reason="pgbouncer is not installed (apt-get install pgbouncer)"
)
@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_pg_a_transaction_mode_pooler_is_refused(pg_server: PostgresServer, mode: str) -> None:
    database = pg_server.new_database()
    bouncer = PgBouncer(pg_server, database, mode)
    try:
        with pytest.raises(StoreError, match=r"transaction-mode connection pooler.*pool_mode = session"):
            open_store(bouncer.url(database))
    finally:
        bouncer.close()


@pytest.mark.skipif(
    not PgBouncer.BINARY.exists(), reason="pgbouncer is not installed (apt-get install pgbouncer)"
)
def test_pg_a_session_mode_pooler_is_accepted(pg_server: PostgresServer) -> None:
    database = pg_server.new_database()
    bouncer = PgBouncer(pg_server, database, "session")
    try:
        store = open_store(bouncer.url(database))
        assert store.schema_version == SCHEMA_VERSION
        store.close()
    finally:
        bouncer.close()


def test_the_estimator_state_is_written_as_json_dumps_would_write_it() -> None:
    from hopsmgr.master.store import json_in_pieces

    state = {"version": 1, "b": [{"y": 1, "x": [1.5, None]}, {"z": "é"}], "a": [], "c": {"k": 2, "j": 1}}
    assert json_in_pieces(state) == json.dumps(state, sort_keys=True)


def test_an_older_stores_throughput_history_is_kept_without_estimates(tmp_path: Path) -> None:
    """Migration 5 adds the estimate beside each measured throughput; the rows written before it read
    back with none, and new rows carry theirs."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:4]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 4")
    db.execute(
        "INSERT INTO throughput (job_id, time, placement, samples_per_s) VALUES ('j-1', 1.0, '{\"n1\": 1}', 9.5)"
    )
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    store.add_throughput("j-1", 2.0, {"n1": 1}, 9.75, 10.0)
    assert [(t["samples_per_s"], t["estimated_per_s"]) for t in store.throughput("j-1")] == [
        (9.5, None),
        (9.75, 10.0),
    ]
    store.close()
