"""The journal read as the API's event streams: after a cursor, in commit order, on both stores.

Every durable change of a session is a journal row (`event`) written in the
transaction that makes it; schema v13 journals streamed parts and tool-call
states too. A stream is those rows read in an order every reader agrees on,
with each row's position as a durable cursor, so a client resumes from any
cursor, on any server, and gets every later row once:

* SQLite has one writer at a time: ids commit in order, and the order is the id.
* PostgreSQL's ids come from a sequence and commit in any order. Rows are
  read in `(xact, id)` order (`xact`: the writing transaction's id, schema_pg's
  STREAM_ORDER) and only below the horizon `pg_snapshot_xmin(pg_current_snapshot())`,
  the oldest transaction still running: every transaction below it has ended,
  so no row can commit later at a position before one already read. A
  transaction still running holds the rows above it back (committed, not yet
  readable): `Page.held` says so, and the reader reads again soon, since the
  transaction holding them may write no rem table and so send no notification.

A cursor is opaque to clients: `ID.XACT.TAG` (XACT 0 on SQLite), TAG a short
hash of the row, so a cursor of another store, or of a row since pruned and its
id reused, is told from a live one. `0` is the origin, before every row. A
cursor whose row is gone (the journal is pruned from its old end,
`backend.store.maintenance`) or lies within `PRUNE_MARGIN_MS` of the retention
edge is `pruned`; one naming no row of this store is `unknown`: the API answers
both with a `reset` event, never a silent fresh stream.

`to_event` maps journal kinds to the API's event types (`EVENT_TYPES`); other
kinds (upkeep, summaries, Dream, workers, the operator journal) are not streamed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.core import clock
from backend.core.errors import BadInput
from backend.core.settings import settings
from backend.store.db import Conn, engine_of
from backend.store.events import OPERATOR_KINDS_SQL, EventKind

DAY_MS = 86_400_000
# a cursor this close to the retention edge is taken as pruned: pruning deletes by id below the first
# row inside the window, and on PostgreSQL a row after a cursor in stream order may have a lower id
# (its transaction began later but appended first); such rows are at most a transaction apart in time
PRUNE_MARGIN_MS = 3_600_000
PAGE_ROWS = 500
MAX_CURSOR_CHARS = 64
ORIGIN_CURSOR = "0"
_CURSOR = re.compile(r"(0|[1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,19})\.([0-9a-f]{8})")


@dataclass(frozen=True, order=True)
class Position:
    """Where a row sits in the stream: `(xact, id)` on PostgreSQL, `(0, id)` on SQLite."""

    xact: int
    id: int


ORIGIN = Position(0, 0)


@dataclass(frozen=True)
class Cursor:
    """A parsed cursor: a position and the tag of the row it names (None: the origin)."""

    position: Position
    tag: str | None


def row_tag(row_id: int, xact: int, time: int, kind: str) -> str:
    """8 hex digits of a hash of the row: a cursor names this row, not another under its id."""
    return hashlib.blake2s(f"{row_id}|{xact}|{time}|{kind}".encode(), digest_size=4).hexdigest()


def format_cursor(position: Position, tag: str) -> str:
    return f"{position.id}.{position.xact}.{tag}"


def parse_cursor(text: str) -> Cursor:
    """A client's cursor (`Last-Event-ID`, `?after=`), parsed strictly; a BadInput for anything else."""
    if text == ORIGIN_CURSOR:
        return Cursor(ORIGIN, None)
    match = _CURSOR.fullmatch(text) if len(text) <= MAX_CURSOR_CHARS else None
    if match is None or int(match.group(1)) >= 2**63 or int(match.group(2)) >= 2**64:
        shown = text[:MAX_CURSOR_CHARS].encode("unicode_escape").decode("ascii")
        raise BadInput(
            f"cursor {shown!r} is not one rem gave: pass an event's `id:` as Last-Event-ID or ?after= "
            "(or 0 for the oldest event kept)"
        )
    return Cursor(Position(int(match.group(2)), int(match.group(1))), match.group(3))


# -- the API's event types -------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamEvent:
    """One journal row as the API streams it: its cursor, its type and its JSON object."""

    position: Position
    cursor: str
    type: str
    session_id: str
    project: str | None
    data: dict[str, Any]


Fields = Callable[[Any, dict[str, Any]], dict[str, Any]]


def _part_text(row: Any) -> str | None:
    try:
        text = json.loads(row["part"])["text"] if row["part"] is not None else None
    except (ValueError, KeyError, TypeError):
        return None
    return text if isinstance(text, str) else None


def _held(row: Any, data: dict[str, Any]) -> dict[str, Any]:
    reason = data.get("error_class") or data.get("class")
    return {"reason": reason, "message": data.get("message")}


