"""The store's commit rules, whatever the backend: `transaction()` (nested blocks join the outer one, one
commit for all), `grouped()` (changes joining one group commit, each in a savepoint of its own),
`savepoint()` and `commit_group()`. `TransactionalStore` holds them on top of a few hooks that a backend
provides: hopsmgr.master.store's `Store` on SQLite, and hopsmgr.master.pgstore's `PgStore` on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


class TransactionalStore:
    """Transactions, group commits and savepoints over the backend's `_begin`, `_commit`, `_rollback`,
    `_in_transaction` and `_exec` hooks; the backend sets `_depth` to 0 and `_group_open` to False."""

    _depth: int  # how deep the open `transaction` / `grouped` blocks nest (0: none open)
    _group_open: bool  # whether a group commit is begun and not yet committed

    def _begin(self) -> None:
        """Begin a transaction (the backend's hook)."""
        raise NotImplementedError

    def _commit(self) -> None:
        """Commit the open transaction (the backend's hook)."""
        raise NotImplementedError

    def _rollback(self) -> None:
        """Roll the open transaction back, if the backend has not already (the backend's hook)."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        """Whether a transaction is open on the connection (the backend's hook)."""
        raise NotImplementedError

    def _exec(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        """Run one statement (the backend's hook)."""
        raise NotImplementedError

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One commit for everything inside (nested calls join the outer one). An open group commit
        (`grouped`) is committed first: whoever asks for a transaction acts on durable state."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.commit_group()
        self._begin()
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self._rollback()
            raise
        self._depth = 0
        self._commit()

    @contextmanager
    def grouped(self) -> Iterator[None]:
        """Changes that join the open group commit (one fsync for many callers): a savepoint inside it,
        rolled back alone if the block fails. Call `commit_group` before relying on durability."""
        if self._depth:
            with self.transaction():
                yield
            return
        if not self._group_open:
            self._begin()
            self._group_open = True
        self._exec("SAVEPOINT grouped")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            if self._in_transaction():
                self._exec("ROLLBACK TO SAVEPOINT grouped")
                self._exec("RELEASE SAVEPOINT grouped")
            else:  # the backend rolled the whole group back (disk full, I/O error, connection lost)
                self._group_open = False
            raise
        self._depth = 0
        self._exec("RELEASE SAVEPOINT grouped")

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction: a block rolled back alone if it fails (hopsmgr.master.writer: each
        write of a batch)."""
        assert self._depth, "a savepoint needs an open transaction"
        self._exec("SAVEPOINT one_write")
        try:
            yield
        except BaseException:
            if self._in_transaction():
                self._exec("ROLLBACK TO SAVEPOINT one_write")
                self._exec("RELEASE SAVEPOINT one_write")
            raise
        self._exec("RELEASE SAVEPOINT one_write")

    def commit_group(self) -> None:
        """Make the open group commit durable (no-op when none is open)."""
        if self._group_open:
            self._group_open = False
            self._commit()
