"""Witness: the Chroma metadata semantics receipts rely on, proven on a real `chroma run` server.

A fake collection that replaces metadata on write is exactly what let seed
001's incident escape; these tests pin what the real server does.
"""

from __future__ import annotations

import pytest

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
