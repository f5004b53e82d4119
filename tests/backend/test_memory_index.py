"""The recall index of raw turns: written by Dream per revision, by difference, on a real Chroma."""

from __future__ import annotations

import dataclasses
import json

import pytest

from backend import ops
from backend.chroma.collection import ChromaStore
from backend.chroma.embedder import HashingEmbedder, WordLlamaEmbedder
from backend.core.errors import EmbedderMismatch
from backend.dream.digester import Dreamer
from backend.memory.index import load_raw_turns, load_session_meta, plan_session, unmark_overwritten
from backend.memory.text import fts_table
from backend.runtime.context import Context
from backend.store.revision import raw_revision
from tests.dreamkit import add_session_with_turns, add_turn, dream_row, publish
from tests.helpers import await_until

TEXTS = [
    "We moved the payments service to the new Kubernetes cluster last week.",
    "Did the migration keep the Postgres replicas in sync?",
    "Yes, the replicas caught up within a minute of the cutover.",
    "Then let us retire the old cluster on Friday.",
]


async def index_findings(ctx: Context) -> list[dict]:
    """What `rem check --settled` says about invariant 9 (dreamkit sessions have no admitted inputs)."""
    report = await ops.check(ctx, settled=True)
    assert "recall_index" in report["checked"]
    return [f for f in report["violations"] if f["invariant"] == "9"]


async def _index_rows(ctx: Context, sid: str) -> list[dict]:
    """Each index row with its lexical row (FTS5's body and ctx; PostgreSQL: the tsvector as `doc`)."""
    db = await ctx.db()
    if db.postgres:
        rows = await db.fetchall(
            "SELECT t.message_id, t.ord, t.role, t.digest, t.vector_digest, t.time_indexed, "
            "CAST(f.doc AS text) AS doc FROM memory_turn AS t JOIN memory_fts AS f ON f.id = t.id "
            "WHERE t.session_id = ? AND f.project = t.project ORDER BY t.ord",
            (sid,),
        )
        return [dict(r) for r in rows]
    table = fts_table(await db.scalar("SELECT project FROM session WHERE id = ?", (sid,)))
    rows = await db.fetchall(
        "SELECT t.message_id, t.ord, t.role, t.digest, t.vector_digest, t.time_indexed, f.body, f.ctx "
        f"FROM memory_turn AS t JOIN {table} AS f ON f.rowid = t.id "
        "WHERE t.session_id = ? ORDER BY t.ord",
        (sid,),
    )
    return [dict(r) for r in rows]


async def _delete_lexical_row(ctx: Context, message_id: str) -> None:
    db = await ctx.db()
    table = "memory_fts" if db.postgres else fts_table("default")
    key = "id" if db.postgres else "rowid"
    async with db.tx() as conn:
        await conn.execute(
            f"DELETE FROM {table} WHERE {key} = (SELECT id FROM memory_turn WHERE message_id = ?)",
            (message_id,),
        )


