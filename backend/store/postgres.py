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

import functools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
import psycopg.errors
from psycopg import adapt
from psycopg.adapt import Buffer, Dumper, Loader, PyFormat
from psycopg.pq import TransactionStatus
from psycopg.types.numeric import Int8Dumper

from backend.core.errors import ConnectionsExhausted, DatabaseUnreachable
from backend.core.settings import settings
from backend.store import pg_batch
from backend.store.pg_batch import Result, Row, no_result

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


# -- values ----------------------------------------------------------------------
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
# the result of a statement not sent (queued, or not needed), or of one whose rows nobody has
PgCursor = Result


class _Queued(NamedTuple):
    """A statement queued to ride with the next one sent (`PgConnection.execute_unread`)."""

    query: bytes
    values: Sequence[Any]
    write: bool  # a write nobody reads (not BEGIN / SAVEPOINT / RELEASE)
    member: int  # the transaction's group member that queued it (-1: outside any)


# statements that answer nothing rem reads: sent with the next statement, in one round trip
_DEFERRABLE = (b"BEGIN", b"SAVEPOINT", b"RELEASE")
# statements never prepared (transaction control: cheap to parse, and one of each per transaction)
_UNPREPARED = (b"BEGIN", b"SAVEPOINT", b"RELEASE", b"COMMIT", b"ROLLBACK", b"SELECT set_config")
# at most this many statements prepared on one connection (then all are deallocated and it starts over)
PREPARED_MAX = 1000

# connection failures that mean "the server has no free connection": waited out, not failed at once
_EXHAUSTED = (
    "too many clients already",
    "remaining connection slots are reserved",
    "no more connections allowed",
)


