"""Housekeeping: the WAL is truncated by a checkpoint, old journal rows are pruned."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from backend.runtime.context import Context
from backend.store import maintenance
from backend.store.db import BUSY_TIMEOUT_MS
from backend.store.events import append_event


async def _fill(db_ctx: Context) -> int:
    db = await db_ctx.db()
    async with db.tx() as conn:
        for i in range(500):
            await append_event(conn, kind="test.fill", actor="t", data={"i": i, "pad": "x" * 500})
    size = (db_ctx.data.root / "state.db-wal").stat().st_size
    assert size > 100_000
    return size


async def test_checkpoint_truncates_the_wal_only_above_its_size_limit(db_ctx: Context) -> None:
    db = await db_ctx.db()
    size = await _fill(db_ctx)
    wal = db_ctx.data.root / "state.db-wal"
    below = await maintenance.checkpoint(db, truncate_above=size + 1)
    assert (below["mode"], below["busy"], below["truncated"]) == ("passive", False, False)
    assert below["frames"] == below["checkpointed"] and wal.stat().st_size == size  # copied, not truncated
    above = await maintenance.checkpoint(db, truncate_above=size - 1)
    assert (above["mode"], above["busy"], above["truncated"]) == ("truncate", False, True)
    assert wal.stat().st_size == 0


async def test_a_reader_in_the_way_costs_the_checkpoint_a_short_timeout_not_the_busy_timeout(
    db_ctx: Context,
) -> None:
    import sqlite3
    import time

    db = await db_ctx.db()
    await _fill(db_ctx)
    reader = sqlite3.connect(str(db_ctx.data.state_db), isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM event").fetchone()  # holds a read snapshot on the WAL
    try:
        async with db.tx() as conn:  # frames the reader's snapshot does not cover
            await append_event(conn, kind="test.more", actor="t", data={"pad": "y" * 500})
        started = time.monotonic()
        result = await maintenance.checkpoint(db, truncate_above=0)
        took = time.monotonic() - started
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    assert result["busy_timeout_ms"] == maintenance.CHECKPOINT_BUSY_TIMEOUT_MS < BUSY_TIMEOUT_MS
    assert (result["mode"], result["busy"], result["truncated"]) == ("truncate", True, False)
    assert took < BUSY_TIMEOUT_MS / 1000 / 2, took  # gave up after its own short timeout


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


@pytest.mark.both_stores
async def test_housekeeping_writes_nothing_outside_the_data_dir(
    db_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rem up` on PostgreSQL once ran SQLite's WAL checkpoint on `db.path` ("postgresql"),
    # which created an empty file of that name in the operator's current directory
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    db = await db_ctx.db()
    result = await maintenance.run_once(db)
    assert list(elsewhere.iterdir()) == []
    assert result["busy"] is False and "events_pruned" in result


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_warm_page_cache_reads_state_db_and_its_wal_ahead(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    wal = tmp_path / "state.db-wal"
    db.write_bytes(os.urandom(24 << 20))
    wal.write_bytes(os.urandom(1 << 20))
    os.sync()  # dirty pages cannot be dropped
    for path in (db, wal):
        maintenance.evict_page_cache(path)
    if maintenance.page_cache_share(db) > 0.5:
        pytest.skip("this kernel keeps the file cached after POSIX_FADV_DONTNEED")
    assert maintenance.warm_page_cache(db) == (24 << 20) + (1 << 20)
    # WILLNEED is a hint: a kernel short of memory may skip or reclaim a few pages of the
    # read-ahead (CI once settled at 99.3 % and 96.9 %), so "read ahead" means at least 90 %
    deadline = time.monotonic() + 30
    while min(shares := [maintenance.page_cache_share(p) for p in (db, wal)]) < 0.9:
        assert time.monotonic() < deadline, shares
        time.sleep(0.02)


def test_warm_page_cache_leaves_a_file_larger_than_its_share_of_memory(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"x" * 4096)
    assert maintenance.warm_page_cache(db, max_share=1e-12) == 0
    assert maintenance.warm_page_cache(tmp_path / "missing.db") == 0
