"""Sessions as an application sees them (`rem serve`): a page of sessions, one session's state,
a page of its transcript. Each is kept to the caller's projects inside its query.

A session's `state` is what a client acts on: `held` (a model error an operator must fix, or a
tool call waiting for a decision: `held.reason` says which), `running` (an execution is in
progress or waiting for a takeover), `queued` (inputs wait, no execution yet) or `idle`.

Pages. Sessions come newest first by creation, then id (both fixed for a session's life, so a
session created while a client pages appears at the front, never in the middle, and none is
given twice or skipped); the cursor is opaque (`backend.ops.paging`). Messages come in their
sequence order after a `seq` (a message's own, public number), bounded by count and by bytes.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from backend.core.errors import BadInput, SessionNotFound
from backend.ops import paging
from backend.ops.transcript import message_record
from backend.runtime.context import Context
from backend.store.db import Conn, Row

MAX_PAGE = 100
DEFAULT_PAGE = 50
# a page of messages stops once its texts pass this many bytes (at least one message is given)
MAX_PAGE_BYTES = 4 * 1024 * 1024
USAGE_KEYS = ("input", "output", "reasoning", "cache_read", "cache_write")

SESSION_ROW = """
SELECT s.id, s.project, s.title, s.model, s.held_at, s.held_reason, s.model_error, s.message_count,
       s.input_count, s.turn_count, s.last_seq, s.cost, s.tokens_input, s.tokens_output,
       s.tokens_reasoning, s.tokens_cache_read, s.tokens_cache_write, s.time_created, s.time_updated,
       e.id AS execution_id, e.phase, e.step, e.parked,
       (SELECT count(*) FROM session_input AS i WHERE i.session_id = s.id AND i.promoted_seq IS NULL)
           AS inputs_waiting
FROM session AS s LEFT JOIN session_execution AS e ON e.session_id = s.id
"""
WAITING_CALLS_SQL = (
    "SELECT id, tool, state FROM tool_call WHERE session_id = ? AND state IN ('awaiting_approval', 'unknown') "
    "ORDER BY time_created, id"
)


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"limit {limit!r} is out of range: ask for 1 to {MAX_PAGE} per page")
    return limit


def _in_projects(projects: Collection[str] | None) -> tuple[str, dict[str, Any]]:
    """A condition keeping sessions of `projects` (None: every project), and its parameters."""
    if projects is None:
        return "TRUE", {}
    names = {f"p{i}": p for i, p in enumerate(sorted(projects))}
    return f"s.project IN ({', '.join(f':{n}' for n in names) or 'NULL'})", names


def state_of(row: Row | dict[str, Any]) -> str:
    """held, running, queued or idle (see the module doc)."""
    if row["held_at"] is not None:
        return "held"
    if row["execution_id"] is not None:
        return "running"
    return "queued" if row["inputs_waiting"] else "idle"


def _summary(row: Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "project": row["project"],
        "title": row["title"],
        "state": state_of(row),
        "counts": _counts(row),
        "created_at": row["time_created"],
        "updated_at": row["time_updated"],
    }


def _counts(row: Row) -> dict[str, int]:
    return {
        "messages": int(row["message_count"]),
        "inputs": int(row["input_count"]),
        "turns": int(row["turn_count"]),
        "inputs_waiting": int(row["inputs_waiting"]),
    }


async def sessions_page(
    ctx: Context,
    *,
    project: str | None = None,
    cursor: str | None = None,
    limit: int = DEFAULT_PAGE,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """A page of sessions (of `project`, else of every project the caller reaches), newest first."""
    check_limit(limit)
    reach = projects if project is None else [project]
    if project is not None and projects is not None and project not in projects:
        reach = []  # callers check the reach first (a 403); here it is only never widened
    digest = paging.filter_digest("sessions", project)
    where, params = _in_projects(reach)
    if cursor is not None:
        created, after_id = paging.decode_cursor(cursor, "sessions", digest, (int, str))
        where += " AND (s.time_created < :t OR (s.time_created = :t AND s.id < :id))"
        params.update(t=created, id=after_id)
    db = await ctx.db()
    rows = await db.fetchall(
        f"{SESSION_ROW} WHERE {where} ORDER BY s.time_created DESC, s.id DESC LIMIT :limit",
        {**params, "limit": limit + 1},
    )
    page = rows[:limit]
    last = page[-1] if page else None
    more = len(rows) > limit and last is not None
    return {
        "sessions": [_summary(r) for r in page],
        "next_cursor": paging.encode_cursor("sessions", digest, [last["time_created"], last["id"]])
        if more and last is not None
        else None,
    }


def _session_row_sync(conn: Conn, session_id: str, projects: Collection[str] | None) -> Row:
    row = conn.execute(f"{SESSION_ROW} WHERE s.id = ?", (session_id,)).fetchone()
    if row is None or (projects is not None and row["project"] not in projects):
        raise SessionNotFound(f"no session {session_id!r}")
    return row


async def session_state(
    ctx: Context, session_id: str, *, projects: Collection[str] | None = None
) -> dict[str, Any]:
    """One session: its state (and why it is held), usage, counts; another project's is not found."""
    db = await ctx.db()

    def read_sync(conn: Conn) -> dict[str, Any]:
        row = _session_row_sync(conn, session_id, projects)
        calls = conn.execute(WAITING_CALLS_SQL, (session_id,)).fetchall() if row["held_at"] else []
        return _state_record(row, calls)

    return await db.read_in_thread(read_sync)