class PgConnection:
    """A psycopg connection that takes rem's SQLite-dialect SQL and answers like `Conn`.

    Autocommit at the protocol level, like `isolation_level=None` in sqlite3:
    rem issues BEGIN / COMMIT itself. Statements go out in batches through
    libpq's pipeline mode, each prepared once on this connection
    (`backend.store.pg_batch`), or unnamed when `prepare` is off (behind a
    transaction-mode pooler). No setting is sent at connect (a pooler refuses
    startup options): the timeouts are set in each transaction
    (`set_config(..., true)`, what `SET LOCAL` does), right after its BEGIN,
    in the same round trip, or first in a batch sent outside one.

    Round trips: `BEGIN`, `SAVEPOINT` and `RELEASE` answer nothing rem reads, so
    they are queued and sent ahead of the next statement in one batch (one
    round trip for all of them); so is a write passed to `execute_unread` (its
    row count and rows go unread). Fenced writes are sent unread too
    (`fenced_write(unread=True)`): the server fails one that changed no row.
    A group of turn transactions (`commit_group_sync`) thus costs a round trip
    per statement that is read, plus the COMMIT.

    A queued write's error is its own group member's, wherever it surfaces.
    Each `SAVEPOINT rem_write` opens the transaction's next member (counted
    from 0), and a member's queued statements may go out with a later
    member's read or with the COMMIT. The server skips a batch's statements
    after its first error, so the failed statement, and its member, are known
    by position. When it is an earlier, closed member's, that member is
    rolled back to its savepoint and recorded in `failed_members`; the
    statements queued after it, which the server skipped, are sent again,
    then the statement that sent them. The member reading or committing never
    sees the error. `commit_group_sync` reports the recorded members as failed.
    """

    engine = "postgresql"

    def __init__(
        self, url: str, *, read_only: bool = False, wait: bool = True, prepare: bool | None = None
    ) -> None:
        self.url = url
        self.read_only = read_only
        self.wait = wait  # for a free connection on a full server (`connect_waiting`)
        self.prepare = (not settings.db_pooled) if prepare is None else prepare
        self.row_factory: Any = None  # set by aiosqlite; rows are always `Row`s here
        self.total_changes = 0  # rows written by INSERT / UPDATE / DELETE, as sqlite3 counts them
        self.round_trips = 0  # batches sent (each one round trip to the server)
        self._in_tx = False
        self._queued: list[_Queued] = []  # not yet sent
        self._member = -1  # the transaction's newest group member (one per `SAVEPOINT rem_write`)
        self._member_open = False  # whether its savepoint is still open
        self.failed_members: dict[int, Exception] = {}  # member -> the error of a statement it queued
        # the timeouts: set once for the session on a direct connection; behind a pooler, whose server
        # sessions other clients share, in each transaction (after BEGIN, or first in a batch outside
        # one). Read-only-ness always per transaction: through a pooler a session setting would reach
        # another client's writes
        self._in_each_tx = None if self.prepare else settings_statement(read_only=False, local=True)
        self._batch_prefix = (
            None
            if self.prepare and not read_only
            else settings_statement(read_only=read_only, local=True, timeouts=not self.prepare)
        )
        self._raw = self._connect()

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """The psycopg connection, with every queued statement sent (for DDL sent as written)."""
        self._flush()
        return self._raw

    def _connect(self) -> psycopg.Connection[Any]:
        check_url(self.url)  # REM_DB_URL comes this way without `--db`'s check
        raw = connect_waiting(self.url, wait=self.wait)
        try:
            refuse_old_server(raw.info.server_version, self.url)
        except BaseException:
            raw.close()
            raise
        raw.prepare_threshold = None  # psycopg's own cursors (DDL through `raw`) prepare nothing
        raw.adapters.register_dumper(bool, BoolAsIntDumper)
        raw.adapters.register_dumper(int, Int8Dumper)  # one type for every int: one prepared variant
        raw.adapters.register_loader("numeric", NumericAsNumberLoader)
        if self.prepare:  # not behind a pooler: the session is this connection's alone
            with postgres_errors(self.url):
                raw.execute(settings_statement(read_only=False, local=False))
        self._loader = adapt.Transformer(raw)
        self._dumper = adapt.Transformer(raw)
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}  # (query, types) -> name
        # names no other connection uses: through a pooler without REM_DB_POOLED, a statement lands on
        # another client's server session as "does not exist" (one line naming the fix), never as a clash
        self._token = os.urandom(4).hex().encode()
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

    def execute(self, sql: str, parameters: Any = ()) -> Result:
        shape = pg_batch.template(sql)
        values = pg_batch.values_of(shape, parameters)
        query = shape.query
        head = query[:9].upper()
        if head.startswith((b"COMMIT", b"ROLLBACK")) and b" TO " not in query.upper():
            return self._end(query)
        if not values and head.startswith(_DEFERRABLE):
            self._defer(query, head)
            return no_result()
        if head.startswith(b"ROLLBACK"):  # ROLLBACK TO: the open member's queued writes need no sending
            member = self._member
            self._queued = [entry for entry in self._queued if not (entry.write and entry.member == member)]
        [result] = self._send([(query, values)])
        if shape.write and result.rowcount > 0:
            self.total_changes += result.rowcount
        return result

    def _defer(self, query: bytes, head: bytes) -> None:
        """Queue a BEGIN, SAVEPOINT or RELEASE (a BEGIN with the transaction's timeouts)."""
        if head.startswith(b"BEGIN"):
            self._live()  # a broken connection is replaced before a transaction, never inside one
            self._in_tx = True
            self._member, self._member_open, self.failed_members = -1, False, {}
            if self.read_only and b"READ ONLY" not in query.upper():
                query += b" READ ONLY"
            self._queued.append(_Queued(query, (), False, -1))
            if self._in_each_tx is not None:
                self._queued.append(_Queued(self._in_each_tx, (), False, -1))
            return
        if head.startswith(b"SAVEPOINT"):
            self._member, self._member_open = self._member + 1, True
        else:
            self._member_open = False
        self._queued.append(_Queued(query, (), False, self._member))

    def execute_unread(self, sql: str, parameters: Any = ()) -> None:
        """A write whose row count and rows nobody reads: queued, sent with the next statement."""
        shape = pg_batch.template(sql)
        self._queued.append(_Queued(shape.query, pg_batch.values_of(shape, parameters), True, self._member))

    def _send(self, tail: list[tuple[bytes, Sequence[Any]]]) -> list[Result]:
        """Every queued statement, then `tail`, in one round trip; the tail's results."""
        raw = self._live()
        while True:
            queued, self._queued = self._queued, []
            # a batch outside BEGIN (an implicit transaction) behind a pooler: its settings first
            first: list[tuple[bytes, Sequence[Any]]] = (
                [] if self._in_tx or not self._batch_prefix else [(self._batch_prefix, ())]
            )
            wrapped = len(first)
            statements = first + [(e.query, e.values) for e in queued] + tail
            try:
                results = self._round_trip(raw, statements)
            except psycopg.Error:
                self._drop_queue()
                raise
            at = pg_batch.failed_at(results)
            if at is None:
                if queued:  # each queued write counts as one
                    self.total_changes += sum([entry.write for entry in queued])
                load, loader = pg_batch.load, self._loader
                return [load(answer[-1], loader) for answer in results[wrapped + len(queued) :]]
            exc = pg_batch.error_of(results[at][-1], raw.info.encoding)
            at -= wrapped
            closed = self._member - self._member_open  # members up to this one have been released
            failed = queued[at].member if 0 <= at < len(queued) else -1
            if not 0 <= failed <= closed or raw.broken:
                raise exc  # the statement's own, or its member's (or the connection's)
            self.total_changes += sum(entry.write for entry in queued if entry.member < failed)
            self._fail_member(failed, exc, [entry for entry in queued if entry.member > failed])

    def _round_trip(
        self, raw: psycopg.Connection[Any], statements: Sequence[tuple[bytes, Sequence[Any]]]
    ) -> list[list[Any]]:
        """`statements` in one pipeline (each prepared the first time this connection sends it);
        each statement's results, in order (a statement skipped after an error: "aborted")."""
        pgconn, dump = raw.pgconn, self._dumper.dump_sequence
        commands: list[tuple[Any, ...]] = []
        at: list[int] = []  # each statement's command
        preparing: dict[tuple[bytes, tuple[int, ...]], tuple[bytes, int]] = {}
        for query, values in statements:
            dumped = dump(values, _text_formats(len(values))) if values else None
            key: tuple[bytes, tuple[int, ...]] = (query, tuple(self._dumper.types or ()) if values else ())
            name = self._prepared.get(key) or (preparing[key][0] if key in preparing else None)
            if name is None and self.prepare and not query.startswith(_UNPREPARED):
                name = b"rem_%b_%d" % (self._token, len(self._prepared) + len(preparing))
                commands.append((pgconn.send_prepare, name, query, key[1] or None))
                preparing[key] = (name, len(commands) - 1)
            if name is None:
                commands.append((pgconn.send_query_params, query, dumped, key[1] or None))
            else:
                commands.append((pgconn.send_query_prepared, name, dumped))
            at.append(len(commands) - 1)
        if len(self._prepared) + len(preparing) > PREPARED_MAX:
            self._deallocate_all(raw)
            return self._round_trip(raw, statements)
        self.round_trips += 1
        answers: list[list[Any]] = raw.wait(pg_batch.pipeline(pgconn, commands))
        failed_prepare = {}
        for key, (name, command) in preparing.items():
            # a Parse the server skipped (after an earlier error) prepared nothing: not kept
            if answers[command] and answers[command][-1].status == pg_batch.COMMAND_OK:
                self._prepared[key] = name
            else:
                failed_prepare[command + 1] = answers[command]  # the statement it was for: its answer
        return [failed_prepare.get(i) or answers[i] for i in at]

    def _deallocate_all(self, raw: psycopg.Connection[Any]) -> None:
        """Forget every statement prepared here (past PREPARED_MAX: rem's SQL shapes are few, so only
        statements built with a varying shape get this far)."""
        command = (raw.pgconn.send_query_params, b"DEALLOCATE ALL", None)
        raw.wait(pg_batch.pipeline(raw.pgconn, [command]))
        self._prepared.clear()

    def _fail_member(self, member: int, exc: Exception, skipped: list[_Queued]) -> None:
        """A closed group member's queued statement failed: roll the member back, queue what the
        server skipped after it (the later members' statements) to be sent again."""
        # its savepoint (the later ones never ran), then gone: the transaction goes on without it
        results = self._round_trip(self._raw, [(b"ROLLBACK TO rem_write", ()), (b"RELEASE rem_write", ())])
        at = pg_batch.failed_at(results)
        if at is not None:
            raise pg_batch.error_of(results[at][-1], self._raw.info.encoding)
        self.failed_members[member] = exc
        self._queued = skipped + self._queued

    def fetchall_batch(self, queries: Sequence[tuple[str, Any]]) -> list[list[Row]]:
        """Every query's rows, the queries sent together in one round trip (`db.read_together_sync`);
        a query may be a write whose rows are read (`... RETURNING`)."""
        return [result.rows for result in self.execute_batch(queries)]

    def execute_batch(self, queries: Sequence[tuple[str, Any]]) -> list[Result]:
        """Every query's result (rows, columns, row count), the queries sent together in one round trip
        (`db.read_ahead_sync`, `fetchall_batch`)."""
        shapes = [pg_batch.template(sql) for sql, _ in queries]
        tail = [
            (shape.query, pg_batch.values_of(shape, p)) for shape, (_, p) in zip(shapes, queries, strict=True)
        ]
        results = self._send(tail)
        # a write whose rows are read (RETURNING) counts as a sent one does
        self.total_changes += sum(
            r.rowcount for shape, r in zip(shapes, results, strict=True) if shape.write and r.rowcount > 0
        )
        return results

    def _flush(self) -> None:
        if self._queued:
            self._send([])

    def _writes_queued(self) -> bool:
        return any(entry.write for entry in self._queued)

    def _drop_queue(self) -> None:
        self._queued = []

    def _end(self, query: bytes) -> Result:
        was_in_tx, self._in_tx = self._in_tx, False
        rollback = query.upper().startswith(b"ROLLBACK")
        if (
            self._queued
            and self._queued[0].query.upper().startswith(b"BEGIN")
            and (rollback or not self._writes_queued())
        ):
            self._drop_queue()  # nothing of the transaction reached the server: nothing to end
            return no_result()
        if (self._raw.closed or self._raw.broken) and rollback:
            self._drop_queue()
            return no_result()  # the server already dropped the transaction
        if not was_in_tx and not self._queued and self._raw.info.transaction_status == TransactionStatus.IDLE:
            return no_result()
        if rollback:
            self._drop_queue()  # a RELEASE or a queued write of a transaction being rolled back
        self._in_tx = True  # the queued statements belong to the transaction being ended (no implicit one)
        try:
            [result] = self._send([(query, ())])
        finally:
            self._in_tx = False
        return result

    def executemany(self, sql: str, seq_of_parameters: Any) -> Result:
        shape = pg_batch.template(sql)
        tail = [(shape.query, pg_batch.values_of(shape, row)) for row in seq_of_parameters]
        if not tail:
            return Result([], 0, None)
        count = sum(max(result.rowcount, 0) for result in self._send(tail))
        if shape.write:
            self.total_changes += count
        return Result([], count, None)

    def cursor(self) -> _Cursor:
        return _Cursor(self)

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


