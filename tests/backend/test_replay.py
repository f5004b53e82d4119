"""Receipt recovery on a real Chroma server: ownership-aware, batched, CAS-finalized, idempotent."""

from __future__ import annotations

from typing import Any

import pytest

from backend import ops
from backend.chroma.collection import ChromaStore
from backend.chroma.embedder import HashingEmbedder
from backend.core.errors import BadInput, ChromaUnreachable, ReadOnly, ReceiptNotFound
from backend.runtime.context import Context
from backend.store.db import Database
from backend.summaries import receipt_replay, receipts
from backend.summaries.summarizer import Summarizer
from tests.counting_synthesizer import CountingSynthesizer
from tests.summaries import add_turn, all_jobs, base_metadata, job, row_id, seed_session, vector_of

# receipt replay on both engines
pytestmark = pytest.mark.both_stores

DREAM_OVERLAY = {"graphDigested": True, "digestState": "digested"}


async def summarize(ctx: Context, sessions: list[str]) -> Database:
    """Seed sessions and run one real summarizer pass over them."""
    db = await ctx.db()
    for sid in sessions:
        await seed_session(db, sid)
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
    return db


async def rows(ctx: Context, sessions: list[str]) -> dict[str, Any]:
    return await ctx.store().get([row_id(s) for s in sessions])


async def events(db: Database, kind: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await db.fetchall("SELECT * FROM event WHERE kind = ? ORDER BY id", (kind,))]


async def recover(
    ctx: Context,
    db: Database,
    *,
    everything: bool = True,
    store: ChromaStore | None = None,
    actor: str = "test-recovery",
) -> receipt_replay.Report:
    batches = (
        receipt_replay.all_batches(db, batch_size=2)
        if everything
        else receipt_replay.pending_batches(db, batch_size=2)
    )
    return await receipt_replay.Recovery(db, store or ctx.store(), actor=actor).run(batches)


def _receipt(j: dict[str, Any]) -> receipts.Receipt:
    return receipts.decode(j["result_envelope"], j["result_encoding"])


async def test_seed_incident_dream_overlays_are_present_not_replayed(ctx: Context) -> None:
    sessions = [f"s{i}" for i in range(5)]
    db = await summarize(ctx, sessions)
    before_jobs = await all_jobs(db)
    assert [j["status"] for j in before_jobs] == ["completed"] * 5
    await ctx.store().update_metadata([row_id("s1"), row_id("s3")], [DREAM_OVERLAY, DREAM_OVERLAY])

    report = await recover(ctx, db)

    c = report.counters
    assert (c.scanned, c.present, c.replayed, c.completed, c.mismatched, c.quarantined) == (5, 5, 0, 5, 0, 0)
    assert report.ok and report.rows_written == 0
    after = await rows(ctx, sessions)
    for sid in ("s1", "s3"):
        assert {k: after[row_id(sid)][1][k] for k in DREAM_OVERLAY} == DREAM_OVERLAY
    assert await all_jobs(db) == before_jobs  # nothing absorbed into the receipts, nothing rewritten
    for j in before_jobs:
        assert not set(DREAM_OVERLAY) & set(_receipt(j).metadata)
        assert j["result_last_replayed_at"] is None
    assert await events(db, "receipt.replayed") == []


async def test_the_operator_replay_of_the_incident_completes_and_journals(ctx: Context) -> None:
    db = await summarize(ctx, ["s0", "s1", "s2", "s3", "s4"])
    await ctx.store().update_metadata([row_id("s0"), row_id("s4")], [DREAM_OVERLAY, DREAM_OVERLAY])
    result = await ops.replay(ctx, all_mismatched=True)
    assert result["ok"] is True
    assert result["counters"]["present"] == 5 and result["counters"]["replayed"] == 0
    (event,) = await events(db, "operator.replay")
    assert event["actor"] == ctx.operator
    assert '"present":5' in event["data"] and '"targets":"all"' in event["data"]


