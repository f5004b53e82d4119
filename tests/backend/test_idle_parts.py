"""Streamed parts are journaled (schema v13, for the API's event streams) but are no news to an idle
daemon: a commit whose only journal rows are `message.part` is set aside as upkeep, without a pass;
a commit that journals anything else still wakes it. Otherwise every part a turn streams would run a
pass of the summarizer and of Dream (benchmarks/part_wakes.py measures it under load)."""

from __future__ import annotations

import asyncio

import pytest

from backend.core import clock
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import workers
from backend.store.db import Database
from tests.helpers import await_until

pytestmark = pytest.mark.both_stores


class Idle(Daemon):
    """A daemon with nothing to do but count the passes it is woken for."""

    role = workers.WorkerRole.DREAM
    passes = 0

    async def run_pass(self) -> int:
        self.passes += 1
        return 0


async def _journal(db: Database, *, parts_only: bool) -> None:
    now = clock.now_ms()
    async with db.tx() as conn:
        if parts_only:  # a part's row journals itself (a trigger): its only journal row
            await conn.execute(
                "INSERT INTO session_part (id, message_id, session_id, idx, type, time_created, data) "
                "SELECT 'm1:p' || (count(*) + 1), 'm1', 's1', count(*) + 1, 'text', ?, '{}' "
                "FROM session_part WHERE message_id = 'm1'",
                (now,),
            )
        else:
            await conn.execute(
                "INSERT INTO event (time, kind, actor, session_id, data) VALUES (?, 'execution.step', 't', 's1', '{}')",
                (now,),
            )


async def test_a_commit_of_streamed_parts_alone_wakes_no_idle_daemon(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_DAEMON_IDLE_POLL_MS", "60000")
    monkeypatch.setattr(workers, "HEARTBEAT_INTERVAL_MS", 3_600_000)  # no beat of its own meanwhile
    db = await db_ctx.db()
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s1', ?, ?)", (now, now)
        )
        await conn.execute(
            "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
            "VALUES ('m1', 's1', 'assistant', 1, ?, ?, '{}')",
            (now, now),
        )
    daemon = Idle(Context(db_ctx.data, db_url=db_ctx.db_url, start_chroma=False))
    task = asyncio.create_task(daemon.run())
    try:
        await await_until(lambda: _is(daemon.idle is not None and daemon.idle.live), message="the watch up")
        passes = daemon.passes
        await _journal(db, parts_only=False)
        await await_until(lambda: _is(daemon.passes > passes), message="a pass for news")
        assert daemon.idle is not None
        passes, upkeep = daemon.passes, daemon.idle.stats.upkeep
        for _ in range(3):
            await _journal(db, parts_only=True)
        await await_until(lambda: _is(daemon.idle.stats.upkeep > upkeep), message="the parts set aside")  # type: ignore[union-attr]
        assert daemon.passes == passes
        await _journal(db, parts_only=False)
        await await_until(lambda: _is(daemon.passes > passes), message="a pass for news")
    finally:
        daemon.draining.set()
        await asyncio.wait_for(task, 10)
        await daemon.ctx.close()


async def _is(value: bool) -> bool:
    return value
