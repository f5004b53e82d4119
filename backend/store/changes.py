"""The PostgreSQL store's change feed, heard: LISTEN on `rem_change` (schema_pg's CHANGE_FEED).

An idle daemon LISTENs on `rem_journal` instead (PostgreSQL migration 16): only
the commits that wrote the journal, the ones that can make work for it.

What the console uses on PostgreSQL instead of watchfiles on state.db's WAL.
`listen_changes(url)` holds one dedicated autocommit connection (never a
transaction open: a LISTEN-ing session in a transaction would hold back
vacuum) and yields a `StoreEvent` when it starts listening (anything may have
been committed while it was not: the reader refreshes), once per burst of
notifications (every notification already queued is taken with it), and when
the connection is lost (with the seconds until the next attempt: it retries
with a doubling backoff, forever, until closed).

A connection that dies silently (a host gone, a cable pulled) sends nothing:
after `keepalive_s` without a notification the listener asks the server
something, so a dead link is found within about `keepalive_s` + the connect
timeout, never left to look like a quiet store.

Behind a transaction-mode pooler (`REM_DB_POOLED`) a LISTEN cannot hold: the
pooler hands the server session to other clients between transactions. The
LISTEN then goes to `REM_DB_LISTEN_URL`, a direct connection to the server,
when one is given; without one, `listen_changes` polls instead (`poll_changes`:
the server's WAL position every `REM_DB_POLL_MS`, through the pooler) and
yields the same events, so every reader (the console, an idle daemon, the
API's streams) takes the same door. `feed_of(url)` says which is in use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from backend.core.redact import redact_text
from backend.core.settings import settings
from backend.store.postgres import display_url
from backend.store.schema_pg import CHANGE_CHANNEL, JOURNALED

# the channel an idle daemon LISTENs on (journaled commits only): named here, where it imports the feed
from backend.store.schema_pg import JOURNAL_CHANNEL as JOURNAL_CHANNEL

log = logging.getLogger("rem.changes")

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
KEEPALIVE_S = 5.0
CONNECT_TIMEOUT_S = 3


@dataclass(frozen=True)
class StoreEvent:
    """`listening` (connected; changes may have been missed), `changed`, or `lost` (retrying)."""

    kind: Literal["listening", "changed", "lost"]
    error: str = ""
    retry_in_s: float = 0.0
    notifications: int = 0  # how many committed transactions this `changed` stands for
    journaled: int = 0  # how many of them wrote the journal (`event`): the rest were upkeep


async def listen_changes(
    url: str,
    *,
    keepalive_s: float = KEEPALIVE_S,
    first_backoff_s: float = FIRST_BACKOFF_S,
    ignore_pids: Callable[[], Collection[int]] | None = None,
    channel: str = CHANGE_CHANNEL,
) -> AsyncIterator[StoreEvent]:
    """Yield this store's changes as they commit, reconnecting when the server goes away.

    `ignore_pids`: server backends whose commits are not news to the listener
    (a daemon's own connection: its own writes must not wake it). `channel`:
    every commit (`CHANGE_CHANNEL`, the console's), or the journaled ones only
    (`JOURNAL_CHANNEL`, an idle daemon's: upkeep never reaches it).
    """
    target = listen_url(url)
    if target is None:
        async for event in poll_changes(url, first_backoff_s=first_backoff_s):
            yield event
        return
    url = target
    backoff = first_backoff_s
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            ) as conn:
                await conn.execute(f"LISTEN {channel}")
                log.info("listening for changes on %s", display_url(url))
                backoff = first_backoff_s
                yield StoreEvent("listening")
                async for event in _notifications(conn, keepalive_s, ignore_pids or _nobody):
                    yield event
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = redact_text(error, url)  # shown in the console's banner and logged
            log.warning("change feed of %s lost (%s); retrying in %.1f s", display_url(url), error, backoff)
            yield StoreEvent("lost", error=error, retry_in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def _nobody() -> Collection[int]:
    return ()


def listen_url(url: str) -> str | None:
    """Where a LISTEN for the store at `url` goes: REM_DB_LISTEN_URL, else `url` itself unless it
    is a pooler's (REM_DB_POOLED); None: nowhere, poll instead."""
    if settings.db_listen_url:
        return settings.db_listen_url
    return None if settings.db_pooled else url


def feed_of(url: str) -> str:
    """How this process hears the store's commits, in words for `rem status`."""
    if settings.db_listen_url:
        return f"LISTEN on REM_DB_LISTEN_URL ({display_url(settings.db_listen_url)})"
    if settings.db_pooled:
        return f"poll every {settings.db_poll_ms} ms (REM_DB_POOLED without REM_DB_LISTEN_URL)"
    return "LISTEN on the store's connection"


async def poll_changes(url: str, *, first_backoff_s: float = FIRST_BACKOFF_S) -> AsyncIterator[StoreEvent]:
    """`listen_changes` without a LISTEN: the server's WAL position every REM_DB_POLL_MS; a move
    is one `changed` (counted as journaled: a poll cannot tell news from upkeep)."""
    backoff = first_backoff_s
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, prepare_threshold=None
            ) as conn:
                log.info("polling %s for changes every %d ms", display_url(url), settings.db_poll_ms)
                backoff = first_backoff_s
                # the position first: a commit made once `listening` is out is a change from it
                last = await _wal_position(conn)
                yield StoreEvent("listening")
                async for position in _positions(conn, settings.db_poll_ms / 1000):
                    if position != last:
                        last = position
                        yield StoreEvent("changed", notifications=1, journaled=1)
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = redact_text(error, url)
            log.warning("change poll of %s lost (%s); retrying in %.1f s", display_url(url), error, backoff)
            yield StoreEvent("lost", error=error, retry_in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


async def _notifications(
    conn: psycopg.AsyncConnection[object], keepalive_s: float, ignore_pids: Callable[[], Collection[int]]
) -> AsyncIterator[StoreEvent]:
    """A `changed` for every burst of notifications: whatever libpq holds or the socket has when
    the listener looks (so the commits made while its reader was busy are one event), then a
    wait for the socket to turn readable or the keepalive to fall due.

    Read through libpq (`conn.pgconn`) rather than psycopg's `notifies()`: that takes the
    connection's lock and turns the loop at least once a call (it waits on the socket even
    with `timeout=0`, and ends on an exception): a commit heard was two or three loop turns,
    now one, and the listener's share of the console's UI thread at 10 commits/s fell from
    ~0.5 to ~0.3 ms a refresh. What psycopg itself takes in (during the keepalive's query)
    comes to the same list through a notify handler.
    """
    pgconn, fd, encoding = conn.pgconn, conn.fileno(), conn.info.encoding
    taken: list[psycopg.Notify] = []
    conn.add_notify_handler(taken.append)
    while True:
        pgconn.consume_input()  # never blocks: what the socket has now (a lost server raises)
        while (pgn := pgconn.notifies()) is not None:
            taken.append(psycopg.Notify(pgn.relname.decode(encoding), pgn.extra.decode(encoding), pgn.be_pid))
        if taken:
            event = _burst(taken, ignore_pids())
            taken.clear()
            if event is not None:
                yield event
            continue  # look again: commits made while the reader was busy are one more event
        if not await _readable(fd, keepalive_s):
            await conn.execute("SELECT 1")  # quiet: is the server still there?


def _burst(taken: list[psycopg.Notify], ignore: Collection[int]) -> StoreEvent | None:
    """One `changed` for a burst of notifications (None: only ignored backends' commits)."""
    xacts, journaled = set[str](), set[str]()
    for notify in taken:
        if notify.pid not in ignore:
            xact = notify.payload.removeprefix(JOURNALED)
            xacts.add(xact)
            if xact != notify.payload:
                journaled.add(xact)
    return StoreEvent("changed", notifications=len(xacts), journaled=len(journaled)) if xacts else None


async def _positions(conn: psycopg.AsyncConnection[object], poll_s: float) -> AsyncIterator[str | None]:
    """The WAL position once every `poll_s`, however long the reader took over the last change: a
    busy store moves it at every look, and back-to-back looks cost the pooler a query a round trip
    (a look overdue, after a slow reader, goes at once: nothing committed since `last` is missed)."""
    loop = asyncio.get_running_loop()
    due = loop.time() + poll_s
    while True:
        await asyncio.sleep(max(0.0, due - loop.time()))
        due = loop.time() + poll_s
        yield await _wal_position(conn)


async def _wal_position(conn: psycopg.AsyncConnection[object]) -> str | None:
    """The server's WAL position: every committed write moves it (other databases' too: a spurious
    change costs a reader one look, a missed one cannot happen)."""
    cursor = await conn.execute("SELECT pg_current_wal_lsn()::text")
    row: Any = await cursor.fetchone()
    return None if row is None else str(row[0])


async def _readable(fd: int, timeout_s: float) -> bool:
    """Whether socket `fd` turns readable within `timeout_s`, waited on by the loop alone.

    Not `notifies(timeout=...)`: psycopg's wait wakes every 0.1 s to look for a signal
    (its `_WAIT_INTERVAL`), ten wake-ups a second for every idle listener; here the
    loop sleeps in epoll until the server sends a byte or the keepalive falls due.
    Not `asyncio.wait_for` either: on Python 3.11 a cancellation that lands just as
    the socket turns readable is swallowed (the wait returns its result), and a
    daemon shutting down then waited for ever on a listener that would not stop.
    """
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()

    def settle(readable: bool) -> None:
        if not ready.done():
            ready.set_result(readable)

    loop.add_reader(fd, settle, True)
    keepalive = loop.call_later(timeout_s, settle, False)
    try:
        return await ready
    finally:
        keepalive.cancel()
        loop.remove_reader(fd)