async def _damage(ctx: Context, sid: str, how: str) -> None:
    store = ctx.store()
    rid = row_id(sid)
    document, _ = (await store.get([rid]))[rid]
    if how == "missing_row":
        await store.delete([rid])
    elif how == "changed_document":
        await store.upsert([rid], [document + " (edited)"], [{"sessionId": sid}])
    elif how == "missing_owned_key":
        await store.update_metadata([rid], [{"title": None}])
    elif how == "changed_owned_value":
        await store.update_metadata([rid], [{"category": "something else"}])
    elif how == "int_became_float":
        await store.update_metadata([rid], [{"memoryCount": 6.0}])
    elif how == "int_became_bool":
        await store.update_metadata([rid], [{"memoryCount": True}])
    elif how == "list_changed":
        await store.update_metadata([rid], [{"keywords": ["other"]}])


DAMAGE = {
    "missing_row": receipts.ReceiptVerdict.MISSING,
    "changed_document": receipts.ReceiptVerdict.DOCUMENT_DIFFERS,
    "missing_owned_key": receipts.ReceiptVerdict.KEYS_DIFFER,
    "changed_owned_value": receipts.ReceiptVerdict.KEYS_DIFFER,
    "int_became_float": receipts.ReceiptVerdict.KEYS_DIFFER,
    "int_became_bool": receipts.ReceiptVerdict.KEYS_DIFFER,
    "list_changed": receipts.ReceiptVerdict.KEYS_DIFFER,
}


@pytest.mark.parametrize("how", list(DAMAGE))
async def test_owned_mismatches_are_replayed_and_read_back(ctx: Context, how: str) -> None:
    db = await summarize(ctx, ["s1", "s2"])
    await ctx.store().update_metadata([row_id("s1")], [{**DREAM_OVERLAY, "futureKey": 3}])
    await _damage(ctx, "s1", how)
    receipt = _receipt(await job(db, "s1"))
    assert receipts.verify(receipt, (await rows(ctx, ["s1"])).get(row_id("s1"))).verdict == DAMAGE[how]

    report = await recover(ctx, db)

    c = report.counters
    assert (c.present, c.mismatched, c.replayed, c.completed, c.unverified) == (1, 1, 1, 2, 0)
    document, metadata = (await rows(ctx, ["s1"]))[row_id("s1")]
    assert receipts.is_present(receipt, (document, metadata))
    if how != "missing_row":  # a deleted row takes its foreign keys with it; replay cannot know them
        assert metadata["graphDigested"] is True and metadata["futureKey"] == 3
    j1, j2 = await job(db, "s1"), await job(db, "s2")
    assert j1["result_last_replayed_at"] is not None and j1["verdict"] == "present"
    assert j1["owner_id"] is None and j1["lease_expires_at"] is None and j1["epoch"] == 2
    assert j2["result_last_replayed_at"] is None  # only rows this pass re-wrote
    (event,) = await events(db, "receipt.replayed")
    assert event["target"] == row_id("s1") and DAMAGE[how] in event["data"]


async def test_recovery_goes_on_past_enriched_rows_and_a_corrupt_envelope(ctx: Context) -> None:
    sessions = [f"s{i}" for i in range(6)]
    db = await summarize(ctx, sessions)
    await ctx.store().update_metadata([row_id(s) for s in ("s0", "s2", "s4")], [DREAM_OVERLAY] * 3)
    garbage = b'{"v":1,"document":"trunc'
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET result_envelope = ? WHERE session_id = 's1'", (garbage,))
    await ctx.store().delete([row_id("s5")])

    report = await recover(ctx, db)

    c = report.counters
    assert (c.scanned, c.present, c.replayed, c.quarantined, c.completed) == (6, 4, 1, 1, 5)
    assert not report.ok
    j1 = await job(db, "s1")
    assert j1["result_envelope"] == garbage  # kept byte for byte
    assert j1["quarantined_at"] is not None and j1["verdict"] == "quarantined"
    assert "not valid UTF-8 JSON" in j1["quarantine_reason"]
    (event,) = await events(db, "receipt.quarantined")
    assert event["target"] == row_id("s1") and "envelope_b64" in event["data"]
    assert receipts.is_present(_receipt(await job(db, "s5")), (await rows(ctx, ["s5"]))[row_id("s5")])
    shown = (await ops.status(ctx))["receipts"]
    (mismatch,) = shown["mismatched"]
    assert (mismatch["summary_id"], mismatch["verdict"]) == (row_id("s1"), "quarantined")
    assert "not valid UTF-8 JSON" in mismatch["quarantine_reason"]
    again = await recover(ctx, db)  # still shown, not re-journaled
    assert again.counters.quarantined == 1 and again.rows_written == 0
    assert len(await events(db, "receipt.quarantined")) == 1


