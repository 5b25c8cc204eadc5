"""The store's tenants table holds each tenant's whole quota as the master last started with it (caps
and guarantees per GPU type included, migration 6), and a start logs what changed since the last."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from hopsmgr.config import ClusterConfig
from hopsmgr.core.model import Server, TenantQuota
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.controller import Controller
from hopsmgr.master.migrations import MIGRATIONS, SCHEMA_VERSION
from hopsmgr.master.store import Store
from tests.control.test_drivers import NoExecutor

VISION = TenantQuota("vision", 2, 8, 1.5, type_caps=(("v100", 4),), type_guarantees=(("p100", 2),))
NLP = TenantQuota("nlp", 0, None, 1.0)
SERVERS = (Server("n1", "v100", 4), Server("n2", "p100", 4))


def start(path: Path, tenants: tuple[TenantQuota, ...]) -> list[MutableMapping[str, Any]]:
    """Open a controller on the store at `path` with these tenants; the tenant events it logged."""
    store = Store(path)
    config = ClusterConfig("t", SERVERS, SchedulerSettings(), tenants)
    with capture_logs() as logs:
        Controller(config, store, NoExecutor(), clock=time.time).open(str(path.parent / "ckpt"))  # type: ignore[arg-type]
    store.close()
    return [e for e in logs if e["event"] == "tenant_quota_changed"]


def test_the_table_holds_the_quota_per_gpu_type_and_a_start_logs_what_changed(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = start(path, (VISION, NLP))
    assert [(e["tenant"], e["was"]) for e in first] == [("nlp", None), ("vision", None)]
    store = Store(path)
    (nlp, vision) = store.tenants()
    store.close()
    assert vision == {
        "name": "vision",
        "guaranteed_gpus": 2,
        "cap_gpus": 8,
        "weight": 1.5,
        "guaranteed_gpus_by_type": {"p100": 2},
        "cap_gpus_by_type": {"v100": 4},
    }
    assert (nlp["cap_gpus"], nlp["cap_gpus_by_type"], nlp["guaranteed_gpus_by_type"]) == (None, {}, {})

    assert start(path, (VISION, NLP)) == []  # the same config: nothing changed, nothing logged

    tighter = TenantQuota("vision", 2, 8, 1.5, type_caps=(("v100", 2),), type_guarantees=(("p100", 2),))
    (removed, changed) = start(path, (tighter,))  # by name
    assert (changed["tenant"], changed["was"], changed["now"]) == (
        "vision",
        vision,
        {**vision, "cap_gpus_by_type": {"v100": 2}},
    )
    assert (removed["tenant"], removed["now"]) == ("nlp", None)
    store = Store(path)
    assert [r["name"] for r in store.tenants()] == ["vision"]
    store.close()


def test_an_older_stores_tenants_get_no_limits_per_type(tmp_path: Path) -> None:
    """Migration 6 adds the per-type columns; a tenant written before it reads back with none."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:5]:
        db.executescript(migration)
    db.execute("PRAGMA user_version = 5")
    db.execute("INSERT INTO tenants (name, guaranteed_gpus, cap_gpus, weight) VALUES ('vision', 2, 8, 1.5)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    (row,) = store.tenants()
    store.close()
    assert (row["cap_gpus"], row["guaranteed_gpus_by_type"], row["cap_gpus_by_type"]) == (8, {}, {})