@functools.lru_cache(maxsize=64)
def _text_formats(count: int) -> list[PyFormat]:
    """Every parameter dumped as text (the server parses it by the statement's parameter types)."""
    return [PyFormat.TEXT] * count


class _Cursor:
    """`connection.cursor()`: statements run on the connection, the last one's result read here."""

    def __init__(self, conn: PgConnection) -> None:
        self._conn = conn
        self._result = no_result()

    def execute(self, sql: str, parameters: Any = ()) -> _Cursor:
        self._result = self._conn.execute(sql, parameters)
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


def settings_statement(*, read_only: bool, local: bool, timeouts: bool = True) -> bytes:
    """The settings every rem statement runs with: for the session (`local=False`, once a direct
    connection opens), or for the transaction only (what `SET LOCAL` does: behind a pooler, right
    after each BEGIN and first in a batch sent outside one, an implicit transaction)."""
    busy = settings.busy_timeout_ms
    options = {
        # no write transaction waits on a row lock longer than SQLite's busy timeout would
        "lock_timeout": f"{busy}ms",
        # a stopped (SIGSTOP) or vanished client cannot hold row locks for ever
        "idle_in_transaction_session_timeout": f"{max(busy, 5_000)}ms",
    }
    if not timeouts:
        options.clear()
    if read_only:
        options["transaction_read_only"] = "on"
    scope = "true" if local else "false"
    calls = ", ".join(f"set_config('{key}', '{value}', {scope})" for key, value in options.items())
    return f"SELECT {calls}".encode()