async def test_a_second_pass_writes_nothing(ctx: Context) -> None:
    sessions = ["s1", "s2", "s3"]
    db = await summarize(ctx, sessions)
    await _damage(ctx, "s2", "changed_owned_value")
    await ctx.store().update_metadata([row_id("s3")], [DREAM_OVERLAY])
    first = await recover(ctx, db)
    assert first.counters.replayed == 1
    jobs, chroma = (
        await all_jobs(db),
        await ctx.store().get([row_id(s) for s in sessions], include_embeddings=True),
    )
    event_count = await db.scalar("SELECT count(*) FROM event")

    second = await recover(ctx, db)

    c = second.counters
    assert (c.scanned, c.present, c.replayed, c.completed) == (3, 3, 0, 3)
    assert second.rows_written == 0
    assert await all_jobs(db) == jobs
    assert await ctx.store().get([row_id(s) for s in sessions], include_embeddings=True) == chroma
    assert await db.scalar("SELECT count(*) FROM event") == event_count


async def test_dry_run_shows_the_diff_and_writes_nothing(
    ctx: Context, chroma_url: str, collection: str
) -> None:
    db = await summarize(ctx, ["s1", "s2", "s3"])
    await _damage(ctx, "s1", "int_became_float")
    await _damage(ctx, "s2", "missing_row")
    jobs, chroma = await all_jobs(db), await rows(ctx, ["s1", "s2", "s3"])
    event_count = await db.scalar("SELECT count(*) FROM event")
    read_only = Context(ctx.data, chroma_url=chroma_url, collection=collection, read_only=True)
    try:
        result = await ops.replay(read_only, all_mismatched=True, dry_run=True)
    finally:
        await read_only.close()

    assert result["dry_run"] and result["counters"]["mismatched"] == 2 and result["counters"]["replayed"] == 0
    by_id = {r["summary_id"]: r for r in result["rows"]}
    assert by_id[row_id("s2")]["outcome"] == "would_replay" and by_id[row_id("s2")]["verdict"] == "missing"
    (key,) = by_id[row_id("s1")]["keys"]
    assert (key["key"], key["reason"], key["expected"], key["actual"]) == (
        "memoryCount",
        "type_differs",
        6,
        6.0,
    )
    assert await all_jobs(db) == jobs
    assert await rows(ctx, ["s1", "s2", "s3"]) == chroma
    assert await db.scalar("SELECT count(*) FROM event") == event_count


async def test_unacknowledged_receipt_is_completed_without_the_model(ctx: Context) -> None:
    db = await summarize(ctx, ["s1"])
    async with db.tx() as conn:  # as if the summarizer died between the Chroma write and acknowledge
        await conn.execute(
            "UPDATE summary_job SET status = 'in_progress', result_acknowledged_at = NULL, "
            "summarized_revision = NULL, verdict = NULL, owner_id = 'dead', lease_expires_at = 1"
        )
        await conn.execute("UPDATE dream_state SET input_revision = NULL")
    report = await recover(ctx, db, everything=False)
    assert (report.counters.acknowledged, report.counters.replayed) == (1, 0)
    j = await job(db, "s1")
    revision = _receipt(j).revision
    assert (j["status"], j["summarized_revision"], j["verdict"], j["owner_id"]) == (
        "completed",
        revision,
        "present",
        None,
    )
    assert j["result_last_replayed_at"] is None
    assert await db.scalar("SELECT input_revision FROM dream_state WHERE session_id = 's1'") == revision


async def test_rows_with_a_live_lease_are_skipped(ctx: Context) -> None:
    db = await summarize(ctx, ["s1"])
    await ctx.store().delete([row_id("s1")])
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET owner_id = 'summarizer-x', lease_expires_at = 9e15")
    before = await all_jobs(db)
    report = await recover(ctx, db)
    assert (report.counters.skipped_active, report.counters.replayed) == (1, 0)
    assert await all_jobs(db) == before and await rows(ctx, ["s1"]) == {}


