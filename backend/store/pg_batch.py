"""Statements for PostgreSQL sent in batches through libpq's pipeline mode, prepared once per connection:
one round trip per batch, whatever the number of statements (`PgConnection` drives it).

Why not psycopg's pipeline mode (what rem used before): its per-statement
bookkeeping is Python (a cursor, a result set, a row maker, a column
description each), ~35 µs of this process's CPU a statement here, and a turn
sends ~45. Driving libpq's pipeline directly (`pgconn.send_query_prepared`,
the parameters dumped and the rows loaded by psycopg's adapters, in C) costs
~8 µs a statement. Each distinct statement is prepared on the server the
first time a connection sends it (`send_prepare`, in the same pipeline), so
the server parses and plans it once: sent as simple queries, planned each
time, rem's turn cost the server twice the CPU (benchmarks/peers.py prints
both sides). Behind a transaction-mode pooler (`REM_DB_POOLED`; PgBouncer
1.18 keeps no prepared statement across transactions) every statement goes
unnamed instead: parsed and planned each time, prepared never.

A batch ends with one Sync: the server runs its statements in order, each
answering one result set, and after the first error it skips the rest (each
answers "aborted"), so the failed statement is known by its position. A
statement whose Parse was skipped is not prepared (its name is not kept).

A statement is shaped from rem's SQLite-dialect SQL once per distinct text
(`template`, cached): the dialect translated (`translate_sql`), its
placeholders numbered (`$1`, a named one the same number each time it
appears). Values are dumped as text by psycopg's dumpers: an int as int8, a
bool as 1/0 (rem's flag columns are integers, as SQLite stores them), text
with no declared type (the server infers it, as psycopg does), NUL refused.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
import psycopg.errors
from psycopg import generators, pq
from psycopg.waiting import Wait

from backend.store.pg_dialect import translate_sql

# plain ints: a result's `status` is one, and comparing it with the IntEnum costs a Python call
TUPLES_OK = int(pq.ExecStatus.TUPLES_OK)
COMMAND_OK = int(pq.ExecStatus.COMMAND_OK)
FATAL_ERROR = int(pq.ExecStatus.FATAL_ERROR)
PIPELINE_SYNC = int(pq.ExecStatus.PIPELINE_SYNC)

# a placeholder in translated SQL (`%s`, `%(name)s`) or a literal percent sign (`%%`)
_PARAM = re.compile(rb"%(?:%|s|\((\w+)\)s)")
_WRITES = (b"INSERT", b"UPDATE", b"DELETE", b"WITH")


class Template(NamedTuple):
    """A statement as PostgreSQL takes it (`$n` placeholders) and where its values come from."""

    query: bytes
    names: tuple[str, ...] | None  # the named parameters, in $n order (None: positional)
    placeholders: int
    write: bool  # INSERT / UPDATE / DELETE (or a WITH that may hold one): its row count is a change


@functools.lru_cache(maxsize=4096)
def template(sql: str) -> Template:
    """rem's SQLite-dialect `sql`, translated for PostgreSQL, its placeholders numbered (cached)."""
    text = translate_sql(sql).encode()
    out: list[bytes] = []
    numbers: dict[str, int] = {}
    positional, last = 0, 0
    for match in _PARAM.finditer(text):
        out.append(text[last : match.start()])
        last = match.end()
        if match.group(0) == b"%%":
            out.append(b"%")
            continue
        if match.group(1) is None:
            positional += 1
            number = positional
        else:
            number = numbers.setdefault(match.group(1).decode(), len(numbers) + 1)
        out.append(b"$%d" % number)
    out.append(text[last:])
    if positional and numbers:
        raise psycopg.ProgrammingError("a statement mixes positional and named placeholders")
    head = text.lstrip()[:6].upper()
    names = tuple(numbers) if numbers else None
    return Template(b"".join(out), names, positional or len(numbers), head.startswith(_WRITES))


def values_of(shape: Template, params: Any) -> Sequence[Any]:
    """`params` in the statement's `$n` order."""
    if shape.names is not None:
        if not isinstance(params, Mapping):
            raise psycopg.ProgrammingError(
                "a statement with named placeholders needs a mapping of parameters"
            )
        try:
            return [params[name] for name in shape.names]
        except KeyError as exc:
            raise psycopg.ProgrammingError(f"query parameter missing: {exc.args[0]}") from None
    values = params or ()
    if len(values) != shape.placeholders:
        raise psycopg.ProgrammingError(
            f"the query has {shape.placeholders} placeholders but {len(values)} parameters were passed"
        )
    return values


