"""`rem reindex`: rebuild every vector with the configured embedder, from state.db.

Chroma holds nothing the store does not (docs/architecture.md), so a reindex drops
each collection and writes it again, never asking a model:

* **summaries**: the collection is recreated with the embedder's record,
  each receipt's record of its vector is re-staged with the new embedder's
  vector for the same document (`receipt_replay.reissue_for_embedder`), and
  every staged receipt is replayed (the same verified, fenced, compare-and-
  swap path as `rem replay`: exact document and owned keys, read back).
  Rows that have no receipt (legacy rows written before receipts) are copied
  with their document and metadata first. Dream's keys are re-overlaid from
  `dream_state` (its system of record) by marking every overlay pending and
  flushing them.
* **turns**: the collection is recreated and every `memory_turn` row's
  vector is marked pending and written again (`backend.memory.index`).

A crash part way leaves rows missing or pending, never wrong: run it again
(the summarizer's sweep and Dream's flush also converge it meanwhile). Other
processes holding the dropped collection reconnect on their next call
(`ChromaStore` retries a vanished collection once).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from backend.chroma.collection import ChromaStore, Metadata
from backend.chroma.ownership import session_id_of
from backend.core import clock
from backend.dream.overlay import OVERLAY_BATCH, OVERLAY_SQL, settle_overlays, write_overlays
from backend.memory import index as memory_index
from backend.runtime.context import Context
from backend.store.events import EventKind, append_event
from backend.summaries import receipt_replay

PAGE = 500
Progress = Callable[[str, int], None]


async def reindex(ctx: Context, *, progress: Progress | None = None) -> dict[str, Any]:
    """Drop and rebuild the summary and turn collections with the configured embedder."""
    ctx.require_writable("reindex")
    db = await ctx.db()
    started = time.monotonic()
    embedder = ctx.embedder()
    summaries = await _rebuild_summaries(ctx, progress)
    turns = await _rebuild_turns(ctx, progress)
    result = {
        "embedder": embedder.name,
        "dim": embedder.dim,
        "summaries": summaries,
        "turns": turns,
        "seconds": round(time.monotonic() - started, 3),
    }
    async with db.tx() as conn:
        await append_event(conn, kind=EventKind.MEMORY_REINDEXED, actor=ctx.operator, data=result)
    return result


async def _legacy_rows(store: ChromaStore, with_receipt: set[str]) -> dict[str, tuple[str | None, Metadata]]:
    """Rows of the summary collection that no receipt can rewrite (kept as they are)."""
    kept: dict[str, tuple[str | None, Metadata]] = {}
    offset = 0
    while True:
        page = await store.page(offset, PAGE)
        kept.update({i: row for i, row in page.items() if session_id_of(i) not in with_receipt})
        if len(page) < PAGE:
            return kept
        offset += PAGE


async def _rebuild_summaries(ctx: Context, progress: Progress | None) -> dict[str, Any]:
    db = await ctx.db()
    store = ctx.store_unchecked()
    with_receipt = {
        r[0]
        for r in await db.fetchall("SELECT session_id FROM summary_job WHERE result_envelope IS NOT NULL")
    }
    legacy = await _legacy_rows(store, with_receipt) if await store.exists() else {}
    await store.drop()
    store = ctx.store()
    ids = list(legacy)
    for with_metadata in (True, False):
        kept = [i for i in ids if bool(legacy[i][1]) == with_metadata]
        for start in range(0, len(kept), PAGE):
            batch = kept[start : start + PAGE]
            metadatas = [legacy[i][1] for i in batch] if with_metadata else None
            await store.upsert(batch, [legacy[i][0] or "" for i in batch], metadatas)
    # each v2 receipt records the vector written; the new embedder's vector for the same
    # document differs, so the record is re-staged first, then replay writes and verifies it,
    # batch by batch: the store keeps each batch's vectors for its write (one embedding each)
    reissued = receipt_replay.reissue_counts()

    async def reissued_batches() -> AsyncIterator[list[receipt_replay.Job]]:
        async for jobs in receipt_replay.all_batches(db):
            await receipt_replay.reissue_batch(db, store, jobs, reissued, keep_vectors=True)
            yield await receipt_replay.reread(db, jobs)

    try:
        report = await receipt_replay.Recovery(db, store, actor=f"rem reindex ({ctx.operator})").run(
            reissued_batches()
        )
    finally:
        store.forget_kept()
    if progress:
        progress("summaries", report.counters.scanned)
    overlays = await _rewrite_overlays(ctx)
    return {
        "legacy_rows": len(ids),
        "vector_records": reissued,
        "receipts": asdict(report.counters),
        "overlays": overlays,
    }


async def _rewrite_overlays(ctx: Context) -> int:
    """Dream's keys on every summary row, again from dream_state (its system of record)."""
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE dream_state SET overlay_pending = 1, overlay_retry_at = 0 "
            "WHERE completed_revision IS NOT NULL OR digest_state IN ('deferred', 'undigestible')"
        )
    written = 0
    while rows := [
        dict(r) for r in await db.fetchall(OVERLAY_SQL, {"now": clock.now_ms(), "limit": OVERLAY_BATCH})
    ]:
        outcome = await write_overlays(ctx, rows)
        await settle_overlays(db, rows, outcome, "rem reindex")
        written += sum(1 for v in outcome.values() if v == "confirmed")
    return written


async def _rebuild_turns(ctx: Context, progress: Progress | None) -> dict[str, Any]:
    db = await ctx.db()
    dropped = await ctx.drop_turn_collections()
    async with db.tx() as conn:
        await conn.execute("UPDATE memory_turn SET vector_digest = NULL")
    written = 0
    while flushed := await memory_index.flush_vectors(db, ctx.turn_store, sessions=64):
        written += flushed
        if progress:
            progress("turns", written)
    pending = await db.scalar("SELECT count(*) FROM memory_turn WHERE vector_digest IS NOT digest")
    return {"collections_dropped": dropped, "vectors": written, "pending": int(pending)}
