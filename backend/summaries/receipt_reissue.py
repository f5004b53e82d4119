"""Re-record the vector in every v2 receipt after the embedder changed (`rem reindex`)."""

from __future__ import annotations

import dataclasses

from backend.chroma.collection import ChromaStore
from backend.core import clock
from backend.core.errors import ReceiptCorrupt
from backend.store.db import Database, execute
from backend.summaries import receipts
from backend.summaries.receipts import Receipt
from backend.summaries.replay_jobs import NOT_LEASED, Job, all_batches


async def reissue_for_embedder(db: Database, store: ChromaStore, *, now: int | None = None) -> dict[str, int]:
    """Re-record the vector in every v2 receipt with the store's (new) embedder; `rem reindex`.

    A v2 receipt records the vector written with its document, and replay
    compares the row's vector with that record. After the embedder changes
    the old record can never match again, so a reindex re-stages each receipt
    with `embedding_digest` of the new embedder's vector for the same
    document, before it replays them. Document and owned keys are unchanged.
    Compare-and-swap on the envelope bytes, and never under a live lease: a
    receipt a summarizer re-staged meanwhile is left to it (counted `skipped`).
    v1 receipts carry no vector record and corrupt ones are left for replay
    to verify or quarantine.
    """
    counts = reissue_counts()
    async for jobs in all_batches(db):
        await reissue_batch(db, store, jobs, counts, now=now)
    return counts


def reissue_counts() -> dict[str, int]:
    return {"reissued": 0, "skipped": 0, "unchanged": 0}


async def reissue_batch(
    db: Database,
    store: ChromaStore,
    jobs: list[Job],
    counts: dict[str, int],
    *,
    now: int | None = None,
    keep_vectors: bool = False,
) -> None:
    """`reissue_for_embedder` for one batch (`keep_vectors`: the store keeps them for the replay's write)."""
    decoded: list[tuple[Job, Receipt]] = []
    for job in jobs:
        try:
            receipt = receipts.decode(job.envelope, job.encoding)
        except (ReceiptCorrupt, ValueError):
            counts["unchanged"] += 1
            continue
        if receipt.embedding is None:
            counts["unchanged"] += 1
            continue
        decoded.append((job, receipt))
    if not decoded:
        return
    vectors = await store.embed([r.document for _, r in decoded], keep=keep_vectors)
    stamp = clock.now_ms() if now is None else now
    async with db.tx() as conn:
        for (job, receipt), vector in zip(decoded, vectors, strict=True):
            fresh = dataclasses.replace(receipt, embedding=receipts.embedding_digest(vector))
            if fresh == receipt:
                counts["unchanged"] += 1
                continue
            changed = await execute(
                conn,
                "UPDATE summary_job SET result_envelope = :new, result_encoding = :enc "
                f"WHERE session_id = :sid AND result_envelope IS :env AND result_staged_at IS :staged "
                f"AND {NOT_LEASED}",
                {
                    **job.cas(),
                    "new": receipts.encode(fresh),
                    "enc": receipts.encoding_of(fresh),
                    "now": stamp,
                },
            )
            counts["reissued" if changed else "skipped"] += 1
