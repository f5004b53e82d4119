"""The raw connection a `_sync` function takes (`Conn`), the rows it reads, and the engine behind it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

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
