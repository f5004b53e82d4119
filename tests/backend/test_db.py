"""The storage layer: PRAGMAs, transactions, read-only mode, and contention."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backend.core.errors import DatabaseFull, DatabaseIOError, ReadOnly
from backend.runtime.context import Context
from backend.store.db import BUSY_TIMEOUT_MS, Database
from backend.store.events import append_event


async def test_connection_pragmas(db_ctx: Context) -> None:
    db = await db_ctx.db()
    assert (await db.scalar("PRAGMA journal_mode")) == "wal"
    assert await db.scalar("PRAGMA synchronous") == 1  # NORMAL
    assert await db.scalar("PRAGMA busy_timeout") == BUSY_TIMEOUT_MS
    assert await db.scalar("PRAGMA foreign_keys") == 1
    assert await db.scalar("PRAGMA journal_size_limit") > 0
    assert db.conn.isolation_level is None


async def test_tx_rolls_back_on_error(db_ctx: Context) -> None:
    db = await db_ctx.db()
    before = await db.scalar("SELECT count(*) FROM event")
    with pytest.raises(RuntimeError):
        async with db.tx() as conn:
            await append_event(conn, kind="test.event", actor="t")
            raise RuntimeError("boom")
    assert await db.scalar("SELECT count(*) FROM event") == before
    assert not db.conn.in_transaction


async def test_queued_single_hop_transactions_never_enter_a_multi_hop_one(db_ctx: Context) -> None:
    """Tasks queue `write_in_thread` calls without taking turns; none runs inside an open `tx()`."""
    import asyncio

    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, who TEXT)")

    def one_hop(raw: sqlite3.Connection, i: int) -> int:
        raw.execute("INSERT INTO t (who) VALUES (?)", (f"hop-{i}",))
        return int(raw.execute("SELECT count(*) FROM t").fetchone()[0])

    async def multi_hop(i: int) -> tuple[int, int]:
        async with db.tx() as conn:
            before = (await (await conn.execute("SELECT count(*) FROM t")).fetchone())[0]
            await asyncio.sleep(0)  # let every other task queue its work meanwhile
            await conn.execute("INSERT INTO t (who) VALUES (?)", (f"tx-{i}",))
            await asyncio.sleep(0)
            after = (await (await conn.execute("SELECT count(*) FROM t")).fetchone())[0]
        return before, after

    hops = [db.write_in_thread(lambda raw, i=i: one_hop(raw, i)) for i in range(300)]
    txs = [multi_hop(i) for i in range(30)]
    reads = [
        db.read_in_thread(lambda raw: raw.execute("SELECT count(*) FROM t").fetchone()[0]) for _ in range(30)
    ]
    # started interleaved: a hop, a multi-hop transaction, a snapshot, a hop, ...
    order = [c for trio in zip(hops[:30], txs, reads, strict=True) for c in trio] + hops[30:]
    results = await asyncio.gather(*order)
    spans = [r for r in results if isinstance(r, tuple)]
    assert len(spans) == 30 and all(after == before + 1 for before, after in spans)  # nothing ran inside
    hop_counts = results[0:90:3] + results[90:]
    assert len(set(hop_counts)) == 300  # each hop ran whole, alone, and saw its own insert
    assert await db.scalar("SELECT count(*) FROM t") == 330


async def _on_the_thread(started) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers import await_until

    async def is_set() -> bool:
        return started.is_set()

    await await_until(is_set, timeout=10, interval=0.005, message="the blocking write to start")


async def _grouped(
    db: Database,
    fns: list,
    *,
    cancel: tuple[int, ...] = (),  # type: ignore[type-arg]
    committed: int = 2,
) -> list:  # type: ignore[type-arg]
    """Run `fns` through write_in_thread as one group: a blocker holds the thread until all are queued."""
    import asyncio
    import threading

    started, gate = threading.Event(), threading.Event()
    blocker = asyncio.ensure_future(db.write_in_thread(lambda raw: started.set() or gate.wait(10)))
    await _on_the_thread(started)  # the blocker's group holds the connection's thread
    calls = [asyncio.ensure_future(db.write_in_thread(fn)) for fn in fns]
    await asyncio.sleep(0)  # one loop turn: each call queues itself for the next group
    assert len(db._lanes[0].writes) == len(fns)
    for i in cancel:
        calls[i].cancel()
    before = db.groups_committed
    gate.set()
    assert await blocker is True
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert db.groups_committed - before == committed  # the blocker's group, then all of these together
    return results


async def _table(db: Database) -> None:
    async with db.tx() as conn:
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, who TEXT UNIQUE)")


async def _rows(db: Database) -> list[str]:
    return [r[0] for r in await db.fetchall("SELECT who FROM t ORDER BY id")]


async def test_writes_that_arrive_together_commit_together_each_atomic(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _table(db)

    def insert(*names: str, fail: Exception | None = None):  # type: ignore[no-untyped-def]
        def fn(raw: sqlite3.Connection) -> int:
            for name in names:
                raw.execute("INSERT INTO t (who) VALUES (?)", (name,))
            if fail is not None:
                raise fail
            return int(raw.execute("SELECT count(*) FROM t").fetchone()[0])

        return fn

    results = await _grouped(
        db,
        [
            insert("a1", "a2"),
            insert("b1", fail=ValueError("b failed")),
            insert("c1", "a1"),
            insert("d1", "d2"),
        ],
    )
    assert results[0] == 2 and results[3] == 4  # each saw the writes before it, and only those kept
    assert isinstance(results[1], ValueError) and str(results[1]) == "b failed"
    assert isinstance(results[2], sqlite3.IntegrityError)  # c1 was written, then a1 collided
    assert await _rows(db) == ["a1", "a2", "d1", "d2"]  # b1 and c1 rolled back with their callers


async def test_a_write_cancelled_before_its_group_never_runs(db_ctx: Context) -> None:
    import asyncio

    db = await db_ctx.db()
    await _table(db)
    results = await _grouped(
        db,
        [
            lambda raw: raw.execute("INSERT INTO t (who) VALUES ('kept')").rowcount,
            lambda raw: raw.execute("INSERT INTO t (who) VALUES ('cancelled')").rowcount,
        ],
        cancel=(1,),
    )
    assert results[0] == 1 and isinstance(results[1], asyncio.CancelledError)
    assert await _rows(db) == ["kept"]


async def test_a_transaction_dropped_under_a_group_fails_every_write_in_it(db_ctx: Context) -> None:
    """SQLite may roll a whole transaction back (full disk): nobody in the group may think it committed."""
    from backend.store.db import TransactionDropped

    db = await db_ctx.db()
    await _table(db)

    def dropper(raw: sqlite3.Connection) -> None:
        raw.execute("INSERT INTO t (who) VALUES ('dropper')")
        raw.execute("ROLLBACK")  # what SQLite does itself on SQLITE_FULL or an I/O error

    results = await _grouped(
        db,
        [
            lambda raw: raw.execute("INSERT INTO t (who) VALUES ('first')").rowcount,
            dropper,
            lambda raw: raw.execute("INSERT INTO t (who) VALUES ('third')").rowcount,
        ],
        committed=1,
    )  # the blocker's only: this group never committed
    assert all(isinstance(r, TransactionDropped) for r in results), results
    assert await _rows(db) == []  # not even 'third' slipped in outside a transaction
    assert not db.conn.in_transaction
    assert (
        await db.write_in_thread(lambda raw: raw.execute("INSERT INTO t (who) VALUES ('after')").rowcount)
        == 1
    )


async def test_no_caller_waits_forever_when_the_committer_is_cancelled(db_ctx: Context) -> None:
    import asyncio
    import threading

    db = await db_ctx.db()
    started, gate = threading.Event(), threading.Event()
    first = asyncio.ensure_future(db.write_in_thread(lambda raw: started.set() or gate.wait(10)))
    await _on_the_thread(started)
    second = asyncio.ensure_future(db.write_in_thread(lambda raw: 1))
    await asyncio.sleep(0)  # one loop turn: the second call queues itself
    assert len(db._lanes[0].writes) == 1
    assert db._lanes[0].committer is not None
    db._lanes[0].committer.cancel()  # what loop shutdown does to it
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 10)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert await db.write_in_thread(lambda raw: 7) == 7  # a new committer serves the next write


async def test_read_only_connection_refuses_writes(db_ctx: Context) -> None:
    ro = await Database.open(db_ctx.data.state_db, read_only=True)
    try:
        assert await ro.scalar("PRAGMA query_only") == 1
        with pytest.raises(ReadOnly):
            async with ro.tx():
                pass
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
            await ro.conn.execute("INSERT INTO event (time, kind, actor) VALUES (1, 'x', 'y')")
    finally:
        await ro.close()


async def test_read_only_context_refuses_a_missing_data_dir(tmp_path: Path) -> None:
    from backend.core.datadir import DataDir
    from backend.core.errors import DataDirError

    ctx = Context(DataDir(tmp_path / "nothing"), read_only=True)
    with pytest.raises(DataDirError, match="rem init"):
        await ctx.db()
    assert not (tmp_path / "nothing").exists()


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from backend.store.db import Database

    async def main(path, n, name):
        db = await Database.open(Path(path))
        for i in range(n):
            async with db.tx() as conn:
                # read-then-write: the pattern a deferred transaction gets wrong
                row = await (await conn.execute("SELECT coalesce(max(id), 0) FROM event")).fetchone()
                await conn.execute(
                    "INSERT INTO event (time, kind, actor, data) VALUES (?, 'race', ?, ?)",
                    (row[0] + 1, name, '{}'),
                )
        await db.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    """
)


