"""PostgreSQL's change feed: a notification is part of the writing transaction, one per transaction."""

from __future__ import annotations

import asyncio
import selectors
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from backend.core.datadir import DataDir
from backend.programs.postgres_server import LocalPostgres
from backend.runtime.context import Context
from backend.store import schema_pg
from backend.store.changes import StoreEvent, listen_changes, poll_changes
from tests import pg

T = TypeVar("T")


@pytest.fixture
def store() -> str:
    """Every test here runs on PostgreSQL (`db_url` is a fresh migrated database)."""
    return "postgres"


async def payloads_until(listener: psycopg.AsyncConnection[object], last: str) -> list[str]:
    """Every transaction id heard, in commit order, up to and including `last`, each once (a
    transaction that wrote the journal also notifies `j<id>`, first) (fails after 10 s)."""
    heard: list[str] = []
    async with asyncio.timeout(10):
        while last not in heard:
            async for notify in listener.notifies(timeout=1.0, stop_after=1):
                xact = notify.payload.removeprefix(schema_pg.JOURNALED)
                if xact not in heard:
                    heard.append(xact)
    return heard


def write_in_one_transaction(url: str, *, commit: bool) -> str:
    """Three statements on two tables in one transaction; returns its transaction id (the payload)."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (1, 'a', 'test', '{}')")
        conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (2, 'b', 'test', '{}')")
        conn.execute("UPDATE worker SET heartbeat_at = 1")
        xact = str(conn.execute("SELECT pg_current_xact_id()").fetchone()[0])  # type: ignore[index]
        conn.commit() if commit else conn.rollback()
    return xact


async def test_a_notification_is_sent_by_the_writing_transaction_and_only_if_it_commits(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {schema_pg.CHANGE_CHANNEL}")
        rolled_back = await asyncio.to_thread(write_in_one_transaction, db_url, commit=False)
        committed = await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
        # commit order is delivery order: a notification of the rolled-back one would come first
        assert await payloads_until(listener, committed) == [committed]
        assert rolled_back != committed


async def test_the_journal_channel_carries_only_commits_that_wrote_the_journal(db_url: str) -> None:
    """What idle daemons LISTEN on (PostgreSQL 16): upkeep, such as a heartbeat, is not sent there."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {schema_pg.JOURNAL_CHANNEL}")
        with psycopg.connect(db_url) as conn:  # a heartbeat: a write, no journal row
            conn.execute("SELECT pg_current_xact_id()")
            conn.execute("UPDATE worker SET heartbeat_at = 1")
        journaled = await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
        first = [(n.channel, n.payload) async for n in listener.notifies(timeout=10.0, stop_after=1)]
        assert first == [(schema_pg.JOURNAL_CHANNEL, schema_pg.JOURNALED + journaled)]


async def test_a_transaction_that_writes_nothing_sends_nothing(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {schema_pg.CHANGE_CHANNEL}")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE worker SET heartbeat_at = 1 WHERE owner_id = 'nobody'")  # a fenced-off write
            conn.execute("DELETE FROM event WHERE id < 0")
        committed = await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
        assert await payloads_until(listener, committed) == [committed]


async def test_every_table_but_the_version_table_has_the_trigger(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        tables = {
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        }
        watched = {
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = 'rem_change'"
            )
        }
    assert watched == tables - {schema_pg.VERSION_TABLE} and len(watched) > 10


async def collect(events: AsyncIterator[StoreEvent], kinds: list[str]) -> list[StoreEvent]:
    """Events until their kinds are `kinds` (fails after 15 s)."""
    seen: list[StoreEvent] = []
    async with asyncio.timeout(15):
        while [e.kind for e in seen] != kinds:
            seen.append(await anext(events))
    return seen


