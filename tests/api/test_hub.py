"""The hub on PostgreSQL, live: a subscriber gets a row whose transaction commits late, before the
rows that committed while it ran; and rows held back by a transaction that writes no rem table (so
sends no notification when it ends) still arrive, read again on the hub's short timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from backend.api.hub import Frame, Hub
from backend.core import clock
from backend.execution import sessions
from backend.runtime.context import Context
from backend.store.stream import ORIGIN, Scope
from tests.helpers import await_until

pytestmark = pytest.mark.parametrize("store", ["postgres"], indirect=True)

INSERT = (
    "INSERT INTO event (time, kind, actor, session_id, target, data) "
    "VALUES (%s, 'input.admitted', 'test', 's1', %s, '{}')"
)


async def _next_events(frames: AsyncIterator[Frame | None], count: int) -> list[str]:
    got: list[str] = []
    while len(got) < count:
        frame = await asyncio.wait_for(anext(frames), 10)
        if frame is not None:
            got.append(frame.payload.decode().split('"input_id":"')[1].split('"')[0])
    return got


async def test_a_live_subscriber_gets_a_late_commit_first(db_ctx: Context, db_url: str) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first", input_id="in-0")
    hub = Hub(db_ctx)
    try:
        frames = hub.follow(Scope(session_id="s1"), ORIGIN)
        assert await _next_events(frames, 1) == ["in-0"]
        following = asyncio.ensure_future(_next_events(frames, 2))  # caught up: it subscribes, waits
        await await_until(lambda: _above(hub.subscribers, 0), message="the follower subscribed")
        with psycopg.connect(db_url, autocommit=True) as late:
            late.execute("BEGIN")
            late.execute(INSERT, (clock.now_ms(), "late"))
            await sessions.admit(db, "s1", "second", input_id="early")  # commits, and is heard
            await await_until(lambda: _above(hub.stats.held_rereads, 0), message="the hub holding rows back")
            late.execute("COMMIT")
        assert await following == ["late", "early"]
    finally:
        await hub.close()


async def test_rows_held_back_by_a_silent_transaction_arrive_when_it_ends(
    db_ctx: Context, db_url: str
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first", input_id="in-0")
    hub = Hub(db_ctx)
    try:
        frames = hub.follow(Scope(session_id="s1"), ORIGIN)
        assert await _next_events(frames, 1) == ["in-0"]
        following = asyncio.ensure_future(_next_events(frames, 1))
        await await_until(lambda: _above(hub.subscribers, 0), message="the follower subscribed")
        with psycopg.connect(db_url, autocommit=True) as silent:
            silent.execute("BEGIN")
            silent.execute("SELECT pg_current_xact_id()")  # an id, so the horizon; no write, no NOTIFY
            await sessions.admit(db, "s1", "second", input_id="in-1")
            # read again and again while held (a row delivered would end the held reads)
            await await_until(lambda: _above(hub.stats.held_rereads, 2), message="the hub reading again")
            silent.execute("COMMIT")
        assert await following == ["in-1"]
    finally:
        await hub.close()


async def _above(value: int, floor: int) -> bool:
    return value > floor
