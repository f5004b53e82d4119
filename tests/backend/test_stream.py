"""The journal read as event streams (backend.store.stream): resumed from any cursor, a read gives
exactly the events after it, in the order a read from the start gives; cursors are parsed strictly;
a cursor of another store or a pruned one is told apart; on PostgreSQL a row whose transaction
commits late is never skipped (the horizon holds later rows back until it commits)."""

from __future__ import annotations

import json
from functools import partial

import psycopg
import pytest

from backend.core import clock
from backend.core.errors import BadInput
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store import maintenance
from backend.store.db import Database
from backend.store.stream import (
    ORIGIN,
    PAGE_ROWS,
    Cursor,
    Page,
    Position,
    Scope,
    StreamEvent,
    check_cursor_sync,
    live_end_sync,
    parse_cursor,
    read_sync,
)


async def _read_all(
    db: Database, scope: Scope, after: Position = ORIGIN, limit: int = PAGE_ROWS
) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    while True:
        page: Page = await db.read_in_thread(partial(read_sync, after=after, scope=scope, limit=limit))
        events.extend(page.events)
        if not page.full:
            return events
        after = page.last


async def _two_projects_of_turns(ctx: Context) -> Database:
    db = await ctx.db()
    await sessions.admit(db, "s1", "What is the export format?", input_id="in-1", project="alpha")
    await sessions.admit(db, "s2", "Note the cache size.", input_id="in-2", project="beta")
    await sessions.admit(db, "s1", "And the import format?", input_id="in-3", project="alpha")
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=5_000).run()
    return db


@pytest.mark.both_stores
async def test_a_read_from_any_cursor_gives_exactly_the_events_after_it(db_ctx: Context) -> None:
    db = await _two_projects_of_turns(db_ctx)
    whole = await _read_all(db, Scope())
    alpha = await _read_all(db, Scope(projects=frozenset({"alpha"})))
    s1 = await _read_all(db, Scope(session_id="s1"))
    types = [e.type for e in s1]
    assert types[0] == "input.admitted" and types.count("turn.completed") == 2 and "part" in types
    assert [e for e in whole if e.session_id == "s1"] == s1 == alpha  # alpha holds s1 alone
    assert {e.session_id for e in whole} == {"s1", "s2"}
    positions = [e.position for e in whole]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # every cursor, on every scope, paged one row at a time too: the rest, once, in order
    for scope, stream in ((Scope(), whole), (Scope(session_id="s1"), s1)):
        for i, event in enumerate(stream):
            cursor = parse_cursor(event.cursor)
            assert cursor.position == event.position
            assert await db.read_in_thread(partial(check_cursor_sync, cursor=cursor)) is None
            assert await _read_all(db, scope, cursor.position) == stream[i + 1 :]
        assert await _read_all(db, scope, limit=1) == stream
    completed = [e.data for e in s1 if e.type == "turn.completed"]
    assert [d["input_ids"] for d in completed] == [["in-1"], ["in-3"]]
    part = next(e.data for e in s1 if e.type == "part")
    stored = await db.fetchone(
        "SELECT data FROM session_part WHERE message_id = ? AND idx = ?", (part["message_id"], part["idx"])
    )
    assert stored is not None and part["text"] == json.loads(stored["data"])["text"]
    end, end_cursor = await db.read_in_thread(live_end_sync)
    assert end >= positions[-1] and await _read_all(db, Scope(), end) == []
    assert parse_cursor(end_cursor).position == end


def test_a_cursor_is_parsed_strictly() -> None:
    assert parse_cursor("0") == Cursor(ORIGIN, None)
    assert parse_cursor("12.0.0a1b2c3d") == Cursor(Position(0, 12), "0a1b2c3d")
    for bad in ("", "x", "1.2", "01.0.0a1b2c3d", "1.0.0A1B2C3D", "1.0.0a1b2c3", "-1.0.0a1b2c3d", "1.0.0a1b2c3d\n",
                "9" * 19 + ".0.0a1b2c3d", "1." + "9" * 21 + ".0a1b2c3d", "1.0." + "a" * 70, "1\u0661.0.0a1b2c3d"):  # fmt: skip
        with pytest.raises(BadInput, match="is not one rem gave"):
            parse_cursor(bad)