def _failed(row: Any, data: dict[str, Any]) -> dict[str, Any]:
    error = data.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    if row["kind"] == EventKind.RECOVERY_PARKED:  # recovery gave up: an operator must act
        return {"execution_id": row["target"], "class": "recovery_parked", "message": data.get("reason")}
    return {
        "execution_id": row["target"],
        "step": data.get("step"),
        "class": data.get("class"),
        "message": message,
    }


def _completed(row: Any, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "execution_id": row["target"],
        "input_ids": data.get("inputs", []),
        "message_id": data.get("message_id"),
        "replies": data.get("replies", []),
        "steps": data.get("steps"),
        "recovered": data.get("recovered", False),
    }


# journal kind -> (API event type, the fields it adds to `session_id`)
EVENT_TYPES: dict[str, tuple[str, Fields]] = {
    EventKind.INPUT_ADMITTED: (
        "input.admitted",
        lambda r, d: {
            "input_id": r["target"],
            "delivery": d.get("delivery"),
            "admitted_seq": d.get("admitted_seq"),
        },
    ),
    EventKind.INPUT_PROMOTED: (
        "input.promoted",
        lambda r, d: {"execution_id": r["target"], "input_ids": d.get("inputs", [])},
    ),
    EventKind.EXECUTION_CLAIMED: ("turn.started", lambda r, d: {"execution_id": r["target"]}),
    EventKind.EXECUTION_TAKEN_OVER: (
        "turn.recovered",
        lambda r, d: {"execution_id": r["target"], "continuation_id": d.get("continuation_id")},
    ),
    EventKind.MESSAGE_PART: (
        "part",
        lambda r, d: {
            "message_id": d.get("message_id"),
            "idx": d.get("idx"),
            "type": d.get("type"),
            "text": _part_text(r),
        },
    ),
    EventKind.EXECUTION_STEP: (
        "message.completed",
        lambda r, d: {
            "message_id": d.get("assistant_id"),
            "step": d.get("step"),
            "tool_calls": d.get("tool_calls", []),
        },
    ),
    EventKind.TOOL_CALL_STATE: (
        "tool_call",
        lambda r, d: {
            "call_id": r["target"],
            "tool": d.get("tool"),
            "state": d.get("state"),
            "effect": d.get("effect"),
        },
    ),
    EventKind.SESSION_HELD: ("session.held", _held),
    EventKind.SESSION_RESUMED: ("session.resumed", lambda r, d: {"held_reason": d.get("held_reason")}),
    EventKind.EXECUTION_FAILED: ("turn.failed", _failed),
    EventKind.RECOVERY_PARKED: ("turn.failed", _failed),
    EventKind.EXECUTION_COMPLETED: ("turn.completed", _completed),
}
STREAMED_TYPES: tuple[str, ...] = tuple(dict.fromkeys(t for t, _ in EVENT_TYPES.values()))


def position_of(row: Any) -> Position:
    return Position(int(row["xact"]), int(row["id"]))


def cursor_of(row: Any) -> str:
    position = position_of(row)
    return format_cursor(position, row_tag(position.id, position.xact, int(row["time"]), str(row["kind"])))


def to_event(row: Any) -> StreamEvent | None:
    """A journal row (as `read_sync` selects it) as the API's event; None for a kind not streamed."""
    mapped = EVENT_TYPES.get(row["kind"])
    if mapped is None or row["session_id"] is None:
        return None
    kind, fields = mapped
    try:
        data = json.loads(row["data"])
    except ValueError:
        data = {}
    body = {"session_id": row["session_id"], "project": row["project"], "time": row["time"]}
    body.update(fields(row, data if isinstance(data, dict) else {}))
    return StreamEvent(position_of(row), cursor_of(row), kind, row["session_id"], row["project"], body)


