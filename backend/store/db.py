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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import aiosqlite

from backend.core import private
from backend.core.errors import (
    DatabaseCorrupt,
    DatabaseFull,
    DatabaseIOError,
    DatabaseLocked,
    DataDirError,
    LeaseLost,
    ReadOnly,
    RemError,
)
from backend.core.settings import settings

log = logging.getLogger("rem.db")

# >= 5 s per the contract; tests of lock contention shorten it through the environment
BUSY_TIMEOUT_MS = settings.busy_timeout_ms
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024

Params = Sequence[Any] | dict[str, Any]
T = TypeVar("T")
# a result row, read by column name (`sqlite3.Row` today; the PostgreSQL store's row type later)
Row = Any


class Cursor(Protocol):
    """What rem reads from a cursor, on any engine behind `Database`."""

    row_factory: Any

    @property
    def rowcount(self) -> int: ...
    @property
    def lastrowid(self) -> int | None: ...
    @property
    def description(self) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """The raw connection a `_sync` function takes: the DB-API subset rem uses.

    `sqlite3.Connection` is one; the PostgreSQL store provides a
    psycopg adapter of the same shape, so `_sync` functions run unchanged.
    """

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Any, /) -> Cursor: ...
    @property
    def in_transaction(self) -> bool: ...


def engine_of(conn: Conn) -> str:
    """`sqlite` or `postgresql`: for the few store-layer statements that have no common form."""
    return str(getattr(conn, "engine", "sqlite"))


def skip_locked_sync(conn: Conn) -> str:
    """The clause a claim or takeover appends to the read of the row it is about to take.

    PostgreSQL (READ COMMITTED, many writers): ` FOR UPDATE SKIP LOCKED`, so
    the row stays locked until the taker commits and a rival skips it (reads
    nothing: not claimed) instead of waiting and then acting on a stale read.
    SQLite: nothing; `BEGIN IMMEDIATE` already made this the only writer.
    """
    return " FOR UPDATE SKIP LOCKED" if engine_of(conn) == "postgresql" else ""


def translate_sqlite_error(exc: sqlite3.Error, path: Path | str) -> RemError | None:
    """Map an sqlite3 error to the one-line RemError an operator can act on."""
    msg = str(exc).lower()
    if "locked" in msg or "busy" in msg:
        return DatabaseLocked(
            f"{path} stayed locked by another writer for more than "
            f"{BUSY_TIMEOUT_MS / 1000:g} s; retry, or find the holder with `fuser {path}`"
        )
    if "disk is full" in msg or "database or disk is full" in msg:
        return DatabaseFull(f"no space left for {path}; free disk space, then retry")
    if "disk i/o error" in msg:
        return _io_error(exc, path)
    if "not a database" in msg or "malformed" in msg:
        return DatabaseCorrupt(
            f"{path} is not a readable rem database ({exc}); restore it from a backup "
            "or move it aside and run `rem init`"
        )
    if "unable to open" in msg:
        return DataDirError(f"cannot open {path}: {exc}; check --data and its permissions")
    if "readonly" in msg or "read-only" in msg or "attempt to write" in msg:
        return ReadOnly(f"{path} is opened read-only; this action needs a writable rem")
    return None


@contextmanager
def sqlite_errors(path: Path | str) -> Iterator[None]:
    """Raise an sqlite3 error from inside as the one-line RemError for `path` (others unchanged)."""
    try:
        yield
    except sqlite3.Error as exc:
        translated = translate_sqlite_error(exc, path)
        if translated is None:
            raise
        raise translated from exc


# below this much free space, a disk I/O error is a full disk (SQLite reports a
# -shm or -wal file it could not grow as SQLITE_IOERR_*, not SQLITE_FULL)
FULL_BELOW_BYTES = 1024 * 1024


