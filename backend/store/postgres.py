"""The PostgreSQL state store: a DB-API connection shaped like `sqlite3.Connection`, over psycopg 3.

rem's SQL is written once, in SQLite's dialect, and runs on both engines. The
few differences are translated (`backend.store.pg_dialect`), once per distinct statement (cached):

| SQLite (as written in rem)        | PostgreSQL (as sent)                              |
|-----------------------------------|---------------------------------------------------|
| `?`, `:name` placeholders         | `%s`, `%(name)s` (and a literal `%` doubled)      |
| `a IS b`, `a IS NOT b` (null-safe)| `a IS NOT DISTINCT FROM b`, `a IS DISTINCT FROM b`|
| `max(a, b)`, `min(a, b)` (scalar) | `GREATEST(a, b)`, `LEAST(a, b)`                   |
| `BEGIN IMMEDIATE` (a writer)      | `BEGIN ISOLATION LEVEL READ COMMITTED`            |
| `BEGIN` (rem's read snapshots)    | `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY` |
| `x GLOB 'a.*'` (literal pattern)  | `x LIKE 'a.%'`                                    |
| `CROSS JOIN t ON` (join order)    | `JOIN t ON`                                       |
| `INDEXED BY idx` (planner hint)   | nothing: PostgreSQL's planner chooses             |
| `:x IS NULL` (a bare parameter)   | `CAST(%(x)s AS text) IS NULL` (a type to infer)   |
| `FROM (SELECT ...)` with no alias | `FROM (SELECT ...) AS rem_sub1` (before 16, PostgreSQL requires one) |

and values: a Python `bool` is stored as 0/1 as SQLite stores it, `numeric`
results (`sum()` of integers) come back as `int` (or `float`), never
`Decimal`, and rows are read by column name or index like `sqlite3.Row`.
Functions SQLite has and PostgreSQL lacks (`json_extract`, `json_valid`) are
created by the schema (`backend.store.schema_pg`).

Why a synchronous connection: the executor's hot path runs plain functions on
the database thread (`Database.write_in_thread`, group commit) with a raw
connection; the same functions run here unchanged. aiosqlite's `Connection`
is the worker thread (its connector returns a `PgConnection`), so every
async door of `Database` (tx, snapshot, group commit) is the same code on
both engines.

Concurrency (why READ COMMITTED, not SERIALIZABLE): a write transaction may
not be re-run, because the `_sync` functions of the turn path move Python
state (`state.step`, `lease.expires_at`) after their SQL. So every write
that must not race is made safe by itself: claims and takeovers lock their
row (`FOR UPDATE SKIP LOCKED`) and bump the epoch conditioned on the epoch
they read; every fenced write is `UPDATE ... WHERE owner AND epoch` and
checks its row count (READ COMMITTED re-evaluates the predicate after
waiting for a rival's lock, so a committed takeover leaves 0 rows: `LeaseLost`).
On the turn path the check is the server's: the write is sent unread,
wrapped as `WITH w AS (... RETURNING 1) SELECT rem_fenced(count(*), msg)`,
and 0 rows fails the statement with `FENCE_SQLSTATE`, raised as
`LeaseLost(msg)` where it is sent (`backend.store.db.fenced_write(unread=True)`).
Reads that must see one state (`BEGIN`: status, check, the console) run
REPEATABLE READ READ ONLY, one snapshot, as SQLite's read transaction.

A connection that breaks (server restart, failover) is re-opened before the
next transaction, never inside one: a transaction that lost its connection
fails as a whole (`DatabaseUnreachable`, nothing of it written).

Every connection first checks the server's version (PostgreSQL 14 or newer), and
every psycopg error leaves as one line with its SQLSTATE and no password
(`backend.store.pg_errors`). Nothing here needs more than PostgreSQL 14: SQLite's
`FROM (subquery)` without an alias gets one (15 and older require it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
import psycopg.errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq import TransactionStatus
from psycopg.rows import RowMaker, tuple_row

from backend.core.errors import DatabaseUnreachable
from backend.core.settings import settings

# SQLite's dialect as PostgreSQL's (`translate_sql`, `alias_subqueries`): a module of its own, importable here
from backend.store.pg_dialect import alias_subqueries as alias_subqueries
from backend.store.pg_dialect import translate_sql as translate_sql

# the URL, version and error doors live in pg_errors; named here too, where callers import them
from backend.store.pg_errors import FENCE_SQLSTATE as FENCE_SQLSTATE
from backend.store.pg_errors import MIN_SERVER_VERSION as MIN_SERVER_VERSION
from backend.store.pg_errors import check_url as check_url
from backend.store.pg_errors import display_url as display_url
from backend.store.pg_errors import is_postgres_url as is_postgres_url
from backend.store.pg_errors import postgres_errors as postgres_errors
from backend.store.pg_errors import refuse_old_server as refuse_old_server
from backend.store.pg_errors import server_version_text as server_version_text
from backend.store.pg_errors import store_label as store_label
from backend.store.pg_errors import translate_postgres_error as translate_postgres_error

log = logging.getLogger("rem.postgres")


# -- rows and values -----------------------------------------------------------
class Row:
    """A result row read by column name or by index, like `sqlite3.Row`."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: Mapping[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def keys(self) -> list[str]:
        return list(self._index)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Row):
            return tuple(self._values) == tuple(other._values) and self._index == other._index
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._values))

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._index, self._values, strict=False))!r})"


