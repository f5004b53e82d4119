"""Turn rows in Chroma against what state.db marks written: `rem check` finds a missing, changed or
re-documented row, and Dream's sweep writes it again (fenced, journaled, idempotent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend import ops
from backend.dream.digester import Dreamer
from backend.memory import turn_vectors
from backend.ops.checks.turn_index import TURN_ROWS_CHANGED
from backend.runtime.context import Context
from backend.store.db import execute
from tests.dreamkit import add_session_with_turns, publish

pytestmark = pytest.mark.both_stores

TEXTS = [
    "The invoice export moved to the nightly batch on Monday.",
    "Who owns the nightly batch now?",
    "Priya does; she also rotated the SFTP keys.",
    "Then ask Priya whether the keys reached the bank.",
]


def _findings(report: dict[str, Any], bucket: str) -> dict[str, list[dict[str, Any]]]:
    return {f["what"]: f["rows"] for f in report[bucket] if f["invariant"] == "9"}


async def _indexed(ctx: Context) -> Dreamer:
    db = await ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    dream = Dreamer(ctx, once=True)
    await dream.run()
    dream.db = db
    return dream


async def test_missing_and_changed_turn_rows_are_found_then_written_again(ctx: Context) -> None:
    dream = await _indexed(ctx)
    db = dream.db
    marked = await turn_vectors.marked_batch(db, 0)
    assert len(marked) == 4 and all(r.sketch and r.sketch.startswith("k1:") for r in marked)
    assert (
        _findings(await ops.check(ctx, settled=True), "violations") == {}
    )  # (dreamkit has no inputs: 9 only)
    store = ctx.turn_store("default")
    ids = [r.message_id for r in marked]
    original = await store.rows(ids)

    # behind rem's back: one row deleted, one document replaced, one vector replaced
    await store.delete([ids[0]])
    kept = [float(x) for x in original[ids[1]].embedding]  # (a document alone would be re-embedded)
    await store._run(lambda c: c.update(ids=[ids[1]], documents=["Priya never owned it."], embeddings=[kept]))
    forged = [0.0] * len(original[ids[2]].embedding)
    forged[0] = 1.0
    await store._run(lambda c: c.update(ids=[ids[2]], embeddings=[forged]))

    report = await ops.check(ctx)
    violations = _findings(report, "violations")
    assert [r["message_id"] for r in violations["turn vectors marked written but missing from Chroma"]] == [
        ids[0]
    ]
    changed = violations["turn rows whose document, vector or digest in Chroma differs from what was written"]
    assert sorted((r["message_id"], r["differs"]) for r in changed) == [
        (ids[1], "document"),
        (ids[2], "vector"),
    ]

    # Dream's next sweep (its pass at start found all well) un-marks them, journaled in the same
    # transaction: `rem check` shows the repair in flight
    assert dream._sweep.cursor is None
    dream._sweep.restart()
    assert await dream.sweep_vectors() == 3
    (event,) = await db.fetchall("SELECT actor, data FROM event WHERE kind = 'memory.vectors_repaired'")
    data = json.loads(event["data"])
    assert event["actor"] == dream.owner_id and data["unmarked"] == 3 and data["sessions"] == ["s1"]
    assert data["problems"] == {"missing": 1, "document": 1, "vector": 1}
    report = await ops.check(ctx)
    assert _findings(report, "violations") == {}
    in_flight = _findings(report, "unsettled")["turn vectors not written to Chroma yet"]
    assert sorted(r["message_id"] for r in in_flight) == sorted(ids[:3])

    # the flush writes them again: Chroma holds what was written, and the sweep finds nothing more
    assert await dream.flush_vectors() == 3
    again = await store.rows(ids)
    for row_id in ids:
        assert again[row_id].document == original[row_id].document
        assert (
            turn_vectors.sketch_problem(
                marked[ids.index(row_id)].sketch, again[row_id].document, again[row_id].embedding
            )
            is None
        )
    assert _findings(await ops.check(ctx, settled=True), "violations") == {}
    dream._sweep.restart()
    assert await dream.sweep_vectors() == 0
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'memory.vectors_repaired'") == 1


async def test_a_restarted_chroma_starts_the_sweep_over_and_a_stale_mark_is_left_alone(ctx: Context) -> None:
    dream = await _indexed(ctx)
    db = dream.db
    dream._sweep.restart()
    assert await dream.sweep_vectors() == 0  # a batch: everything is there
    assert dream._sweep.cursor is not None and await dream.sweep_vectors() == 0
    assert dream._sweep.cursor is None  # done: the next one is due in REM_TURN_VECTOR_SWEEP_MS
    store = ctx.turn_store("default")
    (first, *_) = await turn_vectors.marked_batch(db, 0)
    await store.delete([first.message_id])
    assert await dream.sweep_vectors() == 0, "not due yet"
    ctx.chroma_generation += 1  # what `Context.chroma` does when it finds a new server
    # fenced on the digest it checked: a row re-indexed meanwhile is not un-marked
    stale = turn_vectors.MarkedTurn(
        first.id, first.project, first.session_id, first.message_id, "other", None
    )
    assert await turn_vectors.unmark(db, [(stale, "missing")], "test") == 0
    assert await dream.sweep_vectors() == 1
    assert await dream.flush_vectors() == 1
    assert first.message_id in await store.rows([first.message_id])


def test_a_sketch_tolerates_chromas_rounding_and_not_another_vector() -> None:
    vector = [((i * 7919) % 257 - 128) / 300.0 for i in range(256)]
    recorded = turn_vectors.sketch("a turn", vector)
    nudged = [v * (1 + 2.4e-7) for v in vector]  # two float32 ulps, as Chroma hands vectors back
    assert turn_vectors.sketch_problem(recorded, "a turn", nudged) is None
    assert turn_vectors.sketch_problem(recorded, "a turn", list(reversed(vector))) == "vector"
    assert turn_vectors.sketch_problem(recorded, "another turn", vector) == "document"
    assert turn_vectors.sketch_problem(None, "anything", vector) is None  # rows from before v9


async def test_a_row_rewritten_between_the_checks_two_reads_is_read_again_not_reported(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    dream = await _indexed(ctx)
    db = dream.db
    store = ctx.turn_store("default")
    (first, *_) = await turn_vectors.marked_batch(db, 0)
    real, hooked = turn_vectors.marked_batch, []

    async def then_rewritten(db: Any, after: int, n: int = turn_vectors.SWEEP_BATCH) -> Any:
        rows = await real(db, after, n)
        if not hooked:  # Dream re-indexes the row and flushes its new vector after this read
            hooked.append(first.id)
            async with db.tx() as conn:
                await execute(conn, "UPDATE memory_turn SET digest = ?, vector_digest = ? WHERE id = ?",
                              ("newer", "newer", first.id))  # fmt: skip
            await store._run(lambda c: c.update(ids=[first.message_id], metadatas=[{"digest": "newer"}]))
        return rows

    monkeypatch.setattr(turn_vectors, "marked_batch", then_rewritten)
    assert _findings(await ops.check(ctx, settled=True), "violations") == {}
    assert hooked == [first.id]
    # a row that still differs when read again is a violation
    await store._run(lambda c: c.update(ids=[first.message_id], metadatas=[{"digest": "older"}]))
    changed = _findings(await ops.check(ctx), "violations")[TURN_ROWS_CHANGED]
    assert [(r["message_id"], r["differs"]) for r in changed] == [(first.message_id, "digest")]
