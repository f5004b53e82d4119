"""`rem show`: one session's transcript as the operator needs it in an incident.

Messages in sequence order with their streamed parts, each reply's usage,
cost and model error, and the recovery markers (continuation messages,
superseded and interrupted replies), plus the session's totals, its hold,
what is still waiting and the agent's tool calls. Reads only, in one read transaction.
"""

from __future__ import annotations

import json
from typing import Any

from backend.core.errors import SessionNotFound
from backend.ops.tool_status import session_calls_sync
from backend.store.db import Conn, Row

SESSION_COLUMNS = (
    "id, project, title, model, turn_count, message_count, input_count, last_seq, cost, tokens_input, tokens_output, "
    "tokens_reasoning, tokens_cache_read, tokens_cache_write, held_at, held_reason, model_error, "
    "time_created, time_updated"
)
# why a message is shown with a marker: what happened to it
MARKERS = {
    "superseded": "superseded (a newer step or a recovery replaced it)",
    "interrupted": "interrupted (its stream broke; the next step re-asked)",
    "error": "error reply",
    "streaming": "streaming now",
}
TRUNCATED_MARKER = "truncated (the reply reached REM_MODEL_REPLY_MAX_CHARS; the rest was never read)"


def _json(raw: Any) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"raw": raw}


def _session_sync(conn: Conn, session_id: str) -> dict[str, Any]:
    row = conn.execute(f"SELECT {SESSION_COLUMNS} FROM session WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}; list sessions with `rem status`")
    out = dict(row)
    out["usage"] = {
        k: out.pop(f"tokens_{k}") for k in ("input", "output", "reasoning", "cache_read", "cache_write")
    }
    out["model_error"] = _json(out["model_error"])
    return out


# what a message's data may hold, shown as it is stored
MESSAGE_KEYS = (
    "answers",
    "execution_id",
    "step",
    "model",
    "usage",
    "cost",
    "finish_reason",
    "truncated",
    "attempts",
    "ttft_ms",
    "error",
    "reask",
    "superseded_by",
    "interrupted_phase",
    "speaker",
    "memory",
)


def message_record(row: Row, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One message as `rem show --json` (and the API) give it: its text, parts, marker and what its data holds."""
    data = _json(row["data"]) or {}
    status = data.get("status")
    marker = "recovery" if row["type"] == "synthetic" else MARKERS.get(str(status))
    if data.get("truncated") and marker is None:
        marker = TRUNCATED_MARKER
    return {
        "id": row["id"],
        "type": row["type"],
        "seq": row["seq"],
        "time": row["time_created"],
        "status": status,
        "marker": marker,
        "text": data.get("text", ""),
        "parts": parts,
        **{key: data[key] for key in MESSAGE_KEYS if key in data},
    }


def transcript_sync(conn: Conn, session_id: str, last: int = 0) -> dict[str, Any]:
    """The session's transcript (the `last` messages only, when > 0); run in one read transaction."""
    session = _session_sync(conn, session_id)
    rows = conn.execute(
        "SELECT id, type, seq, time_created, data FROM session_message WHERE session_id = ? "
        "AND seq > ? ORDER BY seq",
        (session_id, _first_seq_sync(conn, session_id, last)),
    ).fetchall()
    parts: dict[str, list[dict[str, Any]]] = {}
    for message_id, idx, data in conn.execute(
        "SELECT message_id, idx, data FROM session_part WHERE session_id = ? ORDER BY message_id, idx",
        (session_id,),
    ):
        parts.setdefault(message_id, []).append({"idx": idx, "text": (_json(data) or {}).get("text", "")})
    waiting = [
        {
            "id": r[0],
            "delivery": r[1],
            "admitted_seq": r[2],
            "asleep": not r[3],
            "text": _json(r[4]).get("text"),
        }
        for r in conn.execute(
            "SELECT id, delivery, admitted_seq, wake_pending, prompt FROM session_input "
            "WHERE session_id = ? AND promoted_seq IS NULL ORDER BY admitted_seq",
            (session_id,),
        )
    ]
    execution = conn.execute(
        "SELECT id, owner_id, epoch, phase, step, expires_at FROM session_execution WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    recoveries = conn.execute(
        "SELECT execution_id, phase, wake_attempts, recovery_error, time_created FROM session_recovery "
        "WHERE session_id = ? ORDER BY time_created",
        (session_id,),
    ).fetchall()
    return {
        "session": session,
        "messages": [message_record(r, parts.get(r["id"], [])) for r in rows],
        "waiting": waiting,
        "execution": dict(execution) if execution else None,
        "recoveries": [dict(r) for r in recoveries],
        "tool_calls": session_calls_sync(conn, session_id),
    }


def _first_seq_sync(conn: Conn, session_id: str, last: int) -> int:
    if last <= 0:
        return 0
    row = conn.execute(
        "SELECT seq FROM session_message WHERE session_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
        (session_id, last),
    ).fetchone()
    return int(row[0]) if row else 0