async def test_the_listener_reports_a_lost_connection_and_listens_again(db_url: str) -> None:
    events = listen_changes(db_url, first_backoff_s=0.05)
    try:
        await collect(events, ["listening"])
        await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
        changed = await collect(events, ["changed"])
        # three statements on two tables, one transaction: one change, which wrote the journal
        assert (changed[0].notifications, changed[0].journaled) == (1, 1)
        with psycopg.connect(db_url) as conn:  # upkeep (a heartbeat): a write, but no journal row
            conn.execute("SELECT pg_current_xact_id()")  # the transaction has an id: it notifies
            conn.execute("UPDATE worker SET heartbeat_at = 2")
        upkeep = await collect(events, ["changed"])
        assert (upkeep[0].notifications, upkeep[0].journaled) == (1, 0)
        with psycopg.connect(db_url, autocommit=True) as killer:
            killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
            )
        lost, again = await collect(events, ["lost", "listening"])
        assert lost.error and lost.retry_in_s == 0.05
        await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
        await collect(events, ["changed"])
    finally:
        await events.aclose()  # type: ignore[attr-defined]


class CountingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The event loop's selector, counting how often the loop woke up."""

    wakeups = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.wakeups += 1
        return super().select(timeout)


def on_counting_loop(main: Callable[[CountingSelector], Coroutine[Any, Any, T]]) -> T:
    """`main(selector)` run to its end on a fresh event loop whose wake-ups `selector` counts."""
    selector = CountingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        return loop.run_until_complete(main(selector))
    finally:
        loop.close()


def test_an_idle_listener_sleeps_until_the_server_sends_something(db_url: str) -> None:
    """Listening wakes the loop for a notification or the keepalive, not ten times a second.

    psycopg's `notifies(timeout=...)` wakes every 0.1 s (its `_WAIT_INTERVAL`): an idle daemon
    on PostgreSQL paid ten loop turns a second for nothing. A loop under load wakes less, never more.
    """

    async def listen_a_while(selector: CountingSelector) -> tuple[int, list[StoreEvent]]:
        events = listen_changes(db_url, keepalive_s=30)
        try:
            await collect(events, ["listening"])
            pending = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0.2)  # the listener is waiting now
            before = selector.wakeups
            await asyncio.sleep(2.0)
            idle_wakeups = selector.wakeups - before
            await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
            async with asyncio.timeout(10):
                heard = [await pending]
            return idle_wakeups, heard
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    idle_wakeups, heard = on_counting_loop(listen_a_while)
    assert [e.kind for e in heard] == ["changed"] and heard[0].notifications == 1
    assert idle_wakeups <= 3, idle_wakeups  # the test's own sleep: one; psycopg's wait: twenty


def test_a_commit_heard_costs_the_listener_one_loop_turn_at_most(db_url: str) -> None:
    """The listener takes what libpq and the socket hold before it waits, and waits on the socket
    alone: a commit is one loop turn (the socket turning readable), none when its notification is
    already there. psycopg's `notifies(timeout=0)` turned the loop once a look even with nothing
    to read: three turns a commit (the wait, the read, the look after it), on the console's UI
    thread under a busy fleet."""
    commits = 20

    async def hear_commits(selector: CountingSelector) -> tuple[int, list[StoreEvent]]:
        events = listen_changes(db_url, keepalive_s=30)
        heard: list[StoreEvent] = []
        try:
            await collect(events, ["listening"])
            with psycopg.connect(db_url, autocommit=True) as writer:
                before = selector.wakeups
                for _ in range(commits):  # written from the loop's thread: the writer turns no loop
                    writer.execute(
                        "INSERT INTO event (time, kind, actor, data) VALUES (1, 'a', 'test', '{}')"
                    )
                    async with asyncio.timeout(10):
                        heard.append(await anext(events))
                return selector.wakeups - before, heard
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    turns, heard = on_counting_loop(hear_commits)
    assert [(e.kind, e.notifications) for e in heard] == [("changed", 1)] * commits
    assert turns <= commits, turns