# -- rows ----------------------------------------------------------------------------
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


@functools.lru_cache(maxsize=1024)
def _index(names: tuple[str, ...]) -> dict[str, int]:
    """Column name -> position, shared by every row of every result with these columns."""
    return {name: i for i, name in reversed(list(enumerate(names)))}  # the first of a repeated name


class Result:
    """What one statement answered: its rows (if it returns any), its row count and columns; read
    like a `sqlite3.Cursor` (`fetchone`, `fetchall`, `rowcount`, `description`)."""

    __slots__ = ("_at", "arraysize", "description", "row_factory", "rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int, description: Any) -> None:
        self.rows = rows
        self.rowcount = rowcount
        self.description = description
        self.row_factory: Any = None
        self.arraysize = 1
        self._at = 0

    @property
    def lastrowid(self) -> int | None:
        return None  # PostgreSQL has none: rem reads generated ids with RETURNING

    def fetchone(self) -> Any:
        if self._at >= len(self.rows):
            return None
        self._at += 1
        return self.rows[self._at - 1]

    def fetchall(self) -> list[Any]:
        rows, self._at = self.rows[self._at :], len(self.rows)
        return rows

    def fetchmany(self, size: int | None = None) -> list[Any]:
        end = self._at + (size or self.arraysize)
        rows, self._at = self.rows[self._at : end], min(end, len(self.rows))
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        return None


NO_RESULT_DESCRIPTION = None


def no_result() -> Result:
    """The answer of a statement not sent (queued, or not needed): no rows, no count."""
    return Result([], -1, NO_RESULT_DESCRIPTION)


def load(res: pq.abc.PGresult, loader: Any) -> Result:
    """One statement's result as a `Result` (its rows loaded by psycopg's loaders, in C)."""
    if res.status != TUPLES_OK:
        count = res.command_tuples
        return Result([], -1 if count is None else count, None)
    names = tuple([res.fname(i).decode() for i in range(res.nfields)])  # type: ignore[union-attr]
    index = _index(names)
    loader.set_pgresult(res)

    def make(values: Sequence[Any]) -> Row:
        return Row(values, index)

    rows = loader.load_rows(0, res.ntuples, make)
    return Result(rows, res.ntuples, [(name, None, None, None, None, None, None) for name in names])


def failed_at(results: list[list[pq.abc.PGresult]]) -> int | None:
    """The position of the first command whose result is an error, or None."""
    for at, answer in enumerate(results):
        if answer and answer[-1].status == FATAL_ERROR:
            return at
    return None


def error_of(res: pq.abc.PGresult, encoding: str) -> psycopg.Error:
    """A failed statement's result as psycopg's error for its SQLSTATE (`UniqueViolation`, ...)."""
    return psycopg.errors.error_from_result(res, encoding=encoding)


def pipeline(
    pgconn: pq.abc.PGconn, commands: Sequence[tuple[Any, ...]]
) -> Generator[Wait, Any, list[list[pq.abc.PGresult]]]:
    """A psycopg generator (`connection.wait` drives it): send `commands` in one pipeline, then a
    Sync; each command's results, in order.

    A command is `(pgconn method, *arguments)`: `send_prepare`, `send_query_prepared`,
    `send_query_params`.
    """
    pgconn.enter_pipeline_mode()
    try:
        for method, *arguments in commands:
            method(*arguments)
        pgconn.pipeline_sync()
        yield from generators.send(pgconn)
        results: list[list[pq.abc.PGresult]] = []
        current: list[pq.abc.PGresult] = []
        while True:
            while pgconn.is_busy():
                yield Wait.R
                pgconn.consume_input()
            res = pgconn.get_result()
            if res is None:  # the end of one command's results
                results.append(current)
                current = []
            elif res.status == PIPELINE_SYNC:
                return results
            else:
                current.append(res)
    finally:
        if pgconn.pipeline_status:
            try:
                pgconn.exit_pipeline_mode()
            except psycopg.Error:  # results left unread (an interrupted wait): the connection is closed
                pgconn.finish()
