"""What a turn records about its model: usage and cost, failures, holds, and re-asks.

All of it is written inside the step's own transactions (on the database
thread), so a reply, its usage and the session's totals land together or
not at all:

* `record_reply_sync`: the reply's usage (split as the session's usage columns are: input, output,
  reasoning, cache read, cache write) and cost on the assistant message, the
  same added to the session's totals, and the request attempts the step made.
* `record_failure_sync`: the session's last model error; a failure that needs an
  operator (a bad key, an unknown model, no quota) holds the session: its
  waiting inputs stop waking executors (`wake_pending = 0`), new ones are
  admitted asleep, and nothing runs until `rem resume` (`backend.ops.resume`).
* `record_truncation_sync`: a reply that reached `REM_MODEL_REPLY_MAX_CHARS`
  is marked `truncated` (its `finish_reason` too) and journaled.
* `interrupted_reply_sync` / `history_sync`: what a step re-asks with after a broken
  stream or a killed executor, and the transcript context a model agent gets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from backend.core.errors import Refused, SessionNotFound
from backend.core.settings import Settings
from backend.execution.leases import Lease
from backend.execution.parking import TOOL_HOLDS, journal_resumed_sync
from backend.execution.sessions import admit_sync, dumps, sleep_inputs_sync
from backend.models.errors import TRUNCATED, ModelError
from backend.models.health import CallRecord
from backend.models.usage import Usage, cost_of
from backend.store.db import Conn
from backend.store.events import EventKind, append_event_sync
from backend.store.model_calls import write_calls_sync

if TYPE_CHECKING:
    from backend.models.client import ChatReply


@dataclass(frozen=True)
class Reask:
    """A step to re-ask: the partial reply that was durable, and why it stopped."""

    partial: str
    reason: str


def record_reply_sync(
    conn: Conn,
    session_id: str,
    data: dict[str, Any],
    reply: ChatReply | None,
    calls: Sequence[CallRecord],
    owner_id: str,
    now: int,
) -> None:
    """Usage and cost on the reply's `data` and the session's totals (the caller writes `data`)."""
    if calls:
        write_calls_sync(conn, calls, owner_id)
    if reply is None:
        return
    usage = reply.usage or Usage()
    cost = cost_of(reply.model, usage)
    data.update(
        model=reply.model,
        usage=usage.as_dict() if reply.usage is not None else None,
        usage_reported=reply.raw_usage,
        cost=cost,
        finish_reason=reply.finish_reason,
        attempts=reply.attempts,
    )
    if reply.ttft_ms is not None:
        data["ttft_ms"] = round(reply.ttft_ms, 1)
    last_error = _error_json(reply.errors[-1], now) if reply.errors else None
    conn.execute(
        "UPDATE session SET tokens_input = tokens_input + :input, tokens_output = tokens_output + :output, "
        "tokens_reasoning = tokens_reasoning + :reasoning, tokens_cache_read = tokens_cache_read + :cache_read, "
        "tokens_cache_write = tokens_cache_write + :cache_write, cost = cost + :cost, model = :model, "
        "model_error = coalesce(:error, model_error) WHERE id = :sid",
        {
            **usage.as_dict(),
            "cost": cost or 0.0,
            "model": reply.model,
            "error": last_error,
            "sid": session_id,
        },
    )


def record_repairs_sync(
    conn: Conn, lease: Lease, step: int, assistant_id: str, reply: ChatReply | None, now: int
) -> None:
    """Journal the characters no store can hold (NUL, lone surrogates) that the step's reply held,
    each stored as U+FFFD (none: nothing)."""
    if reply is None or not reply.unstorable:
        return
    append_event_sync(
        conn,
        kind=EventKind.MODEL_OUTPUT_REPAIRED,
        actor=lease.owner_id,
        session_id=lease.session_id,
        target=lease.execution_id,
        now=now,
        data={
            "step": step,
            "assistant_id": assistant_id,
            "replaced": reply.unstorable,
            "replaced_with": "U+FFFD",
            "why": "NUL or a lone surrogate (a \\ud800-\\udfff escape without its pair): no store can hold it",
        },
    )


def record_truncation_sync(
    conn: Conn,
    lease: Lease,
    assistant_id: str,
    step: int,
    data: dict[str, Any],
    limit: int,
    now: int,
) -> None:
    """Mark a reply cut at its bound (the caller writes `data`), and journal it."""
    data.update(truncated=True, finish_reason=TRUNCATED)
    append_event_sync(
        conn,
        kind=EventKind.EXECUTION_TRUNCATED,
        actor=lease.owner_id,
        session_id=lease.session_id,
        target=lease.execution_id,
        now=now,
        data={
            "step": step,
            "assistant_id": assistant_id,
            "chars": len(data.get("text") or ""),
            "limit": limit,
            "setting": Settings.model_reply_max_chars.env,
        },
    )


def _error_json(error: dict[str, Any], now: int) -> str:
    return dumps({**error, "time": now})


def record_failure_sync(
    conn: Conn,
    session_id: str,
    exc: ModelError,
    reply: ChatReply | None,
    calls: Sequence[CallRecord],
    owner_id: str,
    now: int,
) -> None:
    """The session's last model error, the attempts made, and a hold when an operator must act."""
    if calls:
        write_calls_sync(conn, calls, owner_id)
    conn.execute(
        "UPDATE session SET model_error = ?, model = coalesce(?, model) WHERE id = ?",
        (_error_json(exc.as_dict(), now), reply.model if reply else None, session_id),
    )
    if exc.needs_operator:
        hold_session_sync(conn, session_id, exc, owner_id, now)