async def test_commits_heard_during_the_keepalive_query_are_reported(db_url: str) -> None:
    """A notification that arrives while the listener asks its keepalive query is taken in by
    psycopg, not left on the socket: it reaches the listener through its notify handler (with a
    keepalive due at once, the listener is in that query most of the time)."""
    commits = 30
    events = listen_changes(db_url, keepalive_s=0.0)
    try:
        await collect(events, ["listening"])

        def write() -> None:
            with psycopg.connect(db_url, autocommit=True) as writer:
                for _ in range(commits):
                    writer.execute(
                        "INSERT INTO event (time, kind, actor, data) VALUES (1, 'a', 'test', '{}')"
                    )

        writing = asyncio.create_task(asyncio.to_thread(write))
        heard = 0
        async with asyncio.timeout(15):
            while heard < commits:
                event = await anext(events)
                assert event.kind == "changed", event
                heard += event.notifications
        await writing
        assert heard == commits
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def test_another_database_on_the_server_is_not_heard(db_url: str, pg_server: LocalPostgres) -> None:
    for other in pg.database_url(pg_server):
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener:
            await listener.execute(f"LISTEN {schema_pg.CHANGE_CHANNEL}")
            elsewhere = await asyncio.to_thread(write_in_one_transaction, other, commit=True)
            here = await asyncio.to_thread(write_in_one_transaction, db_url, commit=True)
            assert await payloads_until(listener, here) == [here]
            assert elsewhere != here


async def test_a_database_at_version_7_gets_the_change_feed_by_migrating(
    pg_server: LocalPostgres, tmp_path: Path
) -> None:
    for url in pg.database_url(pg_server, migrated=False):
        with psycopg.connect(url) as conn:  # as a rem from before the change feed left it
            for number, statements in enumerate(schema_pg.pg_migrations()[:7], start=1):
                for statement in statements:
                    conn.execute(statement)  # type: ignore[arg-type]
                conn.execute(f"INSERT INTO {schema_pg.VERSION_TABLE} VALUES (%s, 0)", (number,))
        ctx = Context(DataDir(tmp_path / "d"), db_url=url, start_chroma=False)
        await ctx.db()
        await ctx.close()
        with psycopg.connect(url) as conn:
            assert conn.execute(f"SELECT max(version) FROM {schema_pg.VERSION_TABLE}").fetchone() == (
                schema_pg.pg_schema_version(),
            )
            triggers = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'rem_change'").fetchone()
        assert triggers is not None and triggers[0] > 10


