"""The summarizer daemon in-process, against a real Chroma server."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from backend.chroma.embedder import WordLlamaEmbedder
from backend.core.errors import ChromaUnreachable
from backend.runtime.context import Context
from backend.store.revision import raw_revision
from backend.summaries import receipt_replay, receipts
from backend.summaries.summarizer import DRIFTED_SQL, MAX_ATTEMPTS, Summarizer
from backend.summaries.synthesizer import Synthesis, Turn
from tests.counting_synthesizer import CountingSynthesizer
from tests.summaries import add_turn, job, row_id, seed_session

# summaries, receipts and Dream on both engines
pytestmark = pytest.mark.both_stores


async def run_once(ctx: Context, synthesizer: object | None = None) -> CountingSynthesizer:
    counting = synthesizer or CountingSynthesizer()
    await Summarizer(ctx, once=True, synthesizer=counting).run()  # type: ignore[arg-type]
    return counting  # type: ignore[return-value]


async def test_a_drifted_session_is_summarized_into_chroma(ctx: Context) -> None:
    db = await ctx.db()
    await seed_session(db, "s1")
    synth = await run_once(ctx)
    assert synth.calls == ["s1"]

    got = await ctx.store().get([row_id("s1")], include_embeddings=True)
    document, metadata = got[row_id("s1")]
    async with db.snapshot() as conn:
        revision, turns = await raw_revision(conn, "s1")
    assert "restart the payments service" in document and len(turns) == 6
    assert metadata["sessionId"] == "s1" and metadata["memoryCount"] == 6
    assert metadata["dreamInputRevision"] == revision and type(metadata["timestamp"]) is int
    assert metadata["summarizer"] == synth.name and metadata["keywords"] and metadata["title"]
    raw = await ctx.store()._run(lambda c: c.get(ids=[row_id("s1")], include=["embeddings"]))
    # the default embedder wrote the vector (WordLlama, from its wheel), and the collection records it
    assert ctx.store().embedder.name == WordLlamaEmbedder.name
    assert list(raw["embeddings"][0]) == pytest.approx(WordLlamaEmbedder().embed([document])[0], abs=1e-5)
    recorded = await ctx.store()._run(lambda c: c.metadata)
    assert (recorded["rem:embedder"], recorded["rem:dim"]) == (WordLlamaEmbedder.name, 256)

    j = await job(db, "s1")
    assert (j["status"], j["verdict"], j["summarized_revision"], j["clean_seq"]) == (
        "completed",
        "present",
        revision,
        1,
    )
    receipt = receipts.decode(j["result_envelope"], j["result_encoding"])
    assert receipt.document == document and receipts.is_present(receipt, (document, metadata))
    assert j["result_acknowledged_at"] >= j["result_staged_at"]
    assert await db.scalar("SELECT input_revision FROM dream_state WHERE session_id = 's1'") == revision
    kinds = [r[0] for r in await db.fetchall("SELECT kind FROM event WHERE session_id = 's1' ORDER BY id")]
    assert kinds == ["summary.claimed", "summary.staged", "summary.completed"]


async def test_drift_is_decided_by_revision_not_by_count(ctx: Context) -> None:
    db = await ctx.db()
    await seed_session(db, "s1")
    await run_once(ctx)
    await ctx.store().update_metadata([row_id("s1")], [{"graphDigested": True, "digestState": "digested"}])
    first = await job(db, "s1")
    async with db.tx() as conn:  # a change that leaves the turns as they were
        await conn.execute("UPDATE summary_job SET dirty_seq = dirty_seq + 2")

    synth = await run_once(ctx)

    assert synth.calls == []
    again = await job(db, "s1")
    assert again["clean_seq"] == again["dirty_seq"] == 3
    assert again["result_envelope"] == first["result_envelope"] and again["epoch"] == first["epoch"]

    await add_turn(
        db, "s1", "And how do I roll back?", "Run the rollback job, then check the latency alert.", 50_000
    )
    synth = await run_once(ctx)
    assert synth.calls == ["s1"]
    j = await job(db, "s1")
    async with db.snapshot() as conn:
        revision, _ = await raw_revision(conn, "s1")
    assert j["summarized_revision"] == revision != first["summarized_revision"]
    _, metadata = (await ctx.store().get([row_id("s1")]))[row_id("s1")]
    assert metadata["memoryCount"] == 8 and metadata["dreamInputRevision"] == revision
    assert metadata["graphDigested"] is True  # Dream's keys survive re-synthesis
    assert await db.scalar("SELECT input_revision FROM dream_state") == revision


async def test_a_lost_lease_stages_and_writes_nothing(ctx: Context) -> None:
    db = await ctx.db()
    await seed_session(db, "s1")
    summarizer = Summarizer(ctx, synthesizer=CountingSynthesizer())
    summarizer.db = db
    claim = await summarizer._claim_or_clean("s1")
    async with db.tx() as conn:  # another summarizer took the lease over meanwhile
        await conn.execute("UPDATE summary_job SET owner_id = 'other', epoch = epoch + 1")
    await summarizer.summarize_claimed(claim)  # type: ignore[arg-type]
    j = await job(db, "s1")
    assert j["result_envelope"] is None and j["owner_id"] == "other"
    assert await ctx.store().get([row_id("s1")]) == {}


class FailingSynthesizer(CountingSynthesizer):
    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis:
        self.calls.append(session_id)
        raise RuntimeError("model unavailable")


async def test_a_failing_model_is_retried_with_backoff_then_parked(ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    db = await ctx.db()
    await seed_session(db, "s1")
    failing = FailingSynthesizer()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        await run_once(ctx, failing)
        assert len(failing.calls) == attempt
        await run_once(ctx, failing)  # inside the backoff window: not retried
        assert len(failing.calls) == attempt
        frozen_clock.advance(10 * 60_000)
    j = await job(db, "s1")
    assert (j["status"], j["attempts"], j["clean_seq"]) == ("failed", MAX_ATTEMPTS, j["dirty_seq"])
    assert "model unavailable" in j["last_error"]
    await run_once(ctx, failing)
    assert len(failing.calls) == MAX_ATTEMPTS  # parked until the turns change


@pytest.mark.sqlite_only  # SQLite's EXPLAIN QUERY PLAN
async def test_drift_and_recovery_selections_use_their_partial_indexes(ctx: Context) -> None:
    db = await ctx.db()
    for sql, index in (
        (DRIFTED_SQL, "summary_job_drift_idx"),
        (receipt_replay.PENDING_SQL, "summary_job_unacked_idx"),
    ):
        plan = " ".join(
            str(tuple(r))
            for r in await db.fetchall(
                "EXPLAIN QUERY PLAN " + sql, {"now": 0, "n": 1, "staged": 0, "sid": ""}
            )
        )
        assert index in plan, plan


async def test_chroma_down_at_the_write_keeps_the_receipt_for_recovery(ctx: Context, collection: str) -> None:
    db = await ctx.db()
    await seed_session(db, "s1")
    dead = Context(ctx.data, chroma_url="http://127.0.0.1:9", collection=collection)
    synth = CountingSynthesizer()
    try:
        with pytest.raises(ChromaUnreachable):
            await Summarizer(dead, once=True, synthesizer=synth).run()
    finally:
        await dead.close()
    j = await job(db, "s1")
    assert synth.calls == ["s1"] and j["result_envelope"] is not None
    assert (j["status"], j["owner_id"], j["lease_expires_at"], j["result_acknowledged_at"]) == (
        "pending",
        None,
        None,
        None,
    )

    again = await run_once(ctx)  # Chroma is back: recovery replays, the model is not called

    assert again.calls == []
    j = await job(db, "s1")
    assert (j["status"], j["verdict"], j["clean_seq"]) == ("completed", "present", j["dirty_seq"])
    assert j["result_last_replayed_at"] is not None
    receipt = receipts.decode(j["result_envelope"])
    assert receipts.is_present(receipt, (await ctx.store().get([row_id("s1")]))[row_id("s1")])


class UntitledSynthesizer(CountingSynthesizer):
    """A plug-in that leaves the title and category out of its synthesis."""

    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis:
        synthesis = await super().synthesize(session_id, turns)
        return Synthesis(synthesis.document, None, None, synthesis.keywords)  # type: ignore[arg-type]


async def test_a_synthesis_missing_required_owned_keys_issues_no_receipt(ctx: Context) -> None:
    db = await ctx.db()
    await seed_session(db, "s1")
    await run_once(ctx, UntitledSynthesizer())
    j = await job(db, "s1")
    assert j["result_envelope"] is None and j["result_staged_at"] is None
    assert "ReceiptIncomplete" in j["last_error"] and "missing ['title', 'category']" in j["last_error"]
    assert await ctx.store().get([row_id("s1")]) == {}
    kinds = [r[0] for r in await db.fetchall("SELECT kind FROM event WHERE session_id = 's1' ORDER BY id")]
    assert kinds == ["summary.claimed", "summary.failed"]
