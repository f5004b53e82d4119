"""Where an admitted input stands: queued, running, or answered (and by which reply).

What `GET /v1/inputs/{input_id}` answers. An input is `queued` until a turn
promotes it, `running` until the execution that promoted it ends, and
`answered` once it has: its `execution.completed` journal row names the
inputs the turn's replies answered and those replies (schema v13), written in
the transaction that ends the execution. The reply is the last of them that
answers this input (its `answers`), with its text.
"""

from __future__ import annotations

import json
from typing import Any

from backend.runtime.context import Context
from backend.store.db import Conn
from backend.store.events import EventKind

INPUT_SQL = """
SELECT i.id, i.session_id, i.promoted_seq, s.project
FROM session_input AS i JOIN session AS s ON s.id = i.session_id
WHERE i.id = ?"""
# the admission's journal row: the turn that answers the input journals after it (a higher id)
ADMITTED_SQL = (
    f"SELECT id FROM event WHERE target = ? AND kind = '{EventKind.INPUT_ADMITTED}' ORDER BY id LIMIT 1"
)
# the completions of the session after it that may name the input (confirmed from the JSON)
COMPLETED_SQL = f"""
SELECT data FROM event
WHERE session_id = :session_id AND id > :floor AND kind = '{EventKind.EXECUTION_COMPLETED}'
  AND data LIKE :pattern ESCAPE '!'
ORDER BY id LIMIT 16"""
REPLIES_SQL = "SELECT id, data FROM session_message WHERE session_id = ? AND id = ?"


def _like_literal(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def _completion_sync(conn: Conn, session_id: str, input_id: str) -> dict[str, Any] | None:
    """The `execution.completed` data naming `input_id` among the inputs it answered, if any."""
    floor = conn.execute(ADMITTED_SQL, (input_id,)).fetchone()
    pattern = "%" + _like_literal(json.dumps(input_id)) + "%"
    params = {"session_id": session_id, "floor": 0 if floor is None else floor[0], "pattern": pattern}
    for row in conn.execute(COMPLETED_SQL, params).fetchall():
        data = json.loads(row[0])
        if input_id in data.get("inputs", ()):
            return dict(data)
    return None


def _reply_sync(conn: Conn, session_id: str, input_id: str, done: dict[str, Any]) -> dict[str, Any]:
    """The reply that answers `input_id`: the last of the turn's replies naming it (its text too)."""
    fallback: dict[str, Any] = {"message_id": done.get("message_id"), "text": None}
    for message_id in reversed(done.get("replies") or [done.get("message_id")]):
        row = conn.execute(REPLIES_SQL, (session_id, message_id)).fetchone()
        if row is None:
            continue
        data = json.loads(row["data"])
        reply = {"message_id": row["id"], "text": data.get("text")}
        if input_id in data.get("answers", ()):
            return reply
        if message_id == done.get("message_id"):
            fallback = reply
    return fallback


def input_status_sync(
    conn: Conn, input_id: str, projects: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """Where `input_id` stands, or None when there is no such input within `projects` (None: all)."""
    row = conn.execute(INPUT_SQL, (input_id,)).fetchone()
    if row is None or (projects is not None and row["project"] not in projects):
        return None
    status: dict[str, Any] = {
        "input_id": input_id,
        "session_id": row["session_id"],
        "state": "queued",
        "reply": None,
    }
    if row["promoted_seq"] is None:
        return status
    done = _completion_sync(conn, row["session_id"], input_id)
    if done is None:
        return {**status, "state": "running"}
    return {**status, "state": "answered", "reply": _reply_sync(conn, row["session_id"], input_id, done)}


async def input_status(
    ctx: Context, input_id: str, projects: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """Where `input_id` stands (`queued`, `running`, `answered` with its reply), kept to `projects`."""
    db = await ctx.db()
    return await db.read_in_thread(lambda conn: input_status_sync(conn, input_id, projects))