def hold_session_sync(conn: Conn, session_id: str, exc: ModelError, actor: str, now: int) -> None:
    """Stop running the session until an operator resumes it (journaled once per hold)."""
    reason = f"{exc.error_class}: {exc}"[:500]
    held = conn.execute(
        "UPDATE session SET held_at = ?, held_reason = ? WHERE id = ? AND held_at IS NULL",
        (now, reason, session_id),
    ).rowcount
    waiting = sleep_inputs_sync(conn, session_id)
    if held:
        append_event_sync(
            conn,
            kind=EventKind.SESSION_HELD,
            actor=actor,
            session_id=session_id,
            target=session_id,
            now=now,
            data={**exc.as_dict(), "inputs_waiting": waiting, "resume": f"rem resume {session_id}"},
        )


def error_reply(exc: ModelError, session_id: str) -> str:
    """The error reply's text: what failed, and what happens next."""
    if exc.needs_operator:
        return (
            f"The model endpoint refused this turn ({exc.error_class}): {exc}. The session is held: "
            f"nothing more runs in it until an operator fixes the cause and runs `rem resume {session_id}`."
        )
    return f"The model request failed ({exc.error_class}): {exc}."


LAST_ANSWERED_SQL = """
SELECT coalesce(max(seq), 0) FROM session_message
WHERE session_id = ? AND type = 'assistant' AND json_extract(data, '$.status') IN ('completed', 'error')
"""


def interrupted_reply_sync(conn: Conn, session_id: str) -> Reask:
    """After a takeover: the reply the dead owner had made durable (its parts), to re-ask with."""
    after = conn.execute(LAST_ANSWERED_SQL, (session_id,)).fetchone()[0]
    row = conn.execute(
        "SELECT id FROM session_message WHERE session_id = ? AND type = 'assistant' AND seq > ? "
        "AND json_extract(data, '$.status') IN ('superseded', 'interrupted') ORDER BY seq DESC LIMIT 1",
        (session_id, after),
    ).fetchone()
    if row is None:
        return Reask("", "executor_stopped")
    parts = conn.execute(
        "SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (row[0],)
    ).fetchall()
    return Reask("".join(json.loads(p[0]).get("text", "") for p in parts), "executor_stopped")