def _io_error(exc: sqlite3.Error, path: Path | str) -> RemError:
    """A disk I/O error: a full disk when the filesystem is (nearly) full, never "corrupt"."""
    name = getattr(exc, "sqlite_errorname", "SQLITE_IOERR")
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        return DatabaseFull(
            f"no space left for {path} ({free} bytes free, {name}); free disk space, then retry"
        )
    return DatabaseIOError(
        f"disk I/O error on {path} ({name}); check the disk (`df`, `dmesg`) "
        "and retry; if it persists, restore state.db from a backup"
    )


# what an unversioned (user_version 0) database already holds; a new rem database holds nothing
FOREIGN_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)


def refuse_foreign(path: Path | str, user_version: int, tables: list[str]) -> None:
    """Never touch another program's SQLite database: rem's is versioned, or empty."""
    if user_version == 0 and tables:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise DataDirError(
            f"{path} is a SQLite database, but not rem's (no rem schema; tables: {shown}); "
            "move it aside or pass another --data"
        )


def _target(path: Path, read_only: bool) -> tuple[str, bool]:
    """What `sqlite3.connect` opens: the path, or a read-only URI (`(database, uri)`)."""
    if not read_only:
        return str(path), False
    return f"{Path(path).absolute().as_uri()}?mode=ro", True


async def _pg_thread(url: str, *, read_only: bool) -> aiosqlite.Connection:
    """A PostgreSQL connection (`PgConnection`) on a worker thread of its own."""
    from backend.store import postgres

    # aiosqlite's Connection is a generic "one DB-API connection on one thread" proxy:
    # its connector returns the psycopg adapter, so every door of `Database` is shared
    connector = cast(
        Callable[[], sqlite3.Connection], partial(postgres.PgConnection, url, read_only=read_only)
    )
    conn = aiosqlite.Connection(connector, 64)
    # aiosqlite's worker thread is not a daemon: one Database left unclosed (a command that
    # failed on an unusual path) would keep the process alive at exit, waiting on its queue
    conn._thread.daemon = True
    try:
        await conn
    except BaseException:
        _join_failed_worker(conn)
        raise
    return conn


def _join_failed_worker(conn: aiosqlite.Connection) -> None:
    """Wait for the worker thread of a connection that failed to open to finish stopping.

    aiosqlite's failed connect queues the worker's stop with a future on this
    event loop and returns at once; a command that then exits (its one-line
    error) can close the loop before the worker answers, and the worker's
    answer to a closed loop prints a thread traceback after the error line.
    The stop is a few microseconds of work: joining it is immediate.
    """
    conn._thread.join(timeout=5)