@pytest.mark.both_stores
async def test_dream_indexes_every_raw_turn_of_the_revision_in_fts5_and_chroma(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    revision = await publish(db, "s1")
    await Dreamer(ctx, once=True).run()

    rows = await _index_rows(ctx, "s1")
    assert [r["message_id"] for r in rows] == [f"s1-m{i:04d}" for i in range(4)]
    assert [r["role"] for r in rows] == ["user", "assistant", "user", "assistant"]
    assert all(r["vector_digest"] == r["digest"] for r in rows)  # vectors written and marked
    if db.postgres:  # the text stemmed (weight A), the previous turns (B), the scope tokens (D)
        doc = rows[2]["doc"]
        assert "'replica':" in doc and "A" in doc.split("'replica':")[1].split(" ")[0]
        assert "'kubernet':" in doc and doc.split("'kubernet':")[1].split(" ")[0].endswith("B")
        assert "'1970':" in doc  # the turn's date
    else:
        # the body carries the turn's date; ctx carries the previous turns (the LoCoMo findings)
        assert rows[2]["body"].endswith(TEXTS[2]) and rows[2]["body"].startswith("[1 January 1970]")
        assert rows[2]["ctx"] == f"{TEXTS[0]} {TEXTS[1]}"
    assert (await dream_row(db, "s1"))["indexed_revision"] == revision

    vectors = await ctx.turn_store("default").get([r["message_id"] for r in rows])
    assert sorted(vectors) == [r["message_id"] for r in rows]
    document, meta = vectors["s1-m0001"]
    assert document == TEXTS[1] and meta["sessionId"] == "s1" and meta["project"] == "default"
    assert await index_findings(ctx) == []


async def test_a_new_turn_rewrites_only_its_own_row(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    await Dreamer(ctx, once=True).run()
    before = {r["message_id"]: r for r in await _index_rows(ctx, "s1")}

    await add_turn(db, "s1", "s1-m0004", "Friday works; I will announce it.", time=2_000)
    revision = await publish(db, "s1")
    await Dreamer(ctx, once=True).run()
    after = {r["message_id"]: r for r in await _index_rows(ctx, "s1")}
    assert set(after) - set(before) == {"s1-m0004"}
    assert all(after[m]["time_indexed"] == before[m]["time_indexed"] for m in before)  # untouched
    assert after["s1-m0004"]["ctx"].startswith(TEXTS[1])  # the three turns before it
    assert (await dream_row(db, "s1"))["indexed_revision"] == revision
    assert await index_findings(ctx) == []


async def test_without_chroma_the_lexical_index_is_complete_and_vectors_wait(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    revision = await publish(db, "s1")
    await Dreamer(db_ctx, once=True).run()
    rows = await _index_rows(db_ctx, "s1")
    assert len(rows) == 4 and all(r["vector_digest"] is None for r in rows)
    assert (await dream_row(db, "s1"))["indexed_revision"] == revision
    status = await ops.status(db_ctx)
    assert status["backlog"]["index"]["vectors_pending"] == 4
    assert status["backlog"]["index"]["sessions_behind"] == 0


async def test_vectors_left_pending_are_flushed_once_chroma_answers(ctx: Context, data_dir) -> None:  # type: ignore[no-untyped-def]
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    offline = Context(data_dir, start_chroma=False, collection=ctx.collection)
    try:
        await Dreamer(offline, once=True).run()
    finally:
        await offline.close()
    assert (await ops.status(ctx))["backlog"]["index"]["vectors_pending"] == 4
    dreamer = Dreamer(ctx)
    await dreamer.open()
    await await_until(dreamer.flush_vectors, message="vectors flushed")
    assert (await ops.status(ctx))["backlog"]["index"]["vectors_pending"] == 0
    assert await index_findings(ctx) == []


async def test_a_collection_of_another_embedders_vectors_is_refused(ctx: Context) -> None:
    hashing = ChromaStore(ctx.chroma_url_now, HashingEmbedder(), collection=ctx.collection)
    await hashing.upsert(["a"], ["some text"], [{"k": 1}])
    wordllama = ChromaStore(ctx.chroma_url_now, WordLlamaEmbedder(), collection=ctx.collection)
    try:
        await wordllama.count()
    except EmbedderMismatch as exc:
        assert "holds rem-hashing-v1 vectors (256-d)" in str(exc) and "rem reindex" in str(exc)
    else:
        raise AssertionError("a collection of hashing vectors was used with WordLlama")


async def test_the_index_follows_the_revision_a_turn_edited_away(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    await Dreamer(ctx, once=True).run()
    async with db.tx() as conn:  # the last reply is superseded: it is no raw turn any more
        await conn.execute(
            "UPDATE session_message SET data = json_set(data, '$.status', 'superseded') WHERE id = 's1-m0003'"
        )
    revision = await publish(db, "s1")
    await Dreamer(ctx, once=True).run()
    assert [r["message_id"] for r in await _index_rows(ctx, "s1")] == ["s1-m0000", "s1-m0001", "s1-m0002"]
    assert "s1-m0003" not in await ctx.turn_store("default").get(["s1-m0003"])
    async with db.snapshot() as conn:
        assert (await raw_revision(conn, "s1"))[0] == revision
    assert await index_findings(ctx) == []


@pytest.mark.both_stores
async def test_rem_check_finds_a_turn_missing_from_the_index(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    await Dreamer(ctx, once=True).run()
    async with db.tx() as conn:
        await conn.execute("DELETE FROM memory_turn WHERE message_id = 's1-m0002'")
    findings = await index_findings(ctx)
    assert [(f["what"], f["rows"]) for f in findings] == [
        (
            "raw turns missing from the recall index at its revision",
            [{"session_id": "s1", "message_id": "s1-m0002"}],
        )
    ]


@pytest.mark.both_stores
async def test_check_reads_the_index_a_batch_of_sessions_at_a_time_and_finds_the_same(ctx: Context) -> None:
    """Invariant 9 in batches (one read per batch of sessions) finds what one whole read finds."""
    from backend.ops.checks import check_database_in_batches, check_database_sync, summarize

    db = await ctx.db()
    for sid in ("s1", "s2", "s3"):
        await add_session_with_turns(db, sid, TEXTS)
        await publish(db, sid)
    await Dreamer(ctx, once=True).run()
    await _delete_lexical_row(ctx, "s2-m0001")  # s2 loses a turn's FTS5 row, s3 a turn's index row
    async with db.tx() as conn:
        await conn.execute("DELETE FROM memory_turn WHERE message_id = 's3-m0000'")
    whole = summarize(await db.read_in_thread(check_database_sync), settled=False)
    batched = summarize(await check_database_in_batches(db, batch=1), settled=False)

    def rows_in_order(report: dict) -> dict:  # PostgreSQL returns unordered rows in any order
        for finding in report["violations"] + report["unsettled"]:
            finding["rows"] = sorted(finding["rows"], key=lambda r: json.dumps(r, sort_keys=True))
        return report

    assert rows_in_order(batched) == rows_in_order(whole)
    found = {f["what"]: f["rows"] for f in whole["violations"] if f["invariant"] == "9"}
    assert found == {
        "raw turns missing from the recall index at its revision": [
            {"session_id": "s3", "message_id": "s3-m0000"}
        ],
        "recall index rows without their FTS5 row": [{"session_id": "s2", "message_id": "s2-m0001"}],
    }


async def test_a_postgresql_index_from_before_v7_gets_its_lexical_rows_from_dream(
    pg_server: object, tmp_path: object, chroma_url: str, collection: str
) -> None:
    """v7 adds PostgreSQL's lexical rows: rows indexed before have none until Dream re-indexes them."""
    from backend.core.datadir import DataDir
    from backend.store.schema_pg import LEXICAL_BACKFILL
    from tests import pg

    name = pg.fresh_database(pg_server)  # type: ignore[arg-type]
    ctx = Context(
        DataDir(tmp_path / "d"),  # type: ignore[operator]
        chroma_url=chroma_url,
        collection=collection,
        db_url=pg_server.url(name),  # type: ignore[attr-defined]
    )
    try:
        db = await ctx.db()
        await add_session_with_turns(db, "s1", TEXTS)
        revision = await publish(db, "s1")
        await Dreamer(ctx, once=True).run()
        async with db.tx() as conn:  # the state a v6 database reaches v7 in: no lexical row
            await conn.execute("DELETE FROM memory_fts")
        found = {f["what"]: f["count"] for f in await index_findings(ctx)}
        assert found == {"recall index rows without their FTS5 row": 4}
        async with db.tx() as conn:  # what migration 7 runs after creating the table
            for statement in LEXICAL_BACKFILL.strip().split(";\n"):
                await conn.execute(statement)
        assert (await dream_row(db, "s1"))["indexed_revision"] is None
        await Dreamer(ctx, once=True).run()
        assert (await dream_row(db, "s1"))["indexed_revision"] == revision
        assert await db.scalar("SELECT count(*) FROM memory_fts") == 4
        assert await index_findings(ctx) == []
        result = await ops.recall(ctx, "replicas cutover", project="default", kinds=("turn",))
        assert result["items"][0]["message_id"] == "s1-m0002"
        assert "fts" in result["items"][0]["provenance"]["found_by"]
    finally:
        await ctx.close()
        pg.drop_database(pg_server, name)  # type: ignore[arg-type]


async def test_a_flush_that_embedded_an_older_digest_puts_its_rows_back_to_pending(db_ctx: Context) -> None:
    # Two Dream processes: flusher A embedded a row at its old digest; the row was re-indexed and
    # flusher B wrote and marked the new vector; A's upsert then landed last in Chroma. A's marking
    # transaction must not leave B's mark standing over A's older vector.
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    await Dreamer(db_ctx, once=True).run()
    async with db.snapshot() as conn:
        project, speakers = await load_session_meta(conn, "s1")
        planned = plan_session("s1", project, await load_raw_turns(conn, "s1"), speakers)
    current, other = planned[0], planned[1]
    async with db.tx() as conn:  # B marked both rows current
        await conn.execute("UPDATE memory_turn SET vector_digest = digest WHERE session_id = 's1'")
    stale = dataclasses.replace(current, digest="sha256:older")  # what A embedded
    async with db.tx() as conn:
        await unmark_overwritten(conn, [stale, other])
    rows = {r["message_id"]: r for r in await _index_rows(db_ctx, "s1")}
    assert rows[current.message_id]["vector_digest"] is None  # pending again: the next flush rewrites it
    assert rows[other.message_id]["vector_digest"] == rows[other.message_id]["digest"]  # A's was current
