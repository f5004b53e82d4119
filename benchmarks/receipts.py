"""Receipt verification throughput next to raw batched Chroma reads, on a real `chroma run` server.

Stages N receipts (default 20 000) in a temp state.db and their rows in a
Chroma server this script starts in a temp dir, then measures, in the same
run and over the same ids:

* raw: `collection.get(ids=batch, include=[documents, metadatas, embeddings])`,
  rows/s: what verification must read (the vector too, since receipts attest it);
* verify: a full recovery sweep (`receipt_replay.Recovery` over `all_batches`):
  read envelopes from state.db, decode + checksum them, one Chroma get per
  batch, the ownership-aware predicate and the vector digest; receipts/s
  (all present, nothing written).

Prints both and their ratio (target >= 0.5). Run:
    .venv/bin/python benchmarks/receipts.py [--receipts 20000] [--batch 500] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.chroma import server as chroma_server
from backend.chroma.ownership import summary_row_id
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from backend.summaries import receipt_replay, receipts

WORDS = "restart drain latency alert service deploy rollback node cluster python test import".split()


def _document(i: int) -> str:
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(60)]
    return f"Summary {i}: " + " ".join(words)


def _metadata(i: int) -> dict[str, Any]:
    return {
        "sessionId": f"s{i:06d}",
        "memoryCount": i % 40 + 2,
        "timestamp": 1_800_000_000_000 + i,
        "title": f"Session {i}",
        "category": "operations",
        "keywords": WORDS[i % 5 : i % 5 + 4],
        "dreamInputRevision": f"sha256:{i:064x}",
        "summarizer": "rem-extractive-v1",
        "project": "default",  # a synthesis-owned key since projects (schema v4): issue() requires it
    }


async def _stage(ctx: Context, n: int, batch: int) -> None:
    db = await ctx.db()
    store = ctx.store()
    rows = []
    for i in range(n):
        meta = _metadata(i)
        vector = (await store.embed([_document(i)]))[0]
        envelope = receipts.encode(receipts.issue(_document(i), meta, embedding=vector))
        rows.append((meta["sessionId"], envelope))
    async with db.tx() as conn:
        await conn.executemany(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)",
            [(sid,) for sid, _ in rows],
        )
        await conn.executemany(
            "INSERT INTO summary_job (session_id, status, result_envelope, result_encoding, result_staged_at, "
            "result_acknowledged_at, verdict, verdict_checked_at, time_created, time_updated) "
            "VALUES (?, 'completed', ?, ?, 1, 1, 'present', 1, 1, 1)",
            [(sid, env, receipts.ENCODING) for sid, env in rows],
        )
    for start in range(0, n, batch):
        ids = range(start, min(n, start + batch))
        await store.upsert(
            [summary_row_id(f"s{i:06d}") for i in ids],
            [_document(i) for i in ids],
            [_metadata(i) for i in ids],
        )
        # a Dream overlay on some rows: foreign keys the predicate must tolerate
        await store.update_metadata(
            [summary_row_id(f"s{i:06d}") for i in ids if i % 3 == 0],
            [{"graphDigested": True, "digestState": "digested"} for i in ids if i % 3 == 0],
        )


async def _raw_get(ctx: Context, n: int, batch: int) -> float:
    store = ctx.store()
    ids = [summary_row_id(f"s{i:06d}") for i in range(n)]
    await store.count()
    collection = store._collection
    started = time.perf_counter()
    got = 0
    for start in range(0, n, batch):
        result = collection.get(
            ids=ids[start : start + batch], include=["documents", "metadatas", "embeddings"]
        )
        got += len(result["ids"])
    elapsed = time.perf_counter() - started
    assert got == n, got
    return n / elapsed


async def _verify(ctx: Context, n: int, batch: int) -> float:
    db = await ctx.db()
    started = time.perf_counter()
    report = await receipt_replay.Recovery(db, ctx.store(), actor="bench").run(
        receipt_replay.all_batches(db, batch)
    )
    elapsed = time.perf_counter() - started
    c = report.counters
    assert (c.present, c.replayed, report.rows_written) == (n, 0, 0), report.as_dict()["counters"]
    return n / elapsed


async def main(n: int, batch: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rem-bench-") as tmp:
        data = DataDir(Path(tmp) / "data").ensure()
        server = chroma_server.resolve(data)
        ctx = Context(data, chroma_url=server.url, collection="bench_receipts")
        try:
            t0 = time.perf_counter()
            await _stage(ctx, n, 1000)
            staged_s = time.perf_counter() - t0
            raw, verify = [], []
            for _ in range(rounds):  # interleaved, so both see the same server state
                raw.append(await _raw_get(ctx, n, batch))
                verify.append(await _verify(ctx, n, batch))
        finally:
            await ctx.close()
            server.stop()
    # rounds interleave raw and verify, so the median of per-round ratios is robust to a noisy host
    ratios = [v / r for r, v in zip(raw, verify, strict=True)]
    return {
        "receipts": n,
        "batch": batch,
        "rounds": rounds,
        "stage_seconds": round(staged_s, 1),
        "raw_get_rows_per_s": round(statistics.median(raw)),
        "verified_receipts_per_s": round(statistics.median(verify)),
        "ratio": round(statistics.median(ratios), 3),
        "round_ratios": [round(x, 3) for x in ratios],
        "target_ratio": 0.5,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=receipt_replay.BATCH_SIZE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.receipts, args.batch, args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"receipts {result['receipts']}  batch {result['batch']}  (staged in {result['stage_seconds']} s, "
            f"median of {result['rounds']} rounds)"
        )
        print(f"raw batched collection.get   {result['raw_get_rows_per_s']:>9,} rows/s")
        print(f"receipts verified            {result['verified_receipts_per_s']:>9,} receipts/s")
        print(
            f"ratio                        {result['ratio']:>9}   (target >= {result['target_ratio']}; "
            f"per round {result['round_ratios']})"
        )
