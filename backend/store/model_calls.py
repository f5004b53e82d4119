"""Model request attempts into state.db: one `model_call` row each, and a journal row per failure.

The records come from `backend.models.health`'s buffer. The executor writes
the ones its step made in the same transaction as the step's completion;
every daemon writes whatever is left on its heartbeat. Rows older than the
journal's retention are pruned with it (`backend.store.maintenance`).
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.models import health
from backend.models.health import CallRecord
from backend.store.db import Conn, Database
from backend.store.events import EventKind, append_event_sync

INSERT_SQL = """
INSERT INTO model_call (time, owner_id, kind, endpoint, model, session_id, attempt, outcome, status,
                        ttft_ms, duration_ms, tokens_in, tokens_out, retry_after_ms, error)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


def write_calls_sync(conn: Conn, calls: Sequence[CallRecord], owner_id: str) -> None:
    """Insert the attempts and journal each failed one with its class (inside the caller's tx)."""
    conn.executemany(
        INSERT_SQL,
        [
            (
                c.time,
                owner_id,
                c.kind,
                c.endpoint,
                c.model,
                c.session_id,
                c.attempt,
                c.outcome,
                c.status,
                c.ttft_ms,
                c.duration_ms,
                c.tokens_in,
                c.tokens_out,
                c.retry_after_ms,
                c.error,
            )
            for c in calls
        ],
    )
    for c in calls:
        if c.outcome != health.OK:
            append_event_sync(
                conn,
                kind=EventKind.MODEL_ERROR,
                actor=owner_id,
                session_id=c.session_id,
                target=c.endpoint,
                now=c.time,
                data={
                    "class": c.outcome,
                    "kind": c.kind,
                    "model": c.model,
                    "attempt": c.attempt,
                    "status": c.status,
                    "retry_after_ms": c.retry_after_ms,
                    "error": c.error,
                },
            )


async def flush(db: Database, owner_id: str) -> int:
    """Write every buffered attempt in one transaction; returns how many (0 costs nothing)."""
    calls = health.take()
    if not calls:
        return 0
    try:
        await db.write_in_thread(lambda conn: write_calls_sync(conn, calls, owner_id))
    except BaseException:
        health.give_back(calls)
        raise
    return len(calls)
