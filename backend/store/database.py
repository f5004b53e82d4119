"""`Database`: one connection to the state store (state.db, or PostgreSQL), shared by a process's tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import aiosqlite

from backend.core import private
from backend.core.errors import ConnectionsExhausted, ReadOnly, RemError
from backend.core.settings import settings
from backend.store.connection import Conn, Params, Row, T
from backend.store.group_commit import WRITE_GROUP_MAX, commit_group_sync
from backend.store.sqlite_file import (
    BUSY_TIMEOUT_MS,
    FOREIGN_TABLES_SQL,
    JOURNAL_SIZE_LIMIT,
    refuse_foreign,
    sqlite_errors,
    sqlite_target,
    translate_sqlite_error,
)
from backend.store.transaction import in_thread

log = logging.getLogger("rem.db")


async def _pg_thread(url: str, *, read_only: bool, wait: bool = True) -> aiosqlite.Connection:
    """A PostgreSQL connection (`PgConnection`) on a worker thread of its own (`wait`: for a free
    connection on a full server, `postgres.connect_waiting`)."""
    # import time: psycopg, only for a PostgreSQL store
    from backend.store import postgres

    # aiosqlite's Connection is a generic "one DB-API connection on one thread" proxy:
    # its connector returns the psycopg adapter, so every door of `Database` is shared
    connector = cast(
        Callable[[], sqlite3.Connection], partial(postgres.PgConnection, url, read_only=read_only, wait=wait)
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
        # group commit: write_in_thread calls waiting for the next group, and the task committing them,
        # per write connection (`_Lane`); lane 0 is `conn`, the others (PostgreSQL) open on first use
        self._lanes: list[_Lane] = [_Lane(0, conn)]
        self.groups_committed = 0
        # a group smaller than its lane's last waits up to this long for as many writes (0: never);
        # `rem serve` sets it: its requests' writes come a few loop turns apart (`_fill`)
        self.group_fill_s = 0.0
        # PostgreSQL: the store's URL, and the second connection `read_beside` opens on first use
        self._url: str | None = None
        self._reader: aiosqlite.Connection | None = None
        self._reader_opening = asyncio.Lock()
        self._reader_retry_at = 0.0

    @classmethod
    async def connect(cls, url: str, *, read_only: bool = False, spare: int = 0) -> Database:
        """Connect to a PostgreSQL state store (`postgresql://...`) on a worker thread of its own;
        `spare`: connections the process opens beside this Database, kept out of its write ones."""
        # import time: psycopg, only for a PostgreSQL store
        from backend.store import postgres

        conn = await _pg_thread(url, read_only=read_only)
        db = cls(conn, Path("postgresql"), read_only, engine="postgresql", where=postgres.display_url(url))
        db._url = url
        if not read_only:
            db._open_lanes(write_connections(spare))
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
        database, uri = sqlite_target(path, read_only)
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

    def _open_lanes(self, count: int) -> None:
        """PostgreSQL: `count` write connections in all (lane 0 is `conn`; the others open on first use)."""
        self._lanes += [_Lane(i, None) for i in range(1, max(1, count))]

    async def close(self) -> None:
        try:
            if self._reader is not None:
                reader, self._reader = self._reader, None
                await reader.close()
            for lane in self._lanes[1:]:
                extra, lane.conn = lane.conn, None
                if extra is not None and lane.index != 0:
                    await extra.close()
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
            # import time: psycopg, only for a PostgreSQL store
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
            # import time: psycopg, only for a PostgreSQL store
            import psycopg

            return isinstance(exc, psycopg.Error)
        return False

    def translate(self, exc: BaseException) -> BaseException:
        """An engine error as its RemError (or unchanged)."""
        if isinstance(exc, sqlite3.Error):
            return translate_sqlite_error(exc, self.path) or exc
        if self.postgres:
            # import time: psycopg, only for a PostgreSQL store
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
        on first use, read-only at the server (each of its transactions), and
        closed with the Database. While the server has no free connection for
        it, the reads go to the first connection (tried again a minute later).
        """
        if self._url is None:
            return await self.run_in_thread(fn)
        if self._reader is None:
            await self._open_reader()
            if self._reader is None:
                return await self.run_in_thread(fn)
        with self.errors():
            return await in_thread(self._reader, fn)

    async def _open_reader(self) -> None:
        assert self._url is not None
        loop = asyncio.get_running_loop()
        async with self._reader_opening:
            if self._reader is not None or loop.time() < self._reader_retry_at:
                return
            try:
                with self.errors():
                    self._reader = await _pg_thread(self._url, read_only=True, wait=False)
            except ConnectionsExhausted as exc:
                self._reader_retry_at = loop.time() + 60
                log.warning(
                    "the reading connection to %s is not opened (%s); reads share the first", self.where, exc
                )

    async def write_in_thread(self, fn: Callable[[Conn], T], *, key: str | None = None) -> T:
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

        `key` (a session id): on PostgreSQL, the write connection (lane) the
        call goes to, always the same one for a key, so a session's writes
        stay in order on one connection while other sessions' groups commit
        beside them on the others (`REM_DB_MAX_CONNECTIONS`). Two lanes never
        hold locks on one session's rows, so they cannot deadlock each other
        over them; a write without a key goes to lane 0, with `tx()`. On
        SQLite (one writer at a time) there is one lane.
        """
        if self.read_only:
            raise ReadOnly(f"{self.where} is opened read-only; this action needs a writable rem")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        lane = self._lane_for(key)
        lane.writes.append((fn, future, key))
        if lane.filling is not None and len(lane.writes) >= lane.last_group:
            _settle(lane.filling)
        if lane.committer is None:
            lane.committer = loop.create_task(
                self._commit_groups(lane), name=f"rem-db-group-commit-{lane.index}"
            )
        return await future

    def _lane_for(self, key: str | None) -> _Lane:
        if key is None or len(self._lanes) == 1:
            return self._lanes[0]
        return self._lanes[zlib.crc32(key.encode()) % len(self._lanes)]

    async def _commit_groups(self, lane: _Lane) -> None:
        group: list[tuple[Callable[[Conn], Any], asyncio.Future[Any], str | None]] = []
        try:
            if lane.conn is None and not await self._open_lane(lane):
                return
            run = self.run_in_thread if lane.index == 0 else partial(in_thread, cast(Any, lane.conn))
            while True:
                await asyncio.sleep(0)  # tasks woken by the last group queue their next write first
                if self.group_fill_s and 0 < len(lane.writes) < lane.last_group:
                    await self._fill(lane)
                group = [write for write in lane.writes[:WRITE_GROUP_MAX] if not write[1].done()]
                del lane.writes[:WRITE_GROUP_MAX]
                # by key (a session id), the same order in every process: a group's members lock their
                # sessions' rows in ascending order, so two groups (in this process or another) never
                # each hold a row the other waits for; one key's writes keep their arrival order
                group.sort(key=_member_order)
                if not group:
                    if not lane.writes:
                        return
                    continue
                try:
                    with self.errors():
                        outcomes = await run(partial(commit_group_sync, fns=[fn for fn, _, _ in group]))
                except Exception as exc:
                    # BEGIN or COMMIT failed, or SQLite dropped the transaction: nobody's write is in
                    for _, fut, _ in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.groups_committed += 1
                lane.last_group = len(group)
                for (_, fut, _), (ok, value) in zip(group, outcomes, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(self.translate(value))
        except asyncio.CancelledError:  # the loop is shutting down: no caller waits forever
            for _, fut, _ in group + lane.writes:
                fut.cancel()
            lane.writes.clear()
            raise
        finally:
            lane.committer = None

    async def _fill(self, lane: _Lane) -> None:
        """Wait until the lane holds as many writes as its last group, or `group_fill_s` passes.

        An HTTP server's callers are its clients: those answered by the last group send their next
        request while this one forms, and each reaches `write_in_thread` only once the loop has read
        and parsed it. Without the wait, half of them miss the group and the next one takes them:
        two half groups in turn, each with a group's fixed cost and its handoffs between the loop,
        the connection's thread and the clients, which on two busy cores cost more than the wait.
        """
        loop = asyncio.get_running_loop()
        lane.filling = loop.create_future()
        timer = loop.call_later(self.group_fill_s, _settle, lane.filling)
        try:
            await lane.filling
        finally:
            timer.cancel()
            lane.filling = None

    async def _open_lane(self, lane: _Lane) -> bool:
        """Open a lane's write connection; one that cannot be opened (the server has no free
        connection, or is away) hands its writes, and every later one of its keys, to lane 0."""
        assert self._url is not None
        try:
            with self.errors():
                lane.conn = await _pg_thread(self._url, read_only=False, wait=False)
            return True
        except RemError as exc:
            log.warning(
                "write connection %d to %s not opened (%s); its sessions commit on the first",
                lane.index,
                self.where,
                exc,
            )
        first = self._lanes[0]
        self._lanes[lane.index] = first
        first.writes += lane.writes
        lane.writes = []
        if first.committer is None and first.writes:
            first.committer = asyncio.get_running_loop().create_task(
                self._commit_groups(first), name="rem-db-group-commit-0"
            )
        return False

    def server_pids(self) -> frozenset[int]:
        """PostgreSQL: the server process serving this Database (its commits' notifications name
        it; it changes on a reconnect). Empty on SQLite."""
        if not self.postgres:
            return frozenset()
        pids = set()
        for lane in self._lanes:
            try:
                pids.add(int(cast(Any, lane.conn)._conn.backend_pid))
            except (AttributeError, ValueError):  # not opened, or closed
                continue
        return frozenset(pids)

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


class _Lane:
    """One write connection's group commit: the calls waiting for its next group and its committer."""

    def __init__(self, index: int, conn: aiosqlite.Connection | None) -> None:
        self.index = index
        self.conn = conn
        self.writes: list[tuple[Callable[[Conn], Any], asyncio.Future[Any], str | None]] = []
        self.committer: asyncio.Task[None] | None = None
        self.last_group = 0  # the size of the last group committed
        self.filling: asyncio.Future[None] | None = None  # the committer's wait (`Database._fill`)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _member_order(write: tuple[Any, Any, str | None]) -> tuple[bool, str]:
    """A group member's place: the writes without a key first, then by key."""
    return write[2] is not None, write[2] or ""


def write_connections(spare: int = 0) -> int:
    """How many write connections a process opens to a PostgreSQL store: REM_DB_MAX_CONNECTIONS less
    one for the reader (`read_beside`), one for a LISTEN and `spare` (the API hub's reader), at least one."""
    return max(1, settings.db_max_connections - 2 - spare)
