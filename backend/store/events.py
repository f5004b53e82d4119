"""The `event` journal: append-only, written in the same transaction as the change it records.

The console tails it; runbooks query it. `append_event` must be called with a
connection that is inside the write transaction of the change it describes.
"""

from __future__ import annotations

import getpass
import json
import os
from enum import StrEnum
from typing import Any

import aiosqlite

from backend.core import clock
from backend.core.settings import settings
from backend.store.db import Conn


class EventKind(StrEnum):
    SCHEMA_MIGRATED = "schema.migrated"
    INPUT_ADMITTED = "input.admitted"
    INPUT_PROMOTED = "input.promoted"
    EXECUTION_CLAIMED = "execution.claimed"
    EXECUTION_STEP = "execution.step"
    EXECUTION_COMPLETED = "execution.completed"
    EXECUTION_LEASE_LOST = "execution.lease_lost"
    EXECUTION_TAKEN_OVER = "execution.taken_over"
    EXECUTION_HANDED_BACK = "execution.handed_back"
    EXECUTION_FAILED = "execution.failed"
    EXECUTION_INTERRUPTED = "execution.interrupted"
    RECOVERY_PARKED = "recovery.parked"
    MODEL_ERROR = "model.error"
    SESSION_HELD = "session.held"
    SUMMARY_CLAIMED = "summary.claimed"
    SUMMARY_STAGED = "summary.staged"
    SUMMARY_COMPLETED = "summary.completed"
    SUMMARY_FAILED = "summary.failed"
    SUMMARY_RELEASED = "summary.released"
    RECEIPT_REPLAYED = "receipt.replayed"
    RECEIPT_QUARANTINED = "receipt.quarantined"
    RECEIPT_VERIFIED = "receipt.verified"
    DREAM_COMPLETED = "dream.completed"
    DREAM_STALE = "dream.stale"
    DREAM_DEFERRED = "dream.deferred"
    DREAM_UNDIGESTIBLE = "dream.undigestible"
    DREAM_TAKEN_OVER = "dream.taken_over"
    DREAM_OVERLAY_MISSING = "dream.overlay_missing"
    DREAM_LEGACY_IMPORTED = "dream.legacy_imported"
    DREAM_LEGACY_SUPERSEDED = "dream.legacy_superseded"
    WORKER_STARTED = "worker.started"
    WORKER_DRAINING = "worker.draining"
    WORKER_STOPPED = "worker.stopped"
    OPERATOR_REPLAY = "operator.replay"
    OPERATOR_DRAIN = "operator.drain"
    OPERATOR_RELEASE = "operator.release"
    MEMORY_REINDEXED = "memory.reindexed"
    MEMORY_IMPORTED = "memory.imported"
    OPERATOR_RESUME = "operator.resume"


def operator_name() -> str:
    """The OS user acting, for the audit trail of operator actions."""
    try:
        return settings.operator or getpass.getuser()
    except Exception:  # getpass raises when no user name can be found at all
        return f"uid:{os.getuid()}"


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=str)  # reused: see sessions.dumps
EVENT_SQL = "INSERT INTO event (time, kind, actor, session_id, target, data) VALUES (?, ?, ?, ?, ?, ?)"


def _event_row(
    kind: EventKind | str,
    actor: str,
    session_id: str | None,
    target: str | None,
    data: dict[str, Any] | None,
    now: int | None,
) -> tuple[Any, ...]:
    return (
        clock.now_ms() if now is None else now,
        str(kind),
        actor,
        session_id,
        target,
        _ENCODER.encode(data or {}),
    )


async def append_event(
    conn: aiosqlite.Connection,
    *,
    kind: EventKind | str,
    actor: str,
    session_id: str | None = None,
    target: str | None = None,
    data: dict[str, Any] | None = None,
    now: int | None = None,
) -> int:
    """Append one journal row inside the caller's transaction; returns its id."""
    cursor = await conn.execute(EVENT_SQL, _event_row(kind, actor, session_id, target, data, now))
    try:
        return int(cursor.lastrowid or 0)
    finally:
        await cursor.close()


def append_event_sync(
    conn: Conn,
    *,
    kind: EventKind | str,
    actor: str,
    session_id: str | None = None,
    target: str | None = None,
    data: dict[str, Any] | None = None,
    now: int | None = None,
) -> int:
    """`append_event` for code already running on the connection's thread (`Database.write_in_thread`)."""
    cursor = conn.execute(EVENT_SQL, _event_row(kind, actor, session_id, target, data, now))
    return int(cursor.lastrowid or 0)


# A session's rows come by session (every row of an execution, a summary job or a
# Dream pass carries its session); by target only the rows without one (worker
# lifecycle, drains): the partial event_target_idx holds just those.
HISTORY_SQL = """
SELECT * FROM (SELECT id, time, kind, actor, session_id, target, data FROM event
               WHERE target = :target AND session_id IS NULL ORDER BY id DESC LIMIT :limit)
UNION
SELECT * FROM (SELECT id, time, kind, actor, session_id, target, data FROM event
               WHERE session_id = :session_id ORDER BY id DESC LIMIT :limit)
ORDER BY id DESC LIMIT :limit
"""


def decode_event(row: Any) -> dict[str, Any]:
    """One `event` row as a dict with its `data` JSON decoded (undecodable data kept raw)."""
    event = dict(row)
    try:
        event["data"] = json.loads(event.get("data") or "{}")
    except ValueError:
        event["data"] = {"raw": event.get("data")}
    return event


async def history(
    db: Any, *, session_id: str | None = None, target: str | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    """Journal rows about one session and/or one session-less target, newest first (two indexed lookups).

    A target that belongs to a session (an execution, a summary id) is found
    through its session: pass both.
    """
    if session_id is None and target is None:
        return []
    rows = await db.fetchall(HISTORY_SQL, {"target": target, "session_id": session_id, "limit": limit})
    return [decode_event(r) for r in rows]