async def test_four_processes_read_then_write_never_see_locked(db_ctx: Context) -> None:
    db = await db_ctx.db()
    base = await db.scalar("SELECT count(*) FROM event")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db_ctx.data.state_db), "300", f"p{i}"],
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert not any("locked" in e for e in errors), errors
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'race'") == 1200
    assert await db.scalar("SELECT count(*) FROM event") == base + 1200


async def test_a_failing_statement_inside_tx_is_one_rem_error_and_rolls_back(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await db.fetchall("PRAGMA max_page_count = 1")  # this connection's "disk" is full now
    before = await db.scalar("SELECT count(*) FROM event")
    with pytest.raises(DatabaseFull, match="no space left for .*state.db; free disk space, then retry"):
        async with db.tx() as conn:
            await append_event(conn, kind="test.event", actor="t", data={"pad": "x" * 100_000})
    assert not db.conn.in_transaction
    assert await db.scalar("SELECT count(*) FROM event") == before


@pytest.mark.parametrize(
    ("free", "expected", "needle"),
    [
        (0, DatabaseFull, "no space left for /d/state.db (0 bytes free, SQLITE_IOERR_SHMSIZE)"),
        (10**9, DatabaseIOError, "disk I/O error on /d/state.db (SQLITE_IOERR_SHMSIZE); check the disk"),
    ],
)
def test_a_disk_io_error_is_a_full_disk_or_an_io_error_never_corruption(
    monkeypatch: pytest.MonkeyPatch, free: int, expected: type, needle: str
) -> None:
    import shutil

    from backend.store import db as db_module

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10**9, 0, free))
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorname = "SQLITE_IOERR_SHMSIZE"  # type: ignore[attr-defined]
    translated = db_module.translate_sqlite_error(exc, "/d/state.db")
    assert type(translated) is expected and needle in str(translated)
    assert "restore it from a backup or move it aside" not in str(translated)


@pytest.mark.both_stores
@pytest.mark.parametrize("fill_s", [0.0, 1.0])
async def test_a_group_waits_for_as_many_writes_as_the_last_one_when_filling_is_on(
    db_ctx: Context, fill_s: float
) -> None:
    """`group_fill_s` (rem serve's): a group smaller than the last waits, bounded, for its callers'
    writes still on their way; a full one never waits; off (the default), the stragglers go next."""
    import asyncio

    db = await db_ctx.db()
    db.group_fill_s = fill_s
    await asyncio.gather(*(db.write_in_thread(lambda raw: 1) for _ in range(8)))  # one group of 8

    async def late(turns: int) -> int:
        for _ in range(turns):  # a request still being read: a few loop turns before it queues
            await asyncio.sleep(0)
        return await db.write_in_thread(lambda raw: 2)

    before = db.groups_committed
    assert await asyncio.gather(*(late(0 if i < 4 else 3) for i in range(8))) == [2] * 8
    # filling: the four queued at once wait for the four on their way (well within the bound)
    assert db.groups_committed - before == (1 if fill_s else 2)
    before = db.groups_committed
    assert await db.write_in_thread(lambda raw: 3) == 3  # waits for none: nothing else is coming
    assert db.groups_committed - before == 1
