"""Statements on the database thread that PostgreSQL sends together (one round trip): writes nobody
reads, fenced writes, independent readers driven in lockstep, and reads known ahead. SQLite, with
no round trip to save, runs each one at once."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from backend.core.errors import LeaseLost
from backend.store.connection import Conn, Cursor, Params, Row, T, engine_of


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
    _queue_fenced(queue, sql, params, lost)


def _queue_fenced(queue: Callable[[str, Params], None], sql: str, params: Params, lost: str) -> None:
    """Queue `sql` unread, wrapped so that PostgreSQL fails it with `lost` when it changes no row."""
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


class ReadAhead:
    """A connection some of whose reads were answered ahead, in one round trip (`read_ahead_sync`).

    `execute` of a statement with the parameters it was sent ahead with returns that answer
    (once); any other statement goes to the connection as usual, in the same transaction. So a
    read sees what it would have seen sent on its own, and a guess that missed costs only the
    round trip it did not save (`sent` counts them).
    """

    def __init__(self, conn: Conn, queries: Sequence[Query], results: Sequence[Cursor]) -> None:
        self.conn = conn
        self._answers: dict[tuple[str, Any], list[Cursor]] = {}
        for (sql, params), result in zip(queries, results, strict=True):
            with suppress(TypeError):  # a parameter that is no key: its answer goes unused
                self._answers.setdefault(_answer_key(sql, params), []).append(result)
        self.answered = 0
        self.sent = 0  # statements that were not read ahead, sent on their own

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        try:
            answers = self._answers.get(_answer_key(sql, parameters))
        except TypeError:  # a parameter that is no key (a list): never read ahead
            answers = None
        if answers:
            self.answered += 1
            return answers.pop(0)
        self.sent += 1
        return self.conn.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Cursor:
        return self.conn.executemany(sql, parameters)

    @property
    def unused(self) -> int:
        """The answers read ahead that nobody asked for (a guess that missed)."""
        return sum(len(answers) for answers in self._answers.values())

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)  # the engine, the batch doors, `total_changes`


def _answer_key(sql: str, params: Any) -> tuple[str, Any]:
    """A statement and its parameters as one hashable key (no parameters, in any form: `()`)."""
    if not params:
        return sql, ()
    if type(params) is dict or isinstance(params, Mapping):  # a dict first: the ABC check is ~1 us
        return sql, tuple(sorted(params.items()))
    return sql, tuple(params)


def read_ahead_sync(conn: Conn, queries: Callable[[], Sequence[Query]]) -> Conn:
    """`conn`, the reads `queries()` lists answered ahead: for a reader whose statements are known
    before it runs (the status snapshot's), inside the read transaction its caller opened.

    PostgreSQL: the listed reads go in one round trip (with the queued BEGIN), and the reader's
    `execute` of one of them returns its answer (`ReadAhead`); what it reads besides is sent as
    usual. SQLite, with no round trip to save: `conn` itself, `queries` never called.
    """
    batch = getattr(conn, "execute_batch", None)
    if batch is None:
        return conn
    listed = list(queries())
    return ReadAhead(conn, listed, batch(listed)) if listed else conn