def _state_record(row: Row, calls: list[Row]) -> dict[str, Any]:
    return {
        **_summary(row),
        "model": row["model"],
        "held": _hold(row, calls),
        "execution": None
        if row["execution_id"] is None
        else {"id": row["execution_id"], "phase": row["phase"], "step": row["step"]},
        "usage": {
            "tokens": {k: int(row[f"tokens_{k}"]) for k in USAGE_KEYS},
            "cost": float(row["cost"]),
        },
        "last_seq": int(row["last_seq"]),
    }


def _hold(row: Row, calls: list[Row]) -> dict[str, Any] | None:
    """Why a held session waits, and what lifts the hold."""
    if row["held_at"] is None:
        return None
    reason = str(row["held_reason"] or "")
    tool_hold = reason.startswith("tool_")
    try:
        model_error = json.loads(row["model_error"]) if row["model_error"] else None
    except ValueError:
        model_error = {"raw": row["model_error"]}
    if model_error is not None and not isinstance(model_error, dict):
        model_error = {"raw": model_error}  # an object, whatever an older rem stored
    return {
        "reason": reason,
        "since": row["held_at"],
        "model_error": model_error,
        "tool_calls": [{"call_id": c["id"], "tool": c["tool"], "state": c["state"]} for c in calls],
        "lifted_by": "a decision on each waiting tool call (approve, deny or resolve)"
        if tool_hold
        else "an operator's `rem resume` once the model error is fixed",
    }


async def messages_page(
    ctx: Context,
    session_id: str,
    *,
    after: int = 0,
    limit: int = DEFAULT_PAGE,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """The session's messages after `after` (a seq) with their parts, in order; `next_after` resumes."""
    check_limit(limit)
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise BadInput(f"after {after!r} is not a message seq: give 0 or the seq of the last message read")
    db = await ctx.db()
    return await db.read_in_thread(lambda conn: _messages_sync(conn, session_id, after, limit, projects))


def _messages_sync(
    conn: Conn, session_id: str, after: int, limit: int, projects: Collection[str] | None
) -> dict[str, Any]:
    _session_row_sync(conn, session_id, projects)
    rows = conn.execute(
        "SELECT id, type, seq, time_created, data FROM session_message WHERE session_id = ? AND seq > ? "
        "ORDER BY seq LIMIT ?",
        (session_id, after, limit + 1),
    ).fetchall()
    parts = _parts_sync(conn, [r["id"] for r in rows[:limit]])
    messages: list[dict[str, Any]] = []
    size = 0
    for row in rows[:limit]:
        if messages and size >= MAX_PAGE_BYTES:
            break
        record = message_record(row, parts.get(row["id"], []))
        record["text"] = record["text"] if isinstance(record["text"], str) else ""
        size += len(record["text"].encode("utf-8", "replace")) + sum(
            len(p["text"].encode("utf-8", "replace")) for p in record["parts"]
        )
        messages.append(record)
    more = len(messages) < len(rows)
    return {
        "session_id": session_id,
        "messages": messages,
        "next_after": messages[-1]["seq"] if more else None,
    }


def _parts_sync(conn: Conn, message_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each message's streamed parts, in order (one indexed read for the page)."""
    parts: dict[str, list[dict[str, Any]]] = {}
    if not message_ids:
        return parts
    marks = ", ".join("?" * len(message_ids))
    for row in conn.execute(
        f"SELECT message_id, idx, type, data FROM session_part WHERE message_id IN ({marks}) "
        "ORDER BY message_id, idx",
        message_ids,
    ).fetchall():
        try:
            data = json.loads(row["data"])
        except ValueError:
            data = None
        text = data.get("text") if isinstance(data, dict) else None
        text = text if isinstance(text, str) else ""
        parts.setdefault(row["message_id"], []).append({"idx": row["idx"], "type": row["type"], "text": text})
    return parts
