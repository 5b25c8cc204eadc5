"""The SQLite state file: schema and migrations, transactions, durability across reopen, bad files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hopsmgr.master.store import SCHEMA_VERSION, Store, StoreError, hash_token


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


def test_rows_survive_reopen_with_json_columns_decoded(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with store.transaction():
        store.insert_job(job_row("j-1", 1))
        store.add_event("j-1", 1.0, "submitted", "PENDING", "hello")
    store.close()
    again = Store(tmp_path / "s.db")
    row = again.job("j-1")
    assert row is not None and row["command"][-1] == "$(rm -rf /)" and row["spec"]["gpus"] == [1, 2]
    assert [e["kind"] for e in again.events("j-1")] == ["submitted"]
    again.close()


def test_a_failed_transaction_stores_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with pytest.raises(RuntimeError), store.transaction():
        store.insert_job(job_row("j-1", 1))
        store.add_event("j-1", 1.0, "submitted", "PENDING")
        raise RuntimeError("boom")
    assert store.job("j-1") is None and store.events("j-1") == []
    with store.transaction():  # the store is usable afterwards
        store.insert_job(job_row("j-1", 1))
    assert store.job("j-1") is not None


def test_counters_and_epochs_never_repeat_across_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    assert [store.next_epoch(), store.next_epoch()] == [1, 2]
    assert [store.next_seq("attempt") for _ in range(3)] == [1, 2, 3]
    store.close()
    again = Store(tmp_path / "s.db")
    assert again.next_epoch() == 3 and again.next_seq("attempt") == 4
    again.close()


def test_tokens_are_stored_hashed(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.add_token("secret-token-value", "ana", "vision", False, 1.0)
    raw = sqlite3.connect(tmp_path / "s.db").execute("SELECT hash FROM tokens").fetchall()
    assert raw == [(hash_token("secret-token-value"),)]
    found = store.find_token("secret-token-value")
    assert found is not None and found["user"] == "ana" and not found["admin"]
    assert store.find_token("secret-token-valuf") is None
    store.close()


def test_filters_and_open_attempts(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
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


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer than this hopsmgr"):
        Store(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a usable hopsmgr state file"):
        Store(path)
    assert path.read_bytes().startswith(b"this is not a database")


def test_estimator_state_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    assert store.load_estimator() is None
    store.save_estimator({"version": 1, "x": [1, 2]}, 5.0)
    store.save_estimator({"version": 1, "x": [3]}, 6.0)
    assert store.load_estimator() == {"version": 1, "x": [3]}
    store.close()


def test_group_commit_savepoints_and_durability(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with store.grouped():
        store.insert_job(job_row("j-1", 1))
    with pytest.raises(RuntimeError), store.grouped():
        store.insert_job(job_row("j-2", 2))
        raise RuntimeError("this caller's change alone is rolled back")
    with store.grouped():
        store.insert_job(job_row("j-3", 3))
    reader = sqlite3.connect(tmp_path / "s.db")
    assert reader.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0  # not committed yet
    store.commit_group()
    assert [r[0] for r in reader.execute("SELECT id FROM jobs ORDER BY seq")] == ["j-1", "j-3"]
    with store.grouped():
        store.insert_job(job_row("j-4", 4))
    with store.transaction():  # a plain transaction first makes the open group durable
        store.add_event("j-4", 1.0, "x", None)
    assert reader.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 3
    store.close()


def test_epoch_rises_above_the_wall_clock_after_restoring_an_old_backup(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    assert store.next_epoch(1_800_000_000.5) == 1_800_000_000
    assert store.next_epoch(1_800_000_000.9) == 1_800_000_001  # same second: still one more
    store.close()
