"""Statements on a connection inside an open `Database.tx()` (an `aiosqlite.Connection`), and the
one door from there onto the connection's thread (`in_thread`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import aiosqlite

from backend.store.connection import Conn, Params, Row, T, engine_of, skip_locked_sync


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