@pytest.mark.both_stores
async def test_a_cursor_of_another_store_is_unknown_and_a_pruned_one_says_so(db_ctx: Context) -> None:
    db = await _two_projects_of_turns(db_ctx)
    stream = await _read_all(db, Scope(session_id="s1"))
    first, last = parse_cursor(stream[0].cursor), parse_cursor(stream[-1].cursor)

    async def check(cursor: Cursor, now: int | None = None) -> str | None:
        return await db.read_in_thread(partial(check_cursor_sync, cursor=cursor, now=now))

    assert (
        await check(Cursor(last.position, "00000000" if last.tag != "00000000" else "11111111")) == "unknown"
    )
    assert await check(Cursor(Position(last.position.xact, last.position.id + 10_000), last.tag)) == "unknown"
    assert await check(Cursor(ORIGIN, None)) is None
    day = maintenance.DAY_MS
    # within an hour of the retention edge: taken as pruned (a row after it may be gone already)
    edge = stream[0].data["time"] + 30 * day
    assert await check(first, now=edge - 2 * 3_600_000) is None
    assert await check(first, now=edge - 1_800_000) == "pruned"
    assert await maintenance.prune_events(db, now=clock.now_ms() + 31 * day) > 0
    assert await check(first) == "pruned"


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_row_whose_transaction_commits_late_is_never_skipped(db_ctx: Context, db_url: str) -> None:
    """Journal ids come from a sequence: A takes a lower id than B, B commits first. A reader that
    followed ids would read B, move past A's id and never see A. The stream holds B back while A
    runs, then gives A and B in an order every later read agrees on."""
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first", input_id="in-0")
    start = (await _read_all(db, Scope()))[-1].position
    insert = "INSERT INTO event (time, kind, actor, session_id, target, data) VALUES (%s, 'input.admitted', 'test', 's1', %s, '{}') RETURNING id"
    with psycopg.connect(db_url, autocommit=True) as late, psycopg.connect(db_url, autocommit=True) as early:
        late.execute("BEGIN")
        (late_id,) = late.execute(insert, (clock.now_ms(), "late")).fetchone()  # type: ignore[misc]
        (early_id,) = early.execute(insert, (clock.now_ms(), "early")).fetchone()  # type: ignore[misc]
        assert late_id < early_id  # the hazard: a lower id, committed later
        held: Page = await db.read_in_thread(partial(read_sync, after=start))
        assert held.events == [] and held.held  # committed, but behind a transaction still running
        late.execute("COMMIT")
    page: Page = await db.read_in_thread(partial(read_sync, after=start))
    assert [e.data["input_id"] for e in page.events] == ["late", "early"] and not page.held
    assert [e.data["input_id"] for e in await _read_all(db, Scope(session_id="s1"))][-2:] == ["late", "early"]


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_the_live_end_is_the_newest_transaction_by_number_not_by_its_text(
    db_ctx: Context, db_url: str
) -> None:
    """Transaction ids cross a power of ten (9 -> 10, 999 -> 1000) in every store's life; the live
    end the project stream starts at, and the hub reads up to, is still the newest one."""
    db = await db_ctx.db()
    insert = (
        "INSERT INTO event (time, kind, actor, session_id, target, data, xact) "
        "VALUES (%s, 'input.admitted', 'test', 's1', %s, '{}', %s::xid8) RETURNING id"
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM event")  # the template's own rows: theirs would be the newest
        for xact in ("9", "10"):  # both long committed: below any snapshot's horizon
            (newest,) = conn.execute(insert, (clock.now_ms(), f"x{xact}", xact)).fetchone()  # type: ignore[misc]
    position, cursor = await db.read_in_thread(live_end_sync)
    assert position == Position(10, newest) and cursor.startswith(f"{newest}.10.")