# -- reading ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    """Rows read after a position: their events, where the read ended, and what may follow.

    `last`: the position of the last row read (any kind), or the one read from
    when none was; `full`: `limit` rows were read, more may follow at once;
    `held`: PostgreSQL only, rows past `last` are committed but held back by
    the horizon (or just committed): read again soon.
    """

    events: list[StreamEvent]
    last: Position
    last_cursor: str | None  # the last row's cursor (None: no row read)
    full: bool
    held: bool = False


@dataclass(frozen=True)
class Scope:
    """Which rows a read keeps: one session's, some projects' (None: every project), or all."""

    session_id: str | None = None
    projects: frozenset[str] | None = None


_COLUMNS = """e.id, {xact} AS xact, e.time, e.kind, e.session_id, e.target, e.data, s.project, p.data AS part
FROM event AS e
LEFT JOIN session AS s ON s.id = e.session_id
LEFT JOIN session_part AS p ON e.kind = 'message.part' AND p.id = e.target"""
SQLITE_AFTER = "e.id > :after_id"
SQLITE_UPTO = "e.id <= :upto_id"
SQLITE_ORDER = "e.id"
PG_AFTER = "(e.xact, e.id) > (CAST(:after_xact AS xid8), :after_id) AND e.xact < pg_snapshot_xmin(pg_current_snapshot())"
PG_UPTO = "(e.xact, e.id) <= (CAST(:upto_xact AS xid8), :upto_id)"
PG_ORDER = "e.xact, e.id"
# PostgreSQL: is any row past the last one read already there (held back by the horizon)?
PG_HELD_SQL = "SELECT 1 FROM event WHERE (xact, id) > (CAST(:xact AS xid8), :id) LIMIT 1"


def _read_sql(postgres: bool, scope: Scope, upto: bool) -> str:
    where = [PG_AFTER if postgres else SQLITE_AFTER]
    if upto:
        where.append(PG_UPTO if postgres else SQLITE_UPTO)
    if scope.session_id is not None:
        where.append("e.session_id = :session_id")
    if scope.projects is not None:
        marks = ", ".join(f":project{i}" for i in range(len(scope.projects))) or "NULL"
        where.append(f"s.project IN ({marks})")
    columns = _COLUMNS.format(xact="CAST(e.xact AS text)" if postgres else "0")
    order = PG_ORDER if postgres else SQLITE_ORDER
    return f"SELECT {columns} WHERE {' AND '.join(where)} ORDER BY {order} LIMIT :limit"


def read_sync(
    conn: Conn,
    after: Position,
    scope: Scope = Scope(),
    *,
    upto: Position | None = None,
    limit: int = PAGE_ROWS,
) -> Page:
    """The rows of `scope` after `after` (and up to `upto`), in stream order, at most `limit`."""
    postgres = engine_of(conn) == "postgresql"
    params: dict[str, Any] = {"after_id": after.id, "after_xact": str(after.xact), "limit": limit}
    if upto is not None:
        params.update(upto_id=upto.id, upto_xact=str(upto.xact))
    if scope.session_id is not None:
        params["session_id"] = scope.session_id
    for i, project in enumerate(sorted(scope.projects or ())):
        params[f"project{i}"] = project
    if not postgres:  # sqlite3 refuses named parameters the statement does not use
        params.pop("after_xact")
        params.pop("upto_xact", None)
    rows = conn.execute(_read_sql(postgres, scope, upto is not None), params).fetchall()
    last = position_of(rows[-1]) if rows else after
    events = [event for event in map(to_event, rows) if event is not None]
    full = len(rows) >= limit
    held = postgres and not full and _held_back_sync(conn, last)
    return Page(events, last, cursor_of(rows[-1]) if rows else None, full, held)


def _held_back_sync(conn: Conn, last: Position) -> bool:
    return conn.execute(PG_HELD_SQL, {"xact": str(last.xact), "id": last.id}).fetchone() is not None


def live_end_sync(conn: Conn) -> tuple[Position, str]:
    """The newest readable row's position and cursor (the origin on an empty journal)."""
    if engine_of(conn) == "postgresql":
        # `e.xact`, not `xact`: ORDER BY a bare name sorts by the output column, here its text
        # ('999' after '1000'), and the live end stuck at the last row before a power of ten
        sql = (
            "SELECT e.id, CAST(e.xact AS text) AS xact, e.time, e.kind FROM event AS e "
            "WHERE e.xact < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY e.xact DESC, e.id DESC LIMIT 1"
        )
    else:
        sql = "SELECT id, 0 AS xact, time, kind FROM event ORDER BY id DESC LIMIT 1"
    row = conn.execute(sql).fetchone()
    if row is None:
        return ORIGIN, ORIGIN_CURSOR
    return position_of(row), cursor_of(row)


def check_cursor_sync(conn: Conn, cursor: Cursor, now: int | None = None) -> str | None:
    """Why `cursor` cannot be resumed from (`unknown`, `pruned`), or None when it can."""
    if cursor.tag is None:
        return None
    postgres = engine_of(conn) == "postgresql"
    xact = "CAST(xact AS text)" if postgres else "0"
    row = conn.execute(
        f"SELECT id, {xact} AS xact, time, kind FROM event WHERE id = ?", (cursor.position.id,)
    ).fetchone()
    if row is None:  # below the oldest row that pruning would take: pruned; else never this store's
        oldest = conn.execute(
            f"SELECT min(id) FROM event WHERE kind NOT IN ({OPERATOR_KINDS_SQL})"
        ).fetchone()
        return "pruned" if oldest[0] is None or cursor.position.id < int(oldest[0]) else "unknown"
    if position_of(row) != cursor.position or cursor_of(row) != format_cursor(cursor.position, cursor.tag):
        return "unknown"
    edge = (clock.now_ms() if now is None else now) - settings.event_retention_days * DAY_MS
    return "pruned" if int(row["time"]) < edge + PRUNE_MARGIN_MS else None
