"""Housekeeping: the WAL is truncated by a checkpoint, old journal rows are pruned."""

from __future__ import annotations

from backend import maintenance
from backend.context import Context
from backend.events import append_event


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


async def test_prune_deletes_only_rows_past_retention(db_ctx: Context, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(maintenance, "PRUNE_CHUNK", 7)
    db = await db_ctx.db()
    now = 100 * maintenance.DAY_MS
    async with db.tx() as conn:
        for day in range(100):
            await append_event(conn, kind="test.old", actor="t", now=day * maintenance.DAY_MS + 5)
    deleted = await maintenance.prune_events(db, now=now)
    assert deleted == 70  # days 0..69 are more than 30 days before day 100
    kept = await db.fetchall("SELECT time FROM event WHERE kind = 'test.old' ORDER BY time")
    assert [r[0] // maintenance.DAY_MS for r in kept] == list(range(70, 100))