class RestagingStore(ChromaStore):
    """A real ChromaStore that lets a 'summarizer' re-stage one row right after recovery reads Chroma."""

    def __init__(self, inner: ChromaStore, db: Database, session_id: str) -> None:
        super().__init__(lambda: inner.url or "", collection=inner.collection_name)
        self._collection = inner._collection
        self.db, self.session_id, self.fired = db, session_id, False

    async def rows(self, ids: Any) -> Any:
        result = await super().rows(ids)
        if not self.fired:
            self.fired = True
            metadata = base_metadata(self.session_id, dreamInputRevision="sha256:newer")
            envelope = receipts.encode(
                receipts.issue("newer synthesis", metadata, embedding=vector_of("newer synthesis"))
            )
            async with self.db.tx() as conn:
                await conn.execute(
                    "UPDATE summary_job SET result_envelope = ?, result_staged_at = result_staged_at + 1 "
                    "WHERE session_id = ?",
                    (envelope, self.session_id),
                )
        return result


@pytest.mark.parametrize("damaged", [False, True])
async def test_a_row_restaged_meanwhile_is_superseded_not_overwritten(ctx: Context, damaged: bool) -> None:
    db = await summarize(ctx, ["s1"])
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET result_acknowledged_at = NULL, status = 'in_progress'")
    if damaged:
        await ctx.store().delete([row_id("s1")])
    await ctx.store().count()  # connect, so the wrapper can share the collection
    store = RestagingStore(ctx.store(), db, "s1")

    report = await recover(ctx, db, store=store)

    assert (report.counters.superseded, report.counters.completed, report.counters.replayed) == (1, 0, 0)
    j = await job(db, "s1")
    assert _receipt(j).document == "newer synthesis" and j["result_acknowledged_at"] is None
    assert j["owner_id"] is None  # the replay never leased it
    assert (await rows(ctx, ["s1"])).get(row_id("s1"), (None,))[0] != "newer synthesis"


async def test_named_replay_checks_ids_before_anything(ctx: Context) -> None:
    db = await summarize(ctx, ["s1"])
    with pytest.raises(ReceiptNotFound, match="summary_nope"):
        await ops.replay(ctx, ["summary_s1", "summary_nope"])
    with pytest.raises(BadInput, match="summary_<session_id>"):
        await ops.replay(ctx, ["s1"])
    with pytest.raises(BadInput, match="--all"):
        await ops.replay(ctx, None)
    with pytest.raises(BadInput, match="not both"):
        await ops.replay(ctx, ["summary_s1"], all_mismatched=True)
    assert await events(db, "operator.replay") == []
    result = await ops.replay(ctx, ["summary_s1"])
    assert [r["outcome"] for r in result["rows"]] == ["present"]


async def test_read_only_refuses_a_replay(ctx: Context, chroma_url: str, collection: str) -> None:
    await summarize(ctx, ["s1"])
    read_only = Context(ctx.data, chroma_url=chroma_url, collection=collection, read_only=True)
    try:
        with pytest.raises(ReadOnly, match="replay"):
            await ops.replay(read_only, all_mismatched=True)
    finally:
        await read_only.close()


async def test_chroma_down_changes_nothing(ctx: Context, collection: str) -> None:
    db = await summarize(ctx, ["s1"])
    await ctx.store().delete([row_id("s1")])
    before = await all_jobs(db)
    dead = Context(ctx.data, chroma_url="http://127.0.0.1:9", collection=collection)
    try:
        with pytest.raises(ChromaUnreachable, match="127.0.0.1:9"):
            await ops.replay(dead, all_mismatched=True)
    finally:
        await dead.close()
    assert await all_jobs(db) == before
    assert await events(db, "operator.replay") == []


class DroppingStore(ChromaStore):
    """Fault injection around the real store: the server 'loses' upserts (reads stay real)."""

    def __init__(self, inner: ChromaStore) -> None:
        super().__init__(lambda: inner.url or "", collection=inner.collection_name)
        self._collection = inner._collection

    async def upsert(self, *args: Any, **kwargs: Any) -> None:
        return None