def named_row(cursor: Any) -> RowMaker[Row]:
    """psycopg row factory: `Row`s sharing one name -> index map per result."""
    description = cursor.description or []
    index = {column.name: i for i, column in enumerate(description)}

    def make(values: Sequence[Any]) -> Row:
        return Row(values, index)

    return make


class BoolAsIntDumper(Dumper):
    """`True`/`False` as 1/0: rem's flag columns are integers, as SQLite stores booleans."""

    oid = psycopg.postgres.types["int8"].oid

    def dump(self, obj: bool) -> bytes:
        return b"1" if obj else b"0"


class NumericAsNumberLoader(Loader):
    """`numeric` (e.g. `sum()` of bigints) as int when whole, else float: no `Decimal` leaks into JSON."""

    def load(self, data: Buffer) -> int | float:
        text = bytes(data)
        if b"." in text or b"N" in text or b"e" in text.lower():
            return float(text)
        return int(text)


# -- the connection ----------------------------------------------------------
class PgCursor:
    """The part of `sqlite3.Cursor` rem (and aiosqlite) uses, over a psycopg cursor."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return None  # PostgreSQL has none: rem reads generated ids with RETURNING

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def row_factory(self) -> Any:
        return self._cursor.row_factory

    @row_factory.setter
    def row_factory(self, factory: Any) -> None:
        # sqlite3's None means plain tuples
        self._cursor.row_factory = tuple_row if factory is None else named_row

    def fetchone(self) -> Any:
        return self._cursor.fetchone() if self._cursor.description is not None else None

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def fetchmany(self, size: int | None = None) -> list[Any]:
        if self._cursor.description is None:
            return []
        return self._cursor.fetchmany(size or self._cursor.arraysize)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        self._cursor.close()


class _Queued(NamedTuple):
    """A statement queued to ride with the next one sent (`PgConnection.execute_unread`)."""

    statement: str
    parameters: Any
    write: bool  # a write nobody reads (not BEGIN / SAVEPOINT / RELEASE)
    member: int  # the transaction's group member that queued it (-1: outside any)


_WRITES = ("INSERT", "UPDATE", "DELETE")


def _count_changes(statement: str, cursor: psycopg.Cursor[Any]) -> int:
    """The rows a statement wrote, as sqlite3's `total_changes` counts them (0 for any other)."""
    return (
        cursor.rowcount if statement.lstrip()[:6].upper().startswith(_WRITES) and cursor.rowcount > 0 else 0
    )


# statements that answer nothing rem reads: sent with the next statement, in one round trip
_DEFERRABLE = ("BEGIN", "SAVEPOINT", "RELEASE")


