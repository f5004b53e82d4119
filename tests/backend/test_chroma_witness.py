"""Witness: the Chroma metadata semantics receipts rely on, proven on a real `chroma run` server.

A fake collection that replaces metadata on write is exactly what let seed
001's incident escape; these tests pin what the real server does.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from backend.chroma.collection import ChromaStore
from backend.core.datadir import DataDir
from backend.runtime.context import Context


async def test_upsert_merges_metadata_keeping_foreign_keys(ctx: Context) -> None:
    store = ctx.store()
    await store.upsert(["r1"], ["first"], [{"sessionId": "s1", "memoryCount": 2}])
    await store.update_metadata(["r1"], [{"graphDigested": True, "digestState": "digested"}])
    await store.upsert(["r1"], ["second"], [{"sessionId": "s1", "memoryCount": 3}])
    document, metadata = (await store.get(["r1"]))["r1"]
    assert document == "second"
    assert metadata == {"sessionId": "s1", "memoryCount": 3, "graphDigested": True, "digestState": "digested"}


async def test_update_merges_and_none_deletes_a_key(ctx: Context) -> None:
    store = ctx.store()
    await store.upsert(["r1"], ["doc"], [{"sessionId": "s1", "title": "t", "keep": "k"}])
    await store.update_metadata(["r1"], [{"title": None, "digestAttempts": 1}])
    await store.upsert(["r1"], ["doc"], [{"sessionId": "s1", "keep": None}])
    _, metadata = (await store.get(["r1"]))["r1"]
    assert metadata == {"sessionId": "s1", "digestAttempts": 1}


@pytest.mark.parametrize("write", ["upsert", "update"])
async def test_empty_metadata_is_refused(ctx: Context, write: str) -> None:
    store = ctx.store()
    await store.upsert(["r1"], ["doc"], [{"sessionId": "s1"}])
    with pytest.raises(ValueError, match="non-empty"):
        if write == "upsert":
            await store.upsert(["r1"], ["doc"], [{}])
        else:
            await store.update_metadata(["r1"], [{}])
    assert (await store.get(["r1"]))["r1"] == ("doc", {"sessionId": "s1"})


async def test_values_round_trip_with_their_type(ctx: Context) -> None:
    store = ctx.store()
    written = {
        "i": 1,
        "f": 1.0,
        "b": True,
        "s": "1",
        "li": [1, 2],
        "lf": [1.0, 2.5],
        "ls": ["a"],
        "lb": [True],
    }
    await store.upsert(["r1"], ["doc"], [written])
    _, metadata = (await store.get(["r1"]))["r1"]
    assert metadata == written
    for key, value in written.items():
        assert type(metadata[key]) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in metadata[key]] == [type(v) for v in value], key


async def _write_one_by_one(store: ChromaStore, ids: list[str], written: dict[str, list[float]]) -> None:
    for row_id in ids:
        await store.upsert([row_id], [f"summary {row_id}"], [{"sessionId": row_id}])
        written[row_id] = (await store.rows([row_id]))[row_id].embedding.tolist()


async def test_vectors_read_while_a_new_collection_takes_its_first_writes_never_fail(
    data_dir: DataDir, chroma_url: str
) -> None:
    """Chroma 1.5.9 answers a read of vectors made while a fresh collection's first writes are
    applied with "Error creating hnsw segment reader: Nothing found on disk" (a check racing the
    summarizer's first row hit it); `ChromaStore.rows` reads through that window."""
    reads = 0
    for _ in range(12):
        name = f"t_{uuid.uuid4().hex[:12]}"
        writer = Context(data_dir, chroma_url=chroma_url, collection=name).store()
        reader = Context(data_dir, chroma_url=chroma_url, collection=name).store()
        ids = [f"r{i}" for i in range(15)]
        written: dict[str, list[float]] = {}
        task = asyncio.ensure_future(_write_one_by_one(writer, ids, written))
        while not task.done():
            rows = await reader.rows(ids)  # raised InternalError before the reads rode the window out
            reads += 1
            assert set(rows) <= set(ids)
            assert all(len(row.embedding) == len(rows[next(iter(rows))].embedding) for row in rows.values())
        await task
        final = await reader.rows(ids)
        assert {row_id: row.embedding.tolist() for row_id, row in final.items()} == written
    assert reads > 12  # the reader really overlapped the writes
