"""The state store: state.db on aiosqlite, or PostgreSQL (`--db URL`) behind the same `Database`.

Every connection runs with `isolation_level=None` (we issue BEGIN ourselves),
WAL, `synchronous=NORMAL`, a busy timeout, foreign keys and a journal size
limit. Every write transaction is `BEGIN IMMEDIATE`: a deferred transaction
that reads and then writes fails at once with SQLITE_BUSY under contention,
ignoring `busy_timeout`, because SQLite cannot upgrade its read snapshot.

Naming rule, the database thread made visible: a function whose name ends in
`_sync` runs on the connection's own thread with the raw connection (`Conn`, today an `sqlite3.Connection`)
as its first argument (`conn`), inside a transaction its caller opened; it
never awaits and never commits. Every function that takes a raw connection is
named so, and nothing else is. Async code reaches the thread through the
`*_in_thread` doors: `Database.read_in_thread(fn)` (one short read
transaction), `Database.write_in_thread(fn)` (one group-committed write
transaction), `Database.run_in_thread(fn)` (no transaction of its own) and
`in_thread(conn, fn)` (inside an open `db.tx()`). Everything else that touches
state.db is async and takes a `Database`, or inside `db.tx()` an
`aiosqlite.Connection`.

The parts, each a module of its own, all importable from here:

    connection    `Conn`, the raw connection a `_sync` function takes, and its engine
    database      `Database`, its transactions and its doors onto the database thread
    sqlite_file   state.db's PRAGMA values, its read-only URI, SQLite errors as RemErrors
    transaction   statements inside an open `db.tx()`, and `in_thread`
    group_commit  many callers' writes in one transaction (`Database.write_in_thread`)
    pipeline      writes nobody reads, fenced writes, readers in lockstep, reads known ahead
                  (PostgreSQL: one round trip)
"""

from __future__ import annotations

from backend.store.connection import Conn, Cursor, Params, Row, T, engine_of, skip_locked_sync
from backend.store.database import Database
from backend.store.group_commit import WRITE_GROUP_MAX, TransactionDropped, commit_group_sync
from backend.store.pipeline import (
    Query,
    ReadAhead,
    Reader,
    execute_unread,
    executemany_unread,
    fenced_write,
    independent_reads_sync,
    read_ahead_sync,
    read_together_sync,
)
from backend.store.sqlite_file import (
    BUSY_TIMEOUT_MS,
    FOREIGN_TABLES_SQL,
    FULL_BELOW_BYTES,
    JOURNAL_SIZE_LIMIT,
    refuse_foreign,
    sqlite_errors,
    sqlite_target,
    translate_sqlite_error,
)
from backend.store.transaction import (
    execute,
    executemany,
    fetchall,
    fetchone,
    in_thread,
    on_postgres,
    skip_locked,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "Conn",
    "Cursor",
    "Database",
    "FOREIGN_TABLES_SQL",
    "FULL_BELOW_BYTES",
    "JOURNAL_SIZE_LIMIT",
    "Params",
    "Query",
    "ReadAhead",
    "Reader",
    "Row",
    "T",
    "TransactionDropped",
    "WRITE_GROUP_MAX",
    "commit_group_sync",
    "engine_of",
    "execute",
    "execute_unread",
    "executemany",
    "executemany_unread",
    "fenced_write",
    "fetchall",
    "fetchone",
    "in_thread",
    "independent_reads_sync",
    "on_postgres",
    "read_ahead_sync",
    "read_together_sync",
    "refuse_foreign",
    "skip_locked",
    "skip_locked_sync",
    "sqlite_errors",
    "sqlite_target",
    "translate_sqlite_error",
]
