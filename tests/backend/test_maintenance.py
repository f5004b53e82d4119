"""Housekeeping: the WAL is truncated by a checkpoint, old journal rows are pruned."""

from __future__ import annotations

from backend.runtime.context import Context
from backend.store import maintenance
from backend.store.events import append_event


async def test_checkpoint_truncates_the_wal(db_ctx: Context) -> None:
    db = await db_ctx.db()
    async with db.tx() as conn:
        for i in range(500):
            await append_event(conn, kind="test.fill", actor="t", data={"i": i, "pad": "x" * 500})
    wal = db_ctx.data.root / "state.db-wal"
    assert wal.stat().st_size > 100_000
    result = await maintenance.checkpoint(db)
    assert not result["busy"] and result["frames"] == result["checkpointed"]
    assert wal.stat().st_size == 0


async def _journal_by_day(db, days, *, fresh: bool = True) -> None:  # type: ignore[no-untyped-def]
    """Append one row per day, in order; `fresh` first drops the fixture's own (real-time) rows."""
    async with db.tx() as conn:
        if fresh:
            await conn.execute("DELETE FROM event")
        for day in days:
            await append_event(conn, kind="test.old", actor="t", now=day * maintenance.DAY_MS + 5)


async def test_prune_deletes_only_rows_past_retention(db_ctx: Context, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(maintenance, "PRUNE_CHUNK", 7)
    db = await db_ctx.db()
    await _journal_by_day(db, range(100))
    deleted = await maintenance.prune_events(db, now=100 * maintenance.DAY_MS)
    assert deleted == 70  # days 0..69 are more than 30 days before day 100
    kept = await db.fetchall("SELECT time FROM event ORDER BY id")
    assert [r[0] // maintenance.DAY_MS for r in kept] == list(range(70, 100))
    assert await maintenance.prune_events(db, now=100 * maintenance.DAY_MS) == 0


async def test_prune_of_a_journal_all_past_retention_keeps_ids_increasing(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _journal_by_day(db, range(10))
    last = await db.scalar("SELECT max(id) FROM event")
    assert await maintenance.prune_events(db, now=1000 * maintenance.DAY_MS) == 10
    async with db.tx() as conn:
        new_id = await append_event(conn, kind="test.new", actor="t")
    assert new_id > last  # a console tailing by id never sees an id twice


async def test_prune_stops_at_a_row_stamped_by_a_clock_running_ahead(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _journal_by_day(db, range(10))
    await _journal_by_day(db, [95, 11], fresh=False)  # day 95: a writer whose clock ran ~85 days ahead
    deleted = await maintenance.prune_events(db, now=50 * maintenance.DAY_MS)
    assert deleted == 10  # days 0..9; the day-11 row waits behind the day-95 row
    kept = await db.fetchall("SELECT time FROM event ORDER BY id")
    assert [r[0] // maintenance.DAY_MS for r in kept] == [95, 11]