def history_sync(conn: Conn, session_id: str, before_seq: int, limit: int) -> list[dict[str, Any]]:
    """The last `limit` user prompts and completed replies before `before_seq`, oldest first."""
    rows = conn.execute(
        "SELECT type, data FROM session_message WHERE session_id = ? AND seq < ? "
        "AND (type = 'user' OR (type = 'assistant' AND json_extract(data, '$.status') = 'completed')) "
        "ORDER BY seq DESC LIMIT ?",
        (session_id, before_seq, limit),
    ).fetchall()
    return [{"role": r[0], "text": json.loads(r[1]).get("text", "")} for r in reversed(rows)]


HELD_SQL = "SELECT id, held_at, held_reason FROM session WHERE held_at IS NOT NULL ORDER BY held_at"


class ResumedSession(TypedDict):
    """One session `resume_sync` lifted the hold of."""

    session_id: str
    held_at: int
    held_reason: str
    inputs_woken: int
    reasked: list[str]  # the ids of the prompts admitted again


def resume_sync(
    conn: Conn, session_ids: list[str] | None, *, reask: bool, actor: str, now: int
) -> list[ResumedSession]:
    """Lift the hold of the named sessions (None: every held one); the other side of `hold_session_sync`.

    Their waiting inputs wake; with `reask`, the prompts the failing turn answered
    with an error are admitted again as new inputs (`<input id>.retry<n>`), so the
    question gets a real answer once the cause is fixed. Refused, changing nothing,
    if a named session does not exist or is not held. The operator's journal entry
    is the caller's (`backend.ops.resume`), in the same transaction.
    """
    rows = conn.execute(HELD_SQL).fetchall()
    held = {r[0]: r for r in rows if r[2] not in TOOL_HOLDS}  # a tool hold ends by a decision
    if session_ids is not None:
        for sid in session_ids:
            if sid in held:
                continue
            tool_hold = next((r[2] for r in rows if r[0] == sid and r[2] in TOOL_HOLDS), None)
            if tool_hold is not None:
                raise Refused(
                    f"session {sid!r} is held for a tool call ({tool_hold}); decide the call with "
                    "`rem approve`, `rem deny` or `rem resolve` (`rem status` lists it)"
                )
            if conn.execute("SELECT 1 FROM session WHERE id = ?", (sid,)).fetchone() is None:
                raise SessionNotFound(f"no session {sid!r}; list sessions with `rem status`")
            raise Refused(f"session {sid!r} is not held; there is nothing to resume")
    resumed = []
    for sid in session_ids if session_ids is not None else list(held):
        row = held[sid]
        conn.execute("UPDATE session SET held_at = NULL, held_reason = NULL WHERE id = ?", (sid,))
        journal_resumed_sync(conn, sid, row[2], actor, now)
        woken = conn.execute(
            "UPDATE session_input SET wake_pending = 1 WHERE session_id = ? AND promoted_seq IS NULL",
            (sid,),
        ).rowcount
        again = [
            admit_sync(conn, sid, text, "queue", new_id, now, actor)["input_id"]
            for new_id, text in (_failed_prompts_sync(conn, sid) if reask else [])
        ]
        resumed.append(
            ResumedSession(
                session_id=sid, held_at=row[1], held_reason=row[2], inputs_woken=woken, reasked=again
            )
        )
    return resumed


def _failed_prompts_sync(conn: Conn, session_id: str) -> list[tuple[str, str]]:
    """(new input id, text) for each prompt the session's last error reply answered."""
    row = conn.execute(
        "SELECT data FROM session_message WHERE session_id = ? AND type = 'assistant' "
        "AND json_extract(data, '$.status') = 'error' ORDER BY seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    if row is None:
        return []
    out = []
    for input_id in json.loads(row[0]).get("answers", []):
        prompt = conn.execute(
            "SELECT data FROM session_message WHERE id = ? AND type = 'user'", (input_id,)
        ).fetchone()
        if prompt is None:
            continue
        base = input_id.split(".retry")[0][:90]
        n = 1
        while conn.execute(
            "SELECT 1 FROM session_input WHERE id = ? UNION ALL SELECT 1 FROM session_message WHERE id = ?",
            (f"{base}.retry{n}", f"{base}.retry{n}"),
        ).fetchone():
            n += 1
        out.append((f"{base}.retry{n}", json.loads(prompt[0]).get("text", "")))
    return out