async def test_a_row_that_does_not_verify_after_replay_is_reported_and_retried_later(
    ctx: Context, frozen_clock: Any
) -> None:
    db = await summarize(ctx, ["s1"])
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET result_acknowledged_at = NULL, status = 'in_progress'")
    await ctx.store().delete([row_id("s1")])
    await ctx.store().count()

    report = await recover(ctx, db, everything=False, store=DroppingStore(ctx.store()))

    c = report.counters
    assert (c.replayed, c.unverified, c.completed, c.acknowledged) == (1, 1, 0, 0) and not report.ok
    j = await job(db, "s1")
    assert (j["status"], j["verdict"], j["owner_id"], j["result_acknowledged_at"]) == (
        "pending",
        "missing",
        None,
        None,
    )
    assert j["result_last_replayed_at"] == frozen_clock.now
    assert (await recover(ctx, db, everything=False)).counters.scanned == 0  # backing off, no hot loop
    frozen_clock.advance(receipt_replay.RETRY_AFTER_MS)
    again = await recover(ctx, db, everything=False)
    assert (again.counters.replayed, again.counters.acknowledged, again.ok) == (1, 1, True)
    assert (await job(db, "s1"))["status"] == "completed"


class MirroredEmbedder(HashingEmbedder):
    """Another embedder of the same dimension: what a changed REM_EMBEDDER writes."""

    name = "mirrored"

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[-v for v in vector] for vector in super().embed(texts)]


async def test_a_vector_the_embedder_no_longer_reproduces_is_unverified_and_says_why(
    ctx: Context, chroma_url: str
) -> None:
    db = await summarize(ctx, ["s1"])
    forged = [0.0] * 256
    forged[3] = 1.0
    await ctx.store()._run(lambda c: c.update(ids=[row_id("s1")], embeddings=[forged]))
    # an embedder whose output changed under the same record (a remote model updated behind its
    # name): the collection's embedder check cannot see it, the receipt's vector record does
    changed = ChromaStore(
        lambda: chroma_url, embedder=MirroredEmbedder(), collection=ctx.collection, check_embedder=False
    )
    report = await recover(ctx, db, store=changed)
    assert report.counters.unverified == 1
    (row,) = [r for r in report.rows if r["outcome"] == "unverified"]
    assert "no longer reproduces the vector this receipt attests" in row["reason"]
    assert [k["key"] for k in row["keys"]] == ["embedding"]
    report = await recover(ctx, db)  # with the embedder that wrote it, replay restores the vector
    assert report.counters.unverified == 0
    assert (await recover(ctx, db)).counters.present == 1


async def test_check_on_a_live_system_does_not_report_a_receipt_that_moved_on_while_it_read(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rem check` beside `rem up --load` reported invariant-2 violations every run: a synthesis
    staged, wrote and acknowledged a newer summary between the check reading a receipt and reading
    its Chroma row, so the row was newer than the receipt it was compared with."""
    db = await summarize(ctx, ["s1", "s2"])
    original = ChromaStore.rows
    raced = 0

    async def a_synthesis_lands_first(self: ChromaStore, ids: Any) -> Any:
        nonlocal raced
        if not raced and row_id("s1") in ids:
            raced += 1
            await add_turn(db, "s1", "And the rollback plan?", "Keep the previous build warm.", now=9_000)
            await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
            assert (await job(db, "s1"))["result_acknowledged_at"] is not None
        return await original(self, ids)

    monkeypatch.setattr(ChromaStore, "rows", a_synthesis_lands_first)
    report = await ops.check(ctx)
    assert raced == 1
    assert _receipt_violations(report) == [], report["violations"]
    # a row that really differs from its current receipt is still a violation, after the second look
    rid = row_id("s2")
    row = (await ctx.store().get([rid]))[rid]
    await ctx.store().upsert([rid], [str(row.document) + " (edited)"], [{"sessionId": "s2"}])
    report = await ops.check(ctx)
    assert [r["session_id"] for r in _receipt_violations(report)] == ["s2"], report["violations"]


def _receipt_violations(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of invariant 2's receipt finding (the seeded sessions break other invariants on purpose)."""
    return [
        row
        for v in report["violations"]
        if v["what"] == "acknowledged receipts whose Chroma row does not match"
        for row in v["rows"]
    ]
