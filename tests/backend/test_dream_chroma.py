"""Dream and the shared Chroma summary row, on the real `chroma run` server."""

from __future__ import annotations

from backend.chroma import server as chroma_server
from backend.chroma.ownership import DREAM_OWNED_KEYS, SYNTHESIS_OWNED_KEYS, summary_row_id
from backend.core import clock
from backend.dream.digester import Dreamer, classify_drift, import_legacy, legacy_only_count, select_pending
from backend.dream.overlay import OVERLAY_MISSING_RETRY_MS, overlay_pending_count
from backend.runtime.context import Context
from tests.dreamkit import add_session_with_turns, add_turn, dream_row, synthesize

TEXTS = [
    "The Chroma Server uses SQLite for durable storage.",
    "Storage on SQLite is durable because of the WAL journal.",
]


async def _row(ctx: Context, sid: str) -> tuple[str | None, dict]:
    rows = await ctx.store().get([summary_row_id(sid)])
    assert summary_row_id(sid) in rows, f"no Chroma row for {sid}"
    return rows[summary_row_id(sid)]


async def test_a_resummarized_session_is_eligible_although_graph_digested_survives(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev_a, _, _ = await synthesize(db, ctx.store(), "s1")
    dreamer = Dreamer(ctx)
    assert await dreamer.run_pass() == 2  # one digestion, one overlay confirmed by read-back
    _, meta = await _row(ctx, "s1")
    state = await dream_row(db, "s1")
    assert (meta["graphDigested"], meta["digestState"], meta["dreamCompletedRevision"]) == (
        True,
        "digested",
        rev_a,
    )
    assert meta["dreamStateRevision"] == state["state_revision"] and state["overlay_pending"] == 0
    assert "deferReason" not in meta

    # new raw turns; synthesis re-summarizes and upserts its own keys only
    await add_turn(db, "s1", "s1-m0002", "Kafka now replaces Redis for events.", time=9_000)
    rev_b, document_b, synth_b = await synthesize(db, ctx.store(), "s1")
    assert rev_b != rev_a
    document, meta = await _row(ctx, "s1")
    # the witness: Chroma merged the upsert, so Dream's old overlay survived it
    assert (meta["graphDigested"], meta["digestState"]) == (True, "digested")
    assert (meta["dreamInputRevision"], meta["dreamCompletedRevision"]) == (rev_b, rev_a)
    # ... and yet the session is eligible: eligibility is revision equality in state.db
    assert [c.session_id for c in await select_pending(db, clock.now_ms())] == ["s1"]
    assert classify_drift(await dream_row(db, "s1")) == "stale_completion"

    assert await dreamer.run_pass() == 2
    document, meta = await _row(ctx, "s1")
    assert (meta["dreamCompletedRevision"], meta["graphDigested"], meta["digestState"]) == (
        rev_b,
        True,
        "digested",
    )
    assert document == document_b
    assert {k: meta[k] for k in SYNTHESIS_OWNED_KEYS} == synth_b  # never touched by Dream
    assert set(meta) == set(SYNTHESIS_OWNED_KEYS) | (set(DREAM_OWNED_KEYS) - {"deferReason"})
    assert await select_pending(db, clock.now_ms()) == []


async def test_dream_never_creates_a_missing_row_and_overlays_it_once_synthesis_writes_it(
    ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    from tests.dreamkit import publish, synthesis_metadata

    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev = await publish(db, "s1")  # published, but the Chroma row is not there (lost, or not yet written)
    dreamer = Dreamer(ctx)
    assert await dreamer.run_pass() == 1
    assert (await dream_row(db, "s1"))["completed_revision"] == rev  # state.db is the record
    assert await ctx.store().get([summary_row_id("s1")]) == {}
    row = await dream_row(db, "s1")
    assert (row["overlay_pending"], row["overlay_retry_at"]) == (
        1,
        frozen_clock.now + OVERLAY_MISSING_RETRY_MS,
    )
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'dream.overlay_missing'") == 1
    assert await dreamer.run_pass() == 0  # backing off, not hammering Chroma

    await ctx.store().upsert([summary_row_id("s1")], ["the summary"], [synthesis_metadata("s1", rev, 2)])
    frozen_clock.advance(OVERLAY_MISSING_RETRY_MS)
    assert await dreamer.run_pass() == 1
    _, meta = await _row(ctx, "s1")
    assert (meta["dreamCompletedRevision"], meta["digestState"]) == (rev, "digested")
    assert await overlay_pending_count(db) == 0
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'dream.overlay_missing'") == 1


async def test_digestion_goes_on_while_chroma_is_down_and_the_overlay_catches_up(
    ctx: Context, collection: str
) -> None:
    db = await ctx.db()
    for sid in ("s1", "s2"):
        await add_session_with_turns(db, sid, TEXTS)
        await synthesize(db, ctx.store(), sid)
    down = Context(
        ctx.data,
        chroma_url=f"http://127.0.0.1:{chroma_server.free_port()}",
        collection=collection,
        start_chroma=False,
    )
    try:
        dead = Dreamer(down)
        assert await dead.run_pass() == 2  # both digested; the overlay could not be written
        assert await overlay_pending_count(db) == 2
        assert await dead.run_pass() == 0  # backing off Chroma; nothing else to do
    finally:
        await down.close()
    for sid in ("s1", "s2"):
        assert (await dream_row(db, sid))["digest_state"] == "digested"
        assert "dreamCompletedRevision" not in (await _row(ctx, sid))[1]
    assert await Dreamer(ctx).run_pass() == 2
    assert await overlay_pending_count(db) == 0
    for sid in ("s1", "s2"):
        state = await dream_row(db, sid)
        _, meta = await _row(ctx, sid)
        assert meta["dreamCompletedRevision"] == state["completed_revision"]
        assert meta["dreamStateRevision"] == state["state_revision"]


async def test_legacy_rows_are_honoured_until_synthesis_publishes_a_revision(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "old", TEXTS)
    store = ctx.store()
    legacy_meta = {"sessionId": "old", "memoryCount": 2, "graphDigested": True, "digestState": "digested"}
    await store.upsert(
        [summary_row_id("old"), summary_row_id("ghost")],
        ["old summary", "ghost summary"],
        [legacy_meta, {**legacy_meta, "sessionId": "ghost"}],
    )
    assert await import_legacy(ctx) == {"scanned": 2, "marked": 1}  # "ghost" has no session in state.db
    assert await import_legacy(ctx) == {"scanned": 2, "marked": 0}  # idempotent
    assert await legacy_only_count(db) == 1
    row = await dream_row(db, "old")
    assert (row["digest_state"], row["legacy_digested"], classify_drift(row)) == ("legacy", 1, "legacy_only")
    dreamer = Dreamer(ctx)
    assert await dreamer.run_pass() == 0  # honoured as digested: no revision was ever published

    await add_turn(db, "old", "old-m0002", "A turn after the upgrade.", time=9_000)
    rev, _, _ = await synthesize(db, store, "old")
    assert await legacy_only_count(db) == 0
    assert [c.session_id for c in await select_pending(db, clock.now_ms())] == ["old"]
    assert await dreamer.run_pass() == 2
    _, meta = await _row(ctx, "old")
    assert (meta["dreamCompletedRevision"], meta["graphDigested"]) == (rev, True)
    assert (await dream_row(db, "old"))["legacy_digested"] == 0


async def test_the_daemon_can_scan_for_legacy_rows_when_it_starts(ctx: Context) -> None:
    db = await ctx.db()
    await add_session_with_turns(db, "old", TEXTS)
    await ctx.store().upsert([summary_row_id("old")], ["old summary"], [{"graphDigested": True}])
    assert await Dreamer(ctx, once=True, legacy_scan=True).run() == 0
    assert await legacy_only_count(db) == 1
    assert await db.scalar("SELECT count(*) FROM graph_node") == 0  # honoured, not re-digested
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'dream.legacy_imported'") == 1