async def test_an_idle_daemon_on_postgres_is_woken_by_the_feed_not_by_polling_nor_by_upkeep(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle daemon asks the server nothing until another process journals something; then it
    looks at the journal's head once and runs a pass.

    It LISTENs on the journal channel: its own heartbeats and another worker's reach the
    process not at all (no notification to set aside), and a journaled commit wakes it. The
    slow poll is raised so that only the feed can end an idle wait.
    """
    from backend.runtime.daemon import Daemon
    from backend.runtime.idle import IdleWait
    from backend.store.db import Database

    monkeypatch.setenv("REM_DAEMON_IDLE_POLL_MS", "60000")
    polls = 0
    original = Database.data_version

    async def counted(self: Database) -> int:
        nonlocal polls
        polls += 1
        return await original(self)

    monkeypatch.setattr(Database, "data_version", counted)
    heard = 0  # notifications that reached the daemon's feed (each is checked against its own backend)
    own_pids = Database.server_pids

    def counted_pids(self: Database) -> frozenset[int]:
        nonlocal heard
        heard += 1
        return own_pids(self)

    monkeypatch.setattr(Database, "server_pids", counted_pids)

    class Idle(Daemon):
        role = "dream"
        passes = 0

        async def run_pass(self) -> int:
            self.passes += 1
            return 0

    def heartbeat_at(owner_id: str) -> int:
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT heartbeat_at FROM worker WHERE owner_id = %s", (owner_id,)).fetchone()
        assert row is not None
        return int(row[0])

    ctx = Context(DataDir(tmp_path / "d"), db_url=db_url, start_chroma=False)
    daemon = Idle(ctx)
    task = asyncio.create_task(daemon.run())
    try:
        # the feed is up and its `listening` (anything may have committed before) had the head
        # looked at: nothing journaled since the first pass (which started before the feed could,
        # so `listening` always comes after it), so no second pass
        async with asyncio.timeout(10):
            while not (daemon.idle is not None and daemon.idle.stats.upkeep == 1 and daemon.passes == 1):
                await asyncio.sleep(0.02)
        assert daemon.idle.live and heard == 0  # its registration committed before it listened
        reads = polls = 0  # the first pass looked at the store: the feed was not up yet
        read_marks = IdleWait._read_marks

        async def counted_reads(self: IdleWait, *args: Any, **kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            return await read_marks(self, *args, **kwargs)

        monkeypatch.setattr(IdleWait, "_read_marks", counted_reads)
        # its own heartbeat commits (a beat is due every third of the liveness window)
        beat = await asyncio.to_thread(heartbeat_at, daemon.owner_id)
        async with asyncio.timeout(10):
            while await asyncio.to_thread(heartbeat_at, daemon.owner_id) == beat:
                await asyncio.sleep(0.05)
        with psycopg.connect(db_url) as other:  # another worker's heartbeat: a write, no journal row
            other.execute("SELECT pg_current_xact_id()")
            other.execute("UPDATE worker SET heartbeat_at = heartbeat_at")
        with psycopg.connect(db_url) as other:  # news: a commit that journaled something
            other.execute("INSERT INTO event (time, kind, actor, data) VALUES (1, 'x', 'test', '{}')")
        async with asyncio.timeout(5):
            while daemon.passes == 1:
                await asyncio.sleep(0.01)
        # notifications come in commit order: both heartbeats, had they reached the process, were
        # looked at before the news. Only the news did, and it cost one look at the journal's head
        # (did it journal more than streamed parts?) and the pass's own mark, never a poll
        assert (heard, daemon.idle.stats.changed, daemon.idle.stats.upkeep) == (1, 1, 1)
        assert reads == 2 and polls == 0, (reads, polls)
    finally:
        daemon.draining.set()
        await asyncio.wait_for(task, 10)
        await ctx.close()


async def test_a_listener_cancelled_as_its_socket_turns_readable_stops() -> None:
    """A shutdown's cancel that lands in the same loop turns as a notification must stop the wait.

    With `asyncio.wait_for` (Python 3.11) the cancel was swallowed when the socket had just
    turned readable: the wait returned, the listener went on, and the daemon waiting for it to
    end never exited. The cancel is tried at each loop turn after the byte arrives.
    """
    from backend.store.changes import _readable

    for turns in range(6):
        ours, theirs = socket.socketpair()
        try:
            task = asyncio.create_task(_readable(ours.fileno(), 30.0))
            await asyncio.sleep(0)  # the wait is set up
            theirs.send(b"x")
            for _ in range(turns):
                await asyncio.sleep(0)
            requested = task.cancel()  # False: the wait had already returned, nothing to stop
            async with asyncio.timeout(5):
                outcome = await asyncio.gather(task, return_exceptions=True)
            if requested:
                assert isinstance(outcome[0], asyncio.CancelledError), (turns, outcome)
            else:
                assert outcome == [True], (turns, outcome)
        finally:
            ours.close()
            theirs.close()


async def test_the_polled_feed_looks_once_a_poll_while_the_store_is_busy(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a pooler without a LISTEN (`poll_changes`): commits without a pause move the WAL at
    every look, and a feed that looked again at once after each change asked the server a query a
    round trip; it looks once a poll, and hears them."""
    monkeypatch.setenv("REM_DB_POLL_MS", "200")
    stop = asyncio.Event()

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                await conn.execute(
                    "INSERT INTO event (time, kind, actor, data) VALUES (1, 'a', 'test', '{}')"
                )

    feed = poll_changes(db_url)
    assert (await asyncio.wait_for(feed.__anext__(), 10)).kind == "listening"
    writer = asyncio.create_task(write())
    loop = asyncio.get_running_loop()
    started, changes = loop.time(), 0
    try:
        while loop.time() - started < 1.5:
            event = await asyncio.wait_for(feed.__anext__(), 10)
            changes += event.kind == "changed"
    finally:
        stop.set()
        await writer
        await feed.aclose()
    looks = (loop.time() - started) / 0.2
    assert 1 <= changes <= looks + 2, (changes, looks)