class PgConnection:
    """A psycopg connection that takes rem's SQLite-dialect SQL and answers like `Conn`.

    Autocommit at the protocol level, like `isolation_level=None` in sqlite3:
    rem issues BEGIN / COMMIT itself.

    Round trips: `BEGIN`, `SAVEPOINT` and `RELEASE` answer nothing rem reads, so
    they are queued and sent ahead of the next statement in one pipeline (one
    round trip for all of them); so is a write passed to `execute_unread` (its
    row count and rows go unread). Fenced writes are sent unread too
    (`fenced_write(unread=True)`): the server fails one that changed no row.
    A group of turn transactions (`commit_group_sync`) thus costs a round trip
    per statement that is read, plus the COMMIT.

    A queued write's error is its own group member's, wherever it surfaces.
    Each `SAVEPOINT rem_write` opens the transaction's next member (counted
    from 0), and a member's queued statements may go out with a later
    member's read or with the COMMIT. When a pipeline fails inside an earlier
    member's statements (the last statement of each closed member's queue is
    sent on a cursor of its own, so the first of them without a result
    names it), that member is rolled back to its savepoint and recorded in
    `failed_members`; the statements queued after it, which the server
    skipped, are sent again, then the statement that sent them. The member
    reading or committing never sees the error. `commit_group_sync` reports
    the recorded members as failed.
    """

    engine = "postgresql"

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only
        self.row_factory: Any = None  # set by aiosqlite; rows are always `Row`s here
        self.total_changes = 0  # rows written by INSERT / UPDATE / DELETE, as sqlite3 counts them
        self._in_tx = False
        self._queued: list[_Queued] = []  # not yet sent
        self._member = -1  # the transaction's newest group member (one per `SAVEPOINT rem_write`)
        self._member_open = False  # whether its savepoint is still open
        self.failed_members: dict[int, Exception] = {}  # member -> the error of a statement it queued
        self._deallocate_at_end = False  # `_forget_prepared`
        self._raw = self._connect()

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """The psycopg connection, with every queued statement sent (for DDL sent as written)."""
        self._flush()
        return self._raw

    def _connect(self) -> psycopg.Connection[Any]:
        check_url(self.url)  # REM_DB_URL comes this way without `--db`'s check
        with postgres_errors(self.url):
            raw = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(2, settings.busy_timeout_ms // 1000),
                options=session_options(read_only=self.read_only),
                application_name="rem",
            )
        try:
            refuse_old_server(raw.info.server_version, self.url)
        except BaseException:
            raw.close()
            raise
        raw.adapters.register_dumper(bool, BoolAsIntDumper)
        raw.adapters.register_loader("numeric", NumericAsNumberLoader)
        return raw

    def _live(self) -> psycopg.Connection[Any]:
        if self._raw.closed or self._raw.broken:
            if self._in_tx:
                self._drop_queue()
                raise DatabaseUnreachable(
                    f"the connection to {display_url(self.url)} broke inside a transaction; "
                    "nothing of it was written; retry"
                )
            log.warning("reconnecting to %s", display_url(self.url))
            self._raw = self._connect()
        return self._raw

    def execute(self, sql: str, parameters: Any = ()) -> PgCursor:
        statement = translate_sql(sql)
        head = statement[:9].upper()
        if head.startswith(("COMMIT", "ROLLBACK")) and " TO " not in statement.upper():
            return self._end(statement)
        if head.startswith(_DEFERRABLE) and not parameters:
            if head.startswith("BEGIN"):
                self._live()  # a broken connection is replaced before a transaction, never inside one
                self._in_tx = True
                self._member, self._member_open, self.failed_members = -1, False, {}
            elif head.startswith("SAVEPOINT"):
                self._member, self._member_open = self._member + 1, True
            elif head.startswith("RELEASE"):
                self._member_open = False
            self._queued.append(_Queued(statement, None, False, self._member))
            return _NO_RESULT
        if head.startswith("ROLLBACK"):  # ROLLBACK TO: the open member's queued writes need no sending
            member = self._member
            self._queued = [entry for entry in self._queued if not (entry.write and entry.member == member)]
        cursor = self._send(lambda cur: cur.execute(statement, parameters if parameters is not None else ()))
        self.total_changes += _count_changes(statement, cursor)
        return PgCursor(cursor)

    def execute_unread(self, sql: str, parameters: Any = ()) -> None:
        """A write whose row count and rows nobody reads: queued, sent with the next statement."""
        self._queued.append(_Queued(translate_sql(sql), parameters, True, self._member))

    def _send(self, run: Any, *, pipeline: bool = False) -> psycopg.Cursor[Any]:
        """`run(cursor)` after every queued statement, all in one round trip (`pipeline`: even
        when nothing is queued, for a `run` that sends several statements)."""
        cursor = self._live().cursor(row_factory=named_row)
        if not (self._queued or pipeline):
            run(cursor)
            return cursor
        while True:
            queued, self._queued = self._queued, []
            closed = self._member - self._member_open  # members up to this one have been released
            # each closed member's last queued statement (its RELEASE) -> (member, a cursor of its own)
            ends = {
                i: (entry.member, self._raw.cursor())
                for i, entry in enumerate(queued)
                if 0 <= entry.member <= closed
                and (i + 1 == len(queued) or queued[i + 1].member != entry.member)
            }
            try:
                with self._raw.pipeline():
                    for i, entry in enumerate(queued):
                        (ends[i][1] if i in ends else cursor).execute(entry.statement, entry.parameters)
                    cursor = self._raw.cursor(row_factory=named_row)
                    run(cursor)
            except psycopg.Error as exc:
                self._forget_prepared()
                self._deallocate_at_end = True
                # results come in order (psycopg may raise before the pipeline has all been sent):
                # the first closed member whose last statement has none holds the failed one
                failed = next((m for m, end in ends.values() if end.pgresult is None), None)
                if failed is None or self._raw.broken:
                    raise  # the statement's own, or its member's (or the connection's)
                self.total_changes += sum(entry.write for entry in queued if entry.member < failed)
                self._fail_member(failed, exc, [entry for entry in queued if entry.member > failed])
                continue
            self.total_changes += sum(entry.write for entry in queued)  # each queued write counts as one
            return cursor

    def _fail_member(self, member: int, exc: Exception, skipped: list[_Queued]) -> None:
        """A closed group member's queued statement failed: roll the member back, queue what the
        server skipped after it (the later members' statements) to be sent again."""
        with self._raw.cursor() as cursor:
            cursor.execute("ROLLBACK TO rem_write", prepare=False)  # its savepoint: the later ones never ran
            cursor.execute("RELEASE rem_write", prepare=False)
        self.failed_members[member] = exc
        self._queued = skipped + self._queued

    def _forget_prepared(self) -> None:
        """After a failed pipeline: forget which statements psycopg prepared on the server.

        psycopg (3.3) records a statement as prepared when it queues the
        statement's Parse, and never learns that the server skipped it after an
        earlier error in the same pipeline; every later use would then fail with
        `prepared statement "_pg3_N" does not exist`. So its cache is emptied
        (psycopg has no public call for it: `Connection._prepared`); `_end`
        deallocates the server's copies once the transaction has ended (not
        before: a failed transaction refuses every statement but its end).
        """
        cache = self._raw._prepared
        cache._names.clear()
        cache._counts.clear()

    def fetchall_batch(self, queries: Sequence[tuple[str, Any]]) -> list[list[Row]]:
        """Every query's rows, the queries sent together in one round trip (`db.read_together_sync`);
        a query may be a write whose rows are read (`... RETURNING`)."""
        cursors: list[psycopg.Cursor[Any]] = []

        def run(first: psycopg.Cursor[Any]) -> None:
            cursors.clear()  # a run sent again (an earlier member's write failed) starts over
            for sql, parameters in queries:
                cursor = first if not cursors else self._raw.cursor(row_factory=named_row)
                cursor.execute(translate_sql(sql), parameters if parameters is not None else ())
                cursors.append(cursor)

        self._send(run, pipeline=True)
        # a write whose rows are read (RETURNING) counts as a sent one does
        self.total_changes += sum(
            _count_changes(sql, c) for (sql, _), c in zip(queries, cursors, strict=True)
        )
        return [cursor.fetchall() for cursor in cursors]

    def _flush(self) -> None:
        if self._queued:
            self._send(lambda cur: None)

    def _writes_queued(self) -> bool:
        return any(entry.write for entry in self._queued)

    def _drop_queue(self) -> None:
        self._queued = []

    def _end(self, statement: str) -> PgCursor:
        try:
            return self._end_tx(statement)
        finally:
            if self._deallocate_at_end and not (self._raw.closed or self._raw.broken):
                self._deallocate_at_end = False
                self._forget_prepared()  # what was prepared since goes too, with the rest
                with contextlib.suppress(psycopg.Error), self._raw.cursor() as cursor:
                    cursor.execute("DEALLOCATE ALL", prepare=False)  # failing, it leaves names unused

    def _end_tx(self, statement: str) -> PgCursor:
        was_in_tx, self._in_tx = self._in_tx, False
        rollback = statement.upper().startswith("ROLLBACK")
        if (
            self._queued
            and self._queued[0].statement.upper().startswith("BEGIN")
            and (rollback or not self._writes_queued())
        ):
            self._drop_queue()  # nothing of the transaction reached the server: nothing to end
            return _NO_RESULT
        if (self._raw.closed or self._raw.broken) and rollback:
            self._drop_queue()
            return _NO_RESULT  # the server already dropped the transaction
        if not was_in_tx and not self._queued and self._raw.info.transaction_status == TransactionStatus.IDLE:
            return _NO_RESULT
        if rollback:
            self._drop_queue()  # a RELEASE or a queued write of a transaction being rolled back
        return PgCursor(self._send(lambda cur: cur.execute(statement)))

    def executemany(self, sql: str, seq_of_parameters: Any) -> PgCursor:
        statement = translate_sql(sql)
        rows = list(seq_of_parameters)
        cursor = self._send(lambda cur: cur.executemany(statement, rows))
        self.total_changes += _count_changes(statement, cursor)
        return PgCursor(cursor)

    def cursor(self) -> PgCursor:
        return PgCursor(self._live().cursor(row_factory=named_row))

    @property
    def backend_pid(self) -> int:
        """The server process serving this connection (0 while it is broken); safe from any thread."""
        return 0 if self._raw.closed or self._raw.broken else int(self._raw.info.backend_pid)

    @property
    def in_transaction(self) -> bool:
        if self._raw.closed or self._raw.broken:
            return self._in_tx
        return self._in_tx or self._raw.info.transaction_status != TransactionStatus.IDLE

    def commit(self) -> None:
        if self.in_transaction:
            self.execute("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            self.execute("ROLLBACK")

    def close(self) -> None:
        self._drop_queue()
        self._raw.close()


class _NoResult(PgCursor):
    """The cursor of a statement that returned nothing (queued, or not needed): no rows, no count."""

    def __init__(self) -> None:  # no psycopg cursor behind it
        pass

    @property
    def rowcount(self) -> int:
        return -1

    @property
    def description(self) -> Any:
        return None

    def fetchone(self) -> Any:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def fetchmany(self, size: int | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        return None


_NO_RESULT: PgCursor = _NoResult()


def session_options(*, read_only: bool) -> str:
    """Server settings for every rem connection (libpq `options`)."""
    busy = settings.busy_timeout_ms
    options = {
        # no write transaction waits on a row lock longer than SQLite's busy timeout would
        "lock_timeout": f"{busy}ms",
        # a stopped (SIGSTOP) or vanished client cannot hold row locks for ever
        "idle_in_transaction_session_timeout": f"{max(busy, 5_000)}ms",
    }
    if read_only:
        options["default_transaction_read_only"] = "on"
    return " ".join(f"-c {key}={value}" for key, value in options.items())
