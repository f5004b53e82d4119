"""Group commit on the database thread: many callers' write functions in one transaction, each in
its own savepoint (`Database.write_in_thread` queues them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backend.core.errors import DatabaseIOError
from backend.store.connection import Conn

# At most this many write_in_thread calls share one commit: bounds how long one group
# holds SQLite's write lock (each turn-path transaction body takes ~0.2 ms).
WRITE_GROUP_MAX = 32


class TransactionDropped(DatabaseIOError):
    """SQLite rolled the whole transaction back under a group (full disk, I/O error)."""


def commit_group_sync(conn: Conn, fns: list[Callable[[Conn], Any]]) -> list[tuple[bool, Any]]:
    """On the connection's thread: run `fns` in one write transaction; (ok, result or exception) each.

    A lone function needs no savepoint: the transaction is its unit, and its
    exception rolls it back and propagates, as a plain transaction would.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        if len(fns) == 1:
            outcomes: list[tuple[bool, Any]] = [(True, fns[0](conn))]
        else:
            outcomes = [_in_savepoint_sync(conn, fn) for fn in fns]
        conn.execute("COMMIT")
        # PostgreSQL: members whose queued writes failed after they returned (rolled back alone)
        for member, exc in getattr(conn, "failed_members", {}).items():
            outcomes[member] = (False, exc)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return outcomes


def _in_savepoint_sync(conn: Conn, fn: Callable[[Conn], Any]) -> tuple[bool, Any]:
    conn.execute("SAVEPOINT rem_write")
    try:
        value = fn(conn)
        if not conn.in_transaction:
            raise TransactionDropped(
                "the write transaction ended inside a group; nothing of the group was written"
            )
        # on PostgreSQL the member's queued unread writes may go out with a later member's
        # statements: their error is still this member's own, rolled back to its savepoint
        # (`PgConnection.failed_members`), like one raised inside `fn`
        conn.execute("RELEASE rem_write")
    except Exception as exc:
        if not conn.in_transaction:  # SQLite rolled back the whole transaction (SQLITE_FULL, IOERR)
            raise
        conn.execute("ROLLBACK TO rem_write")
        conn.execute("RELEASE rem_write")
        return False, exc
    return True, value