class Database:
    """One connection to the state store, shared by the tasks of a process.

    Tasks take turns through an asyncio lock: transactions belong to a
    connection, so two tasks must never interleave statements inside one.
    `engine` is `sqlite` (state.db) or `postgresql` (`--db URL`, see
    `backend.store.postgres`: a psycopg connection shaped like
    `sqlite3.Connection` on the same kind of worker thread, so every door
    below and every `_sync` function is shared); `where` names the store in
    messages (the path, or the URL without its password).
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        read_only: bool,
        *,
        engine: str = "sqlite",
        where: str | None = None,
    ) -> None:
        self.conn = conn
        self.path = path
        self.read_only = read_only
        self.engine = engine
        self.where = where or str(path)
        self._lock = asyncio.Lock()
        # group commit: write_in_thread calls waiting for the next group, and the task committing them
        self._writes: list[tuple[Callable[[Conn], Any], asyncio.Future[Any]]] = []
        self._committer: asyncio.Task[None] | None = None
        self.groups_committed = 0
        # PostgreSQL: the store's URL, and the second connection `read_beside` opens on first use
        self._url: str | None = None
        self._reader: aiosqlite.Connection | None = None
        self._reader_opening = asyncio.Lock()

    @classmethod
    async def connect(cls, url: str, *, read_only: bool = False) -> Database:
        """Connect to a PostgreSQL state store (`postgresql://...`) on a worker thread of its own."""
        from backend.store import postgres

        conn = await _pg_thread(url, read_only=read_only)
        db = cls(conn, Path("postgresql"), read_only, engine="postgresql", where=postgres.display_url(url))
        db._url = url
        return db

    @property
    def postgres(self) -> bool:
        return self.engine == "postgresql"

    @classmethod
    async def open(cls, path: Path, *, read_only: bool = False) -> Database:
        """Open state.db with rem's PRAGMAs.

        A read-only open is a `mode=ro` connection, not a writable one told to
        behave: it cannot write a byte of state.db or its WAL, so closing it never
        checkpoints the WAL into state.db nor deletes the -wal file (SQLite
        needs the write lock to do either). It still shares the -shm index,
        which every reader writes by design.
        """
        if not read_only:
            # created 0600 here, not by SQLite under the caller's umask: SQLite gives the
            # -wal and -shm files it creates the mode of the database file
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                private.create_private_file(path)
        database, uri = _target(path, read_only)
        conn = aiosqlite.connect(database, uri=uri, isolation_level=None)
        try:
            with sqlite_errors(path):
                await conn
        except BaseException:
            _join_failed_worker(conn)
            raise
        conn.row_factory = sqlite3.Row
        db = cls(conn, path, read_only)
        try:
            with sqlite_errors(path):
                await db._apply_pragmas()
        except BaseException:
            await conn.close()
            raise
        return db

    async def _apply_pragmas(self) -> None:
        c = self.conn
        await c.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not self.read_only and await self.scalar("PRAGMA journal_mode") != "wal":
            # switching to WAL rewrites the file header: refuse another program's database first
            refuse_foreign(
                self.path,
                await self.scalar("PRAGMA user_version"),
                [r["name"] for r in await self.fetchall(FOREIGN_TABLES_SQL)],
            )
            await c.execute("PRAGMA journal_mode = WAL")
        await c.execute("PRAGMA synchronous = NORMAL")
        await c.execute("PRAGMA foreign_keys = ON")
        await c.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        if self.read_only:
            await c.execute("PRAGMA query_only = ON")

    async def close(self) -> None:
        try:
            if self._reader is not None:
                reader, self._reader = self._reader, None
                await reader.close()
        finally:
            await self.conn.close()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[aiosqlite.Connection]:
        """A write transaction: BEGIN IMMEDIATE, COMMIT on success, ROLLBACK on error."""
        if self.read_only:
            raise ReadOnly(f"{self.where} is opened read-only; this action needs a writable rem")
        # a statement that fails in the body or at COMMIT (full disk, corrupt page): one clear RemError
        async with self._lock:
            with self.errors():
                await self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                    await self.conn.execute("COMMIT")
                except BaseException:
                    await self._rollback_quietly()
                    raise

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[aiosqlite.Connection]:
        """A short read transaction so several queries see one consistent state."""
        async with self._lock:
            try:
                with self.errors():
                    await self.conn.execute("BEGIN")
                    yield self.conn
            finally:
                await self._rollback_quietly()

    def errors(self) -> AbstractContextManager[None]:
        """Errors of this store's engine raised as the one-line RemError naming it."""
        if self.postgres:
            from backend.store.postgres import postgres_errors

            return postgres_errors(self.where)
        return sqlite_errors(self.path)

    def sqlite_errors(self) -> AbstractContextManager[None]:
        """`errors()` (the name callers used before the PostgreSQL store)."""
        return self.errors()

    def is_engine_error(self, exc: BaseException) -> bool:
        """Whether `exc` is this store's engine's own error (sqlite3's or psycopg's), untranslated."""
        if isinstance(exc, sqlite3.Error):
            return True
        if self.postgres:
            import psycopg

            return isinstance(exc, psycopg.Error)
        return False

    def translate(self, exc: BaseException) -> BaseException:
        """An engine error as its RemError (or unchanged)."""
        if isinstance(exc, sqlite3.Error):
            return translate_sqlite_error(exc, self.path) or exc
        if self.postgres:
            import psycopg

            from backend.store.postgres import translate_postgres_error

            if isinstance(exc, psycopg.Error):
                return translate_postgres_error(exc, self.where) or exc
        return exc

    async def _rollback_quietly(self) -> None:
        try:
            if self.conn.in_transaction:
                await self.conn.execute("ROLLBACK")
        except Exception:  # sqlite3.Error, or psycopg's on a broken connection
            log.warning("rollback failed on %s", self.where, exc_info=True)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one autocommit query and return all rows."""
        async with self._lock:
            with self.errors():
                return list(await self.conn.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def scalar(self, sql: str, params: Params = ()) -> Any:
        row = await self.fetchone(sql, params)
        return None if row is None else row[0]

    async def run_in_thread(self, fn: Callable[[Conn], T]) -> T:
        """Run `fn(raw sqlite3 connection)` on the connection's own thread, in one hop.

        For read paths that run many queries and build many rows (the status
        snapshot): one thread hop instead of one per statement, and the row
        building happens off the event loop. Uses aiosqlite's queue (pinned
        version); `fn` must not leave a transaction open.
        """
        # Single-hop calls need no turn-taking among themselves: each runs whole on
        # the connection's one thread, in queue order, so several tasks may queue
        # theirs at once (the thread never idles while the event loop prepares the
        # next). Only a multi-hop transaction (`tx`, `snapshot`, `fetchall`) must
        # not be entered: wait until none holds the lock. `_execute` enqueues
        # synchronously before its first suspension, so a multi-hop transaction
        # that takes the lock later queues its BEGIN behind this call.
        while self._lock.locked():
            async with self._lock:
                pass
        with self.errors():
            return await in_thread(self.conn, fn)

    async def read_in_thread(self, fn: Callable[[Conn], T]) -> T:
        """`fn(conn)` inside one short read transaction (a consistent view), in one hop."""

        def read_sync(conn: Conn) -> T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("ROLLBACK")

        return await self.read_beside(read_sync)  # PostgreSQL: on the reading connection

    async def fetchall_beside(self, sql: str, params: Params = ()) -> list[Row]:
        """`fetchall`, beside the writes (`read_beside`)."""
        return await self.read_beside(lambda conn: list(conn.execute(sql, params).fetchall()))

    async def read_beside(self, fn: Callable[[Conn], T]) -> T:
        """`fn(conn)`, which only reads and leaves no transaction open, in one hop; on
        PostgreSQL on a second, read-only connection, beside the writes.

        On SQLite this is `run_in_thread`. On PostgreSQL one connection serves
        one statement at a time, and on the turn path the connection's thread is
        what limits a process (`benchmarks/turns.py`): the reads that stand
        alone (recall, the executor's wake query, every `read_in_thread`) wait
        for no write there and make no write wait. They see what is committed,
        as they would on the first connection: a caller's own write is committed
        before its `write_in_thread` or `tx` returns. The connection is opened
        on first use, read-only at the server (`default_transaction_read_only`),
        and closed with the Database.
        """
        if self._url is None:
            return await self.run_in_thread(fn)
        if self._reader is None:
            async with self._reader_opening:
                if self._reader is None:
                    with self.errors():
                        self._reader = await _pg_thread(self._url, read_only=True)
        with self.errors():
            return await in_thread(self._reader, fn)

    async def write_in_thread(self, fn: Callable[[Conn], T]) -> T:
        """`fn(conn)` as one atomic write transaction, committed with whatever else is waiting.

        For hot write paths (the executor's turn transactions). `fn` runs on
        the connection's thread and must not await. Group commit: the calls
        that arrive while a group is being written go together in the next
        one: one `BEGIN IMMEDIATE ... COMMIT` and one thread hop for all of
        them, each `fn` in its own SAVEPOINT, in arrival order, so each is
        still atomic and sees the ones before it. An `fn` that raises rolls
        back its own writes only and its caller gets the exception; the others
        commit. A caller is answered only after the group's COMMIT (durable as
        any single transaction), and a failed COMMIT fails every caller in the
        group. A call cancelled before its group starts never runs.
        """
        if self.read_only:
            raise ReadOnly(f"{self.where} is opened read-only; this action needs a writable rem")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._writes.append((fn, future))
        if self._committer is None:
            self._committer = loop.create_task(self._commit_groups(), name="rem-db-group-commit")
        return await future

    async def _commit_groups(self) -> None:
        group: list[tuple[Callable[[Conn], Any], asyncio.Future[Any]]] = []
        try:
            while True:
                await asyncio.sleep(0)  # tasks woken by the last group queue their next write first
                group = [(fn, fut) for fn, fut in self._writes[:WRITE_GROUP_MAX] if not fut.done()]
                del self._writes[:WRITE_GROUP_MAX]
                if not group:
                    if not self._writes:
                        return
                    continue
                try:
                    outcomes = await self.run_in_thread(
                        partial(commit_group_sync, fns=[fn for fn, _ in group])
                    )
                except Exception as exc:
                    # BEGIN or COMMIT failed, or SQLite dropped the transaction: nobody's write is in
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.groups_committed += 1
                for (_, fut), (ok, value) in zip(group, outcomes, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(self.translate(value))
        except asyncio.CancelledError:  # the loop is shutting down: no caller waits forever
            for _, fut in group + self._writes:
                fut.cancel()
            self._writes.clear()
            raise
        finally:
            self._committer = None

    def server_pids(self) -> frozenset[int]:
        """PostgreSQL: the server process serving this Database (its commits' notifications name
        it; it changes on a reconnect). Empty on SQLite."""
        if not self.postgres:
            return frozenset()
        try:
            pid = cast(Any, self.conn._conn).backend_pid
        except ValueError:  # closed
            return frozenset()
        return frozenset({int(pid)})

    async def data_version(self) -> int:
        """A number that changes whenever another connection commits.

        SQLite: `PRAGMA data_version`. PostgreSQL: the server's WAL position,
        which every committed write moves (as do other databases' writes and
        the server's own upkeep: a spurious change only costs a daemon's idle
        wait one empty look, a missed one cannot happen). The console on
        PostgreSQL gates on the change feed instead (`backend.store.changes`).
        """
        if self.postgres:
            return int(await self.scalar("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
        return int(await self.scalar("PRAGMA data_version"))


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


def execute_unread(conn: Conn, sql: str, params: Params = ()) -> None:
    """A write in the current transaction whose row count and rows nobody reads.

    PostgreSQL sends it together with the transaction's next statement (one
    round trip for both; its error, if any, surfaces there, at the latest at
    the savepoint's RELEASE or the COMMIT); SQLite, which has no round trip to
    save, runs it now.
    """
    queue = getattr(conn, "execute_unread", None)
    if queue is None:
        conn.execute(sql, params)
    else:
        queue(sql, params)


def fenced_write(conn: Conn, sql: str, params: Params, lost: str, *, unread: bool = False) -> None:
    """A fenced write (an UPDATE or DELETE naming its owner) that must change a row, else `LeaseLost(lost)`.

    Checked at once, unless `unread`: then SQLite still runs it now and raises
    at once, and PostgreSQL queues it, unread, as
    `WITH w AS (<sql> RETURNING 1) SELECT rem_fenced(count(*), <lost>) FROM w`:
    no round trip of its own; when it is sent (with the transaction's next
    read, maybe a later group member's, or at COMMIT) a write that changed no
    row fails its statement with `postgres.FENCE_SQLSTATE` and `lost` as the message,
    which the store raises as `LeaseLost`, and its transaction (or group
    member's savepoint) rolls back whole. So a caller may only use it where
    a lost lease ends the whole transaction anyway: the code after it in the
    same function runs before the failure is known, and must change nothing
    outside the transaction that outlives it.
    """
    queue = getattr(conn, "execute_unread", None) if unread else None
    if queue is None:
        if not conn.execute(sql, params).rowcount:
            raise LeaseLost(lost)
        return
    args: Params
    if isinstance(params, Mapping):
        marker, args = ":rem_fence_lost", {**params, "rem_fence_lost": lost}
    else:
        marker, args = "?", (*params, lost)
    queue(f"WITH w AS ({sql} RETURNING 1) SELECT rem_fenced(count(*), {marker}) FROM w", args)


@contextmanager
def independent_reads_sync(conn: Conn) -> Iterator[None]:
    """Several reads that need not see one state (each stands alone), made as cheap as the engine allows.

    SQLite: one read transaction (the shared lock taken once, not per
    statement). PostgreSQL: none; a snapshot would cost a `BEGIN` and a
    `ROLLBACK` round trip, and each statement sees the latest commits anyway.
    """
    if engine_of(conn) == "postgresql":
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")


# one read: its SQL and parameters
Query = tuple[str, Params]
# a reader that needs several rounds of reads: it yields each round's queries, is sent back
# each query's rows (in order), and returns its result (`read_together_sync` drives it)
Reader = Generator[list[Query], list[list[Row]], T]


def read_together_sync(conn: Conn, readers: Sequence[Reader[Any]]) -> list[Any]:
    """Drive independent readers in lockstep, each round's queries of all of them sent together.

    PostgreSQL: a round is one round trip (one pipeline), however many readers
    and queries it holds; SQLite, which has no round trip to save, runs them one
    by one. Returns each reader's result, in order. The reads see no common
    snapshot unless the caller opened one. A query may be a write whose rows
    are read (`... RETURNING`): the statements of one round run in order, so
    readers in one round must not depend on each other's writes.
    """
    results: list[Any] = [None] * len(readers)
    pending: dict[int, list[Query]] = {}

    def advance(i: int, rows: list[list[Row]] | None) -> None:
        try:
            queries = next(readers[i]) if rows is None else readers[i].send(rows)
        except StopIteration as done:
            results[i] = done.value
            return
        pending[i] = queries

    for i in range(len(readers)):
        advance(i, None)
    fetch = getattr(conn, "fetchall_batch", None)
    while pending:
        batch, order = [], []
        for i, queries in pending.items():
            batch += queries
            order.append((i, len(queries)))
        pending = {}
        if fetch is None or len(batch) <= 1:
            rows = [conn.execute(sql, params).fetchall() for sql, params in batch]
        else:
            rows = fetch(batch)
        at = 0
        for i, n in order:
            advance(i, rows[at : at + n])
            at += n
    return results


def executemany_unread(conn: Conn, sql: str, rows: Iterable[Params]) -> None:
    """`execute_unread` for many rows (SQLite: one `executemany`)."""
    queue = getattr(conn, "execute_unread", None)
    if queue is None:
        conn.executemany(sql, rows)
        return
    for row in rows:
        queue(sql, row)


def on_postgres(conn: aiosqlite.Connection) -> bool:
    """Whether an open transaction's connection is the PostgreSQL store's (its raw connection's engine)."""
    return engine_of(cast(Conn, conn._conn)) == "postgresql"


def skip_locked(conn: aiosqlite.Connection) -> str:
    """`skip_locked_sync` for a transaction opened with `Database.tx()`."""
    return skip_locked_sync(cast(Conn, conn._conn))


async def in_thread(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(raw sqlite3 connection, *args)` on an aiosqlite connection's thread, inside its open tx.

    The one place rem uses aiosqlite's private queue (`_execute`, `_conn`): it
    exposes no public hook for running a function on its thread (pinned version).
    """
    result = await conn._execute(fn, conn._conn, *args)  # type: ignore[no-untyped-call]
    return cast(T, result)


async def fetchall(conn: aiosqlite.Connection, sql: str, params: Params = ()) -> list[Row]:
    """Rows of one query on a connection already inside a transaction."""
    return list(await conn.execute_fetchall(sql, params))


async def fetchone(conn: aiosqlite.Connection, sql: str, params: Params = ()) -> Row | None:
    rows = await fetchall(conn, sql, params)
    return rows[0] if rows else None


async def execute(conn: aiosqlite.Connection, sql: str, params: Params = ()) -> int:
    """Run one statement inside the current transaction; return rows changed."""
    cursor = await conn.execute(sql, params)
    try:
        return cursor.rowcount
    finally:
        await cursor.close()


async def executemany(conn: aiosqlite.Connection, sql: str, rows: Iterable[Params]) -> None:
    cursor = await conn.executemany(sql, rows)
    await cursor.close()
