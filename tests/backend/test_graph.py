"""Graph writes: idempotent per revision, replaced by difference and sweep, shared nodes kept while used."""

from __future__ import annotations

from typing import Any

from backend.dream import graph
from backend.dream.extractor import KeywordExtractor
from backend.runtime.context import Context
from tests.dreamkit import add_session, graph_snapshot


def _turns(sid: str, texts: list[str]) -> list[dict[str, Any]]:
    return [{"id": f"{sid}-{i}", "role": "user", "text": t, "time": i} for i, t in enumerate(texts)]


async def _write(ctx: Context, sid: str, revision: str, texts: list[str], chunk_rows: int = 4) -> int:
    """Write one revision of the session's graph; returns how many rows its transactions changed."""
    db = await ctx.db()
    turns = _turns(sid, texts)
    chunks = graph.plan_chunks(sid, sid, turns, KeywordExtractor().extract(turns), chunk_rows)
    changed = 0
    for chunk in chunks:
        async with db.tx() as conn:
            before = conn.total_changes
            await graph.write_chunk(conn, sid, revision, chunk, 1)
            changed += conn.total_changes - before
    async with db.tx() as conn:
        before = conn.total_changes
        await graph.sweep_session(conn, sid, graph.plan_keys(chunks))
        changed += conn.total_changes - before
    return changed


async def test_rewriting_a_revision_changes_nothing(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session(db, "a")
    texts = ["Kafka feeds Postgres.", "Postgres stores events durably.", "events events"]
    await _write(db_ctx, "a", "r1", texts)
    first = await graph_snapshot(db)
    await _write(db_ctx, "a", "r1", texts, chunk_rows=1)
    assert await graph_snapshot(db) == first
    nodes, edges = first
    assert len({n[0] for n in nodes}) == len(nodes) and len(set(edges)) == len(edges)
    assert ("turn:a-1", "turn:a-0", "follows", "a", 1.0, "r1") in edges


async def test_a_new_revision_replaces_the_sessions_rows_but_keeps_shared_nodes_in_use(
    db_ctx: Context,
) -> None:
    db = await db_ctx.db()
    await add_session(db, "a")
    await add_session(db, "b")
    await _write(db_ctx, "a", "r1", ["We run Kafka with Postgres.", "We cache with Redis."])
    await _write(db_ctx, "b", "r1", ["They say Kafka is fast."])
    await _write(db_ctx, "a", "r2", ["We run Kafka with Postgres."])  # the Redis turn was edited away
    nodes, edges = await graph_snapshot(db)
    ids = {n[0] for n in nodes}
    assert "turn:a-1" not in ids and "entity:redis" not in ids  # swept with the turn
    assert "entity:kafka" in ids  # still reached by a's r2 and by b
    assert {e[5] for e in edges if e[3] == "a"} == {"r1"}  # what r2 kept is not rewritten
    assert not any("turn:a-1" in e[:2] or "entity:redis" in e[:2] for e in edges)
    await _write(db_ctx, "a", "r3", ["Nothing named here."])
    ids = {n[0] for n in (await graph_snapshot(db))[0]}
    assert "entity:kafka" in ids and "entity:postgres" not in ids  # b still mentions Kafka


async def test_a_revision_that_adds_one_turn_writes_only_what_changed(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session(db, "a")
    texts = [f"Turn {i}: Kafka feeds Postgres and Redis caches service {i}." for i in range(60)]
    first = await _write(db_ctx, "a", "r1", texts)
    _, edges = await graph_snapshot(db)
    assert first >= len(edges) > 200
    more = await _write(db_ctx, "a", "r2", [*texts, "Turn 60: Kafka feeds Postgres."])
    # the new turn's node and edges plus the session node and a few changed weights: not a rewrite
    assert 0 < more < 20, more
    nodes, edges = await graph_snapshot(db)
    assert {e[5] for e in edges if "turn:a-60" in e[:2]} == {"r2"}
    assert sum(1 for e in edges if e[5] == "r1") > 200
    assert await _write(db_ctx, "a", "r2", [*texts, "Turn 60: Kafka feeds Postgres."]) == 0  # idempotent
