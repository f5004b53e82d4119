"""Test data for the summarizer: sessions with raw turns, seeded straight into state.db."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any

from backend.chroma.embedder import Embedder, load_embedder
from backend.chroma.ownership import summary_row_id
from backend.core.settings import settings
from backend.store.db import Database
from backend.store.handoffs import mark_turns_changed
from backend.summaries import receipts

TOPICS = [
    (
        "How do I restart the payments service without dropping requests?",
        "Drain the node first, then restart the service. Watch the latency alert while it comes back.",
    ),
    (
        "Why does my python test fail with a traceback in the import?",
        "The module imports a function that was renamed. Fix the import and run the test again.",
    ),
    (
        "Can you draft an email to the team about the roadmap?",
        "Here is a draft email. It lists the milestones for this quarter and the deadline for each.",
    ),
]


async def seed_session(
    db: Database, session_id: str, turns: Sequence[tuple[str, str]] | None = None, *, start: int = 1_000
) -> None:
    """A session with user + completed assistant turns, queued for the summarizer."""
    turns = turns if turns is not None else TOPICS
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, title, time_created, time_updated) VALUES (?, '', ?, ?)",
            (session_id, start, start),
        )
        seq = 0
        for question, answer in turns:
            for kind, data in (
                ("user", {"text": question}),
                ("assistant", {"status": "completed", "text": answer}),
            ):
                seq += 1
                await conn.execute(
                    "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        f"{session_id}_m{seq:03d}",
                        session_id,
                        kind,
                        seq,
                        start + seq,
                        start + seq,
                        json.dumps(data),
                    ),
                )
        await conn.execute(
            "UPDATE session SET last_seq = ?, message_count = ? WHERE id = ?", (seq, seq, session_id)
        )
        await mark_turns_changed(conn, session_id, start)


async def add_turn(db: Database, session_id: str, question: str, answer: str, now: int) -> None:
    """Append one exchange to a session and bump its drift, as the executor would."""
    async with db.tx() as conn:
        seq = int(
            list(await conn.execute_fetchall("SELECT last_seq FROM session WHERE id = ?", (session_id,)))[0][
                0
            ]
        )
        for kind, data in (
            ("user", {"text": question}),
            ("assistant", {"status": "completed", "text": answer}),
        ):
            seq += 1
            await conn.execute(
                "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (f"{session_id}_m{seq:03d}", session_id, kind, seq, now + seq, now + seq, json.dumps(data)),
            )
        await conn.execute("UPDATE session SET last_seq = ? WHERE id = ?", (seq, session_id))
        await mark_turns_changed(conn, session_id, now)


async def job(db: Database, session_id: str) -> dict[str, Any]:
    row = await db.fetchone("SELECT * FROM summary_job WHERE session_id = ?", (session_id,))
    assert row is not None, session_id
    return dict(row)


async def all_jobs(db: Database) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetchall("SELECT * FROM summary_job ORDER BY session_id")]


async def stage_receipt(
    db: Database,
    session_id: str,
    document: str,
    metadata: dict[str, Any],
    *,
    now: int,
    acknowledged: bool = True,
) -> bytes:
    """Stage (and by default acknowledge) a receipt directly, as a finished synthesis leaves it."""
    envelope = receipts.encode(receipts.issue(document, metadata, embedding=vector_of(document)))
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (session_id, now, now),
        )
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, result_envelope, result_encoding, result_staged_at, "
            "result_acknowledged_at, summarized_revision, verdict, verdict_checked_at, time_created, time_updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                "completed" if acknowledged else "in_progress",
                envelope,
                receipts.ENCODING,
                now,
                now if acknowledged else None,
                metadata["dreamInputRevision"] if acknowledged else None,
                "present" if acknowledged else None,
                now if acknowledged else None,
                now,
                now,
            ),
        )
    return envelope


def vector_of(document: str) -> list[float]:
    """The configured embedder's vector for `document`, as the summarizer writes it."""
    return _embedder(settings.embedder).embed([document])[0]


def shared_embedder() -> Embedder:
    """The configured embedder, loaded once per test process (the `ctx` fixtures' Contexts take it:
    WordLlama's weights cost ~0.15 s a load, and a daemon loads them once for all its work)."""
    return _embedder(settings.embedder)


@cache
def _embedder(name: str) -> Embedder:
    """The embedder `name` (REM_EMBEDDER) loaded once per test process, as a daemon loads it once:
    loading WordLlama's weights took ~0.15 s a call (25 of the recovery property's 26 s)."""
    assert name == settings.embedder
    return load_embedder()


def base_metadata(session_id: str, **extra: Any) -> dict[str, Any]:
    """Synthesis-owned metadata of a plausible receipt."""
    return {
        "sessionId": session_id,
        "memoryCount": 6,
        "timestamp": 1_800_000_000_000,
        "title": f"About {session_id}",
        "category": "operations",
        "keywords": ["restart", "service"],
        "dreamInputRevision": f"sha256:{session_id:0>64}"[:71],
        "summarizer": "test",
        "project": "default",
        **extra,
    }


def row_id(session_id: str) -> str:
    return summary_row_id(session_id)
