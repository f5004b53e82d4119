"""The Dream input revision: canonical form, stability, and what it must notice."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.core.datadir import DataDir
from backend.dream.digester import Dreamer
from backend.runtime.context import Context
from backend.store.db import execute
from backend.store.revision import compute_revision, load_raw_turns, raw_revision, turn_record
from tests.dreamkit import add_session, add_turn, publish

turn_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
turns_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "id": turn_ids,
            "role": st.sampled_from(["user", "assistant"]),
            "time": st.integers(0, 4),  # many equal times: the id must break the tie
            "text": st.one_of(st.none(), st.text(max_size=30)),
        }
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda t: t["id"],
)


def test_the_canonical_form_is_pinned() -> None:
    """sha256 of compact, key-sorted UTF-8 JSON, explicit nulls, (time, id by code point) order."""
    turns = [
        {"id": "b", "role": "assistant", "text": None, "time": 1},
        {"id": "é", "role": "user", "text": "naïve “quote”", "time": 1},
        {"id": "a", "role": "user", "text": "héllo", "time": 2},
    ]
    expected = (
        '[{"id":"b","role":"assistant","text":null,"time":1},'
        '{"id":"é","role":"user","text":"naïve “quote”","time":1},'
        '{"id":"a","role":"user","text":"héllo","time":2}]'
    )
    assert compute_revision(turns) == "sha256:" + hashlib.sha256(expected.encode("utf-8")).hexdigest()


def test_only_raw_turns_count() -> None:
    assert turn_record("m", "assistant", 1, {"text": "partial", "status": "streaming"}) is None
    assert turn_record("m", "synthetic", 1, {"text": "continue"}) is None
    assert turn_record("m", "assistant", 1, {"text": "done", "status": "completed"}) == {
        "id": "m",
        "role": "assistant",
        "text": "done",
        "time": 1,
    }


def test_a_lone_surrogate_from_json_still_has_a_stable_revision() -> None:
    text = json.loads('"broken \\ud800 half"')
    first = compute_revision([{"id": "m", "role": "user", "text": text, "time": 1}])
    assert first == compute_revision([{"id": "m", "role": "user", "text": text, "time": 1}])
    assert first != compute_revision([{"id": "m", "role": "user", "text": "broken  half", "time": 1}])


@given(turns=turns_strategy, data=st.data())
def test_the_revision_ignores_order_and_sees_every_content_change(
    turns: list[dict[str, Any]], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(turns))
    assert compute_revision(shuffled) == compute_revision(turns)
    index = data.draw(st.integers(0, len(turns) - 1))
    new_text = data.draw(st.text(max_size=30).filter(lambda t: t != turns[index]["text"]))
    changed = [dict(t) for t in turns]
    changed[index]["text"] = new_text  # same count, same ids: a count-only check would miss it
    assert compute_revision(changed) != compute_revision(turns)


async def _store(ctx: Context, turns: list[dict[str, Any]]) -> None:
    db = await ctx.db()
    for turn in turns:
        await add_turn(db, "s", turn["id"], turn["text"], role=turn["role"], time=turn["time"])
    async with db.tx() as conn:  # the executor stores a missing text as an absent key
        for turn in turns:
            if turn["text"] is None:
                data = {"status": "completed"} if turn["role"] == "assistant" else {}
                await execute(
                    conn, "UPDATE session_message SET data = ? WHERE id = ?", (json.dumps(data), turn["id"])
                )


async def _digest_twice(root: Path, first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
    ctx = Context(DataDir(root), start_chroma=False)
    try:
        db = await ctx.db()
        await add_session(db, "s")
        await _store(ctx, first)
        rev = await publish(db, "s")
        async with db.snapshot() as conn:
            assert await load_raw_turns(conn, "s") == sorted(first, key=lambda t: (t["time"], t["id"]))
        assert rev == compute_revision(first)
        dreamer = Dreamer(ctx)
        assert await dreamer.run_pass() == 1
        # the same turns stored again in another physical order (new rowids and seqs)
        async with db.tx() as conn:
            await execute(conn, "DELETE FROM session_message WHERE session_id = 's'")
        await _store(ctx, second)
        assert await publish(db, "s") == rev
        assert await dreamer.run_pass() == 0
        assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'dream.completed'") == 1
    finally:
        await ctx.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=turns_strategy, data=st.data())
def test_equivalent_input_stored_in_another_order_is_not_digested_twice(
    turns: list[dict[str, Any]], data: st.DataObject
) -> None:
    reordered = data.draw(st.permutations(turns))
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_digest_twice(Path(tmp) / "data", turns, list(reordered)))


@pytest.mark.both_stores
async def test_a_turn_longer_than_the_read_bound_is_hashed_whole_but_read_in_pieces(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_TURN_READ_MAX_CHARS", "1000")
    db = await db_ctx.db()
    await add_session(db, "s")
    # escapes, quotes, non-ASCII and an astral character straddle the 1000-character pieces
    long_text = ('line "one"\\\n\ttab é 日本 🎉 ' * 400)[:3_333]
    turns = [
        {"id": "a", "role": "user", "text": "a short question", "time": 1},
        {"id": "b", "role": "assistant", "text": long_text, "time": 2},
        {"id": "c", "role": "user", "text": "x" * 990, "time": 3},  # the row is over 1000, its text is not
        {"id": "d", "role": "assistant", "text": "y" * 1000, "time": 4},
    ]
    for turn in turns:
        await add_turn(db, "s", turn["id"], turn["text"], role=turn["role"], time=turn["time"])
    await add_turn(db, "s", "e", "z" * 5000, role="assistant", time=5, status="streaming")  # not a raw turn
    async with db.snapshot() as conn:
        revision, read = await raw_revision(conn, "s")
    assert revision == compute_revision(turns)  # exactly the revision of the whole texts
    assert [t["text"] for t in read] == ["a short question", long_text[:1000], "x" * 990, "y" * 1000]
    assert [t["id"] for t in read] == ["a", "b", "c", "d"]
