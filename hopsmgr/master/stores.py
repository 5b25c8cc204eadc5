"""Which store a location names: a postgresql:// URL opens PostgreSQL (hopsmgr.master.pgstore), anything
else the SQLite file at that path (hopsmgr.master.store). The one module that imports both backends: the
PostgreSQL store subclasses the SQLite one (pgstore imports store), so the choice between them lives
above both and store.py imports nothing of pgstore.
"""

from __future__ import annotations

import os

from hopsmgr.master.pgstore import PgStore
from hopsmgr.master.store import Store


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def open_store(location: str | os.PathLike[str]) -> Store:
    """The store at `location`: a postgresql:// URL (PostgreSQL, hopsmgr.master.pgstore) or a file path."""
    if isinstance(location, str) and is_postgres_url(location):
        return PgStore(location)
    return Store(location)
