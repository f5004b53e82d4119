"""Test helpers for Dream: write raw turns as the executor does, publish as synthesis does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from backend.chroma.collection import ChromaStore
from backend.chroma.ownership import summary_row_id
from backend.core import clock
from backend.store.db import Database, execute, fetchone
from backend.store.handoffs import mark_turns_changed, publish_input_revision
from backend.store.revision import raw_revision


async def add_session(db: Database, sid: str, title: str = "", now: int | None = None) -> None:
    now = clock.now_ms() if now is None else now
    async with db.tx() as conn:
        await execute(
            conn,
            "INSERT INTO session (id, title, time_created, time_updated) VALUES (?, ?, ?, ?)",
            (sid, title, now, now),
        )


async def add_turn(
    db: Database,
    sid: str,
    message_id: str,
    text: str,
    *,
    role: str = "user",
    time: int | None = None,
    status: str = "completed",
) -> None:
    """Land one raw turn the way the executor does (sequence, then drift mark, one transaction)."""
    now = clock.now_ms() if time is None else time
    data: dict[str, Any] = {"text": text}
    if role == "assistant":
        data["status"] = status
    async with db.tx() as conn:
        row = await fetchone(
            conn, "UPDATE session SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", (sid,)
        )
        assert row is not None
        await execute(
            conn,
            "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, "
            "data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (message_id, sid, role, row[0], now, now, json.dumps(data)),
        )
        await mark_turns_changed(conn, sid, now)


async def replace_text(db: Database, message_id: str, text: str) -> None:
    """Replace one turn's content (same id, same count), marking drift like the executor."""
    async with db.tx() as conn:
        row = await fetchone(conn, "SELECT session_id, data FROM session_message WHERE id = ?", (message_id,))
        assert row is not None
        data = json.loads(row["data"])
        data["text"] = text
        await execute(
            conn, "UPDATE session_message SET data = ? WHERE id = ?", (json.dumps(data), message_id)
        )
        await mark_turns_changed(conn, row["session_id"], clock.now_ms())


async def add_session_with_turns(db: Database, sid: str, texts: Sequence[str], start: int = 1_000) -> None:
    await add_session(db, sid, title=f"title of {sid}")
    for i, text in enumerate(texts):
        await add_turn(
            db, sid, f"{sid}-m{i:04d}", text, role="user" if i % 2 == 0 else "assistant", time=start + i
        )


async def publish(db: Database, sid: str, now: int | None = None) -> str:
    """Publish the session's current raw revision, as the summarizer does when synthesis is durable."""
    now = clock.now_ms() if now is None else now
    async with db.tx() as conn:
        revision, _ = await raw_revision(conn, sid)
        await publish_input_revision(conn, sid, revision, now)
        dirty = await fetchone(conn, "SELECT dirty_seq FROM summary_job WHERE session_id = ?", (sid,))
        await execute(
            conn,
            "UPDATE summary_job SET status = 'completed', summarized_revision = ?, "
            "clean_seq = ? WHERE session_id = ?",
            (revision, dirty[0] if dirty else 0, sid),
        )
    return revision


def synthesis_metadata(sid: str, revision: str, memory_count: int) -> dict[str, Any]:
    return {
        "sessionId": sid,
        "memoryCount": memory_count,
        "timestamp": 1_800_000_000_000,
        "title": f"title of {sid}",
        "category": "test",
        "keywords": "alpha,beta",
        "dreamInputRevision": revision,
        "summarizer": "test-extractive",
        "project": "default",
    }


async def synthesize(db: Database, store: ChromaStore, sid: str) -> tuple[str, str, dict[str, Any]]:
    """Write the summary row as synthesis would (document + owned keys), then publish."""
    async with db.snapshot() as conn:
        revision, turns = await raw_revision(conn, sid)
    document = "Summary: " + " / ".join(str(t["text"])[:40] for t in turns)
    metadata = synthesis_metadata(sid, revision, len(turns))
    await store.upsert([summary_row_id(sid)], [document], [metadata])
    await publish(db, sid)
    return revision, document, metadata


async def dream_row(db: Database, sid: str) -> dict[str, Any]:
    row = await db.fetchone("SELECT * FROM dream_state WHERE session_id = ?", (sid,))
    assert row is not None, f"no dream_state for {sid}"
    return dict(row)


def without_revisions(
    snapshot: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The graph's content (keys, labels, weights) without the revision that last wrote each row."""
    nodes, edges = snapshot
    return [n[:-1] for n in nodes], [e[:-1] for e in edges]


async def graph_snapshot(db: Database) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Nodes (id, kind, label, session, revision) and edges (src, dst, kind, session, weight, revision)."""
    nodes = await db.fetchall("SELECT id, kind, label, session_id, revision FROM graph_node ORDER BY id")
    edges = await db.fetchall(
        "SELECT src, dst, kind, session_id, weight, revision FROM graph_edge "
        "ORDER BY src, dst, kind, session_id"
    )
    return [tuple(r) for r in nodes], [tuple(r) for r in edges]
