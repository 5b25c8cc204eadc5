"""Users and tokens in the SQLite state file: the migration of older stores' tokens to users, and
the user and token operations the API builds on (real SQLite files)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hopsmgr.master.identity import PrincipalCache, principal_for
from hopsmgr.master.store import MIGRATIONS, Store, hash_token
from tests.master.conftest import Backend

USERS_MIGRATION = 3  # the migration that adds users (1-based, as PRAGMA user_version counts)


def old_store(path: Path, tokens: list[tuple[str, str, str, int]]) -> None:
    """A state file as hopsmgr wrote it before users existed, holding these (token, user, tenant, admin)."""
    db = sqlite3.connect(path)
    for number in range(USERS_MIGRATION - 1):
        db.executescript(MIGRATIONS[number])
    db.execute(f"PRAGMA user_version = {USERS_MIGRATION - 1}")
    for i, (token, user, tenant, admin) in enumerate(tokens):
        db.execute(
            "INSERT INTO tokens (hash, user, tenant, admin, created) VALUES (?, ?, ?, ?, ?)",
            (hash_token(token), user, tenant, admin, 100.0 + i),
        )
    db.commit()
    db.close()


def test_old_tokens_become_users_and_keep_working(tmp_path: Path) -> None:
    old_store(
        tmp_path / "s.db",
        [
            ("admin-secret-0123456789", "admin", "vision", 1),
            ("ana-secret-0123456789ab", "ana", "vision", 0),
            ("ana-second-0123456789ab", "ana", "vision", 0),
            ("bo-secret-0123456789abc", "bo", "nlp", 0),
        ],
    )
    store = Store(tmp_path / "s.db")
    assert store.schema_version >= USERS_MIGRATION
    assert [(u["name"], u["tenant"], u["role"], u["unix_user"]) for u in store.users()] == [
        ("admin", "vision", "admin", ""),
        ("ana", "vision", "user", ""),
        ("bo", "nlp", "user", ""),
    ]
    ana = principal_for(store, "ana-second-0123456789ab")
    assert ana is not None and (ana.user, ana.tenant, ana.admin, ana.tenant_admin) == (
        "ana",
        "vision",
        False,
        False,
    )
    admin = principal_for(store, "admin-secret-0123456789")
    assert admin is not None and admin.admin
    assert principal_for(store, "not-a-token") is None
    ids = [t["id"] for t in store.tokens("ana")]
    assert len(ids) == 2 and all(len(i) == 16 for i in ids)
    assert ids[0] == hash_token("ana-secret-0123456789ab")[:16]
    assert all(
        "hash" not in t for t in store.tokens()
    )  # listing never shows what a token could be checked against
    store.close()


def test_put_user_moves_its_tokens_and_delete_revokes_them(backend: Backend) -> None:
    store = backend.open()
    store.put_user("ana", "vision", "ana", "user", 1.0)
    token_id = store.add_token("t" * 43, "ana", "vision", False, 2.0)
    store.put_user("ana", "nlp", "ana", "tenant-admin", 3.0)
    who = principal_for(store, "t" * 43)
    assert who is not None and (who.tenant, who.tenant_admin) == ("nlp", True)
    assert store.token_by_id(token_id) == {"id": token_id, "user": "ana", "tenant": "nlp", "created": 2.0}
    store.close()
    store = backend.open()  # durable
    assert store.user("ana") == {
        "name": "ana",
        "tenant": "nlp",
        "unix_user": "ana",
        "role": "tenant-admin",
        "created": 1.0,
    }
    assert store.delete_user("ana") == 1
    assert principal_for(store, "t" * 43) is None and store.users() == []
    store.close()


def test_the_principal_cache_reads_the_store_again_after_its_ttl_and_keeps_no_unknown_token(
    tmp_path: Path,
) -> None:
    """The API's authentication (identity.PrincipalCache): a known token is answered from memory for
    ttl_s; a change made behind the master's back counts once that has passed; a token the store did
    not know yet works as soon as it is stored; clear() (the master's own revocations) counts at once."""
    store = Store(tmp_path / "s.db")
    store.put_user("ana", "vision", "ana", "user", 1.0)
    token_id = store.add_token("t" * 43, "ana", "vision", False, 2.0)
    clock = [0.0]
    cache = PrincipalCache(ttl_s=2.0, clock=lambda: clock[0])
    assert cache.lookup(store, "u" * 43) is None
    store.add_token("u" * 43, "ana", "vision", False, 3.0)
    assert cache.lookup(store, "u" * 43) is not None  # an unknown token was not kept
    who = cache.lookup(store, "t" * 43)
    assert who is not None and who.tenant == "vision"
    store.put_user("ana", "nlp", "ana", "user", 4.0)  # behind the cache's back
    clock[0] = 1.9
    assert cache.lookup(store, "t" * 43) == who  # within the ttl: from memory
    clock[0] = 2.1
    again = cache.lookup(store, "t" * 43)
    assert again is not None and again.tenant == "nlp"
    store.delete_token(token_id)
    assert cache.lookup(store, "t" * 43) is not None  # kept, until cleared or expired
    cache.clear()
    assert cache.lookup(store, "t" * 43) is None
    store.close()