def connect_waiting(url: str, *, wait: bool = True) -> psycopg.Connection[Any]:
    """A new autocommit connection; a server with no free connection (max_connections reached) is
    waited out, with one log line, for up to REM_DB_CONNECT_WAIT_MS, then refused in one line
    (`wait=False`: at once, for a connection the process can do without)."""
    deadline = time.monotonic() + (settings.db_connect_wait_ms / 1000 if wait else 0)
    delay, warned = 0.1, False
    while True:
        try:
            return psycopg.connect(
                url,
                autocommit=True,
                connect_timeout=max(2, settings.busy_timeout_ms // 1000),
                application_name="rem",
            )
        except psycopg.OperationalError as exc:
            if not is_exhausted(exc):
                raise translate_postgres_error(exc, url) from None
            if time.monotonic() + delay > deadline:
                raise ConnectionsExhausted(exhausted_message(url, waited=True)) from None
        except psycopg.Error as exc:
            raise translate_postgres_error(exc, url) from None
        if not warned:
            log.warning("%s", exhausted_message(url, waited=False))
            warned = True
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def is_exhausted(exc: BaseException) -> bool:
    """Whether a failed connect means the server (or the pooler) has no free connection."""
    text = str(exc)
    return getattr(exc, "sqlstate", None) == "53300" or any(marker in text for marker in _EXHAUSTED)


def exhausted_message(url: str, *, waited: bool) -> str:
    """The one line for a server with no free connection (the log's while waiting; the error's after)."""
    where = display_url(url)
    if not waited:
        return (
            f"{where} has no free connection (max_connections reached, SQLSTATE 53300); "
            f"waiting up to {settings.db_connect_wait_ms / 1000:g} s for one (REM_DB_CONNECT_WAIT_MS)"
        )
    return (
        f"{where} had no free connection for {settings.db_connect_wait_ms / 1000:g} s (max_connections "
        "reached, SQLSTATE 53300); nothing was written; retry, raise the server's max_connections, or lower "
        "REM_DB_MAX_CONNECTIONS on the fleet's hosts"
    )
