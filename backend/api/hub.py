"""The server's one ear on the journal, fanned out to every event stream and every waiting request.

One change-feed listener per server process, never one per stream: SQLite's
watch on state.db and its WAL (`backend.store.watch`, inotify), PostgreSQL's
LISTEN on the journal channel (`backend.store.changes`). Each change heard is
one read of the new journal rows after the hub's position
(`backend.store.stream.read_sync`, on a read-only connection of the hub's
own), each row encoded once as an SSE frame and offered to the subscribers
whose scope holds it (by session, by project, or every project). No stream
reads the store on its own except to catch up from its cursor, and nothing
polls: on PostgreSQL, rows held back by a transaction still running are read
again on a short timer, because that transaction may write no rem table and
so end without a notification.

Each subscriber's buffer is bounded (`MAX_QUEUED_FRAMES`, `MAX_QUEUED_BYTES`):
one that falls behind is closed (`StreamClosed("slow")`), its buffer dropped,
never an event skipped: its client resumes from the last cursor it got.
`Hub.open_streams` is the number of event streams open (the server's worker
info and `rem_api_streams_open` read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from backend.api.pinger import PING, Pinger
from backend.core.errors import DatabaseUnreachable, RemError
from backend.runtime.context import Context
from backend.store.db import Conn, Database
from backend.store.stream import (
    ORIGIN,
    Cursor,
    Page,
    Position,
    Scope,
    StreamEvent,
    check_cursor_sync,
    live_end_sync,
    read_sync,
)
from backend.store.watch import state_db_changes

log = logging.getLogger("rem.hub")

T = TypeVar("T")
HEARTBEAT_S = 15.0
# a subscriber's bound: past either, it is closed (its client resumes from its cursor)
MAX_QUEUED_FRAMES = 4096
MAX_QUEUED_BYTES = 4 * 1024 * 1024
# rows per read of the hub: a read's frames are offered at once, so a subscriber's bound is above it
PAGE_ROWS = 256
# PostgreSQL: rows held back by the horizon are read again after this, doubling while nothing moves
HELD_FIRST_S = 0.02
HELD_MAX_S = 1.0
# without a watch (the inotify limit reached): the journal is read at this pace instead
FALLBACK_POLL_S = 0.25
FEED_START_S = 10.0
READ_RETRY_S = 0.5


class StreamClosed(Exception):
    """A subscription ended by the hub: `slow` (its buffer filled), `drain` (the server stops)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Frame:
    """One event as the hub hands it out: where it is, what it is, and its SSE bytes (encoded once)."""

    position: Position
    type: str
    session_id: str
    project: str | None
    payload: bytes

    @classmethod
    def of(cls, event: StreamEvent) -> Frame:
        data = json.dumps(event.data, separators=(",", ":"))  # ASCII: no line break, no lone surrogate
        payload = f"id: {event.cursor}\nevent: {event.type}\ndata: {data}\n\n".encode()
        return cls(event.position, event.type, event.session_id, event.project, payload)


@dataclass
class HubStats:
    """What the hub did since it started (for the logs, the metrics and the benchmarks)."""

    reads: int = 0
    unread: int = 0  # changes heard while nobody followed: not read
    held_rereads: int = 0
    frames: int = 0
    closed_slow: int = 0
    pings_written: int = 0  # heartbeats the ticker wrote onto an idle stream's connection itself
    pings_woken: int = 0  # heartbeats handed to a stream's task (woken to send one)


class Subscription:
    """One subscriber's bounded buffer of frames, in journal order."""

    def __init__(
        self, hub: Hub, scope: Scope, max_frames: int, max_bytes: int, pinger: Pinger | None = None
    ) -> None:
        self.hub = hub
        self.scope = scope
        self.pinger = pinger
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.closed: str | None = None
        self._queue: deque[Frame] = deque()
        self._bytes = 0
        self._ping = False
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, frame: Frame) -> None:
        """Queue `frame`; a subscriber whose buffer is full is closed instead (never a frame skipped)."""
        if self.closed is not None:
            return
        if len(self._queue) >= self.max_frames or self._bytes + len(frame.payload) > self.max_bytes:
            self.hub.stats.closed_slow += 1
            log.info(
                "closed a slow event stream (%d frames, %d bytes waiting)", len(self._queue), self._bytes
            )
            self.close("slow")
            return
        self._queue.append(frame)
        self._bytes += len(frame.payload)
        self._wake()

    @property
    def idle(self) -> bool:
        """Whether the subscriber's task waits for its next frame with none queued (so not inside a `send`)."""
        return not self._queue and self._waiter is not None and not self._waiter.done()

    def ping(self) -> None:
        """A heartbeat falls due: written onto the connection at once when the subscriber's task
        waits for a frame (`backend.api.pinger`), else its `next` returns None once."""
        write = self.pinger.write if self.pinger is not None else None
        if self.idle and write is not None and write(PING):
            self.hub.stats.pings_written += 1
            return
        self.hub.stats.pings_woken += 1
        self._ping = True
        self._wake()

    def close(self, reason: str) -> None:
        """End the subscription: its buffer is dropped, its reader gets `StreamClosed(reason)`."""
        if self.closed is None:
            self.closed = reason
            self._queue.clear()
            self._bytes = 0
            self.hub.unsubscribe(self)
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, timeout: float | None = None) -> Frame | None:
        """The next frame; None when a heartbeat fell due or `timeout` ran out; StreamClosed once closed."""
        loop = asyncio.get_running_loop()
        while not self._queue:
            if self.closed is not None:
                raise StreamClosed(self.closed)
            if self._ping:
                self._ping = False
                return None
            self._waiter = waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _settle, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if timeout is not None and not self._queue and self.closed is None and not self._ping:
                return None
        frame = self._queue.popleft()
        self._bytes -= len(frame.payload)
        return frame


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class _Subscribers:
    """The subscriptions, indexed by what they follow: one session, a project, or every project."""

    by_session: dict[str, set[Subscription]] = field(default_factory=dict)
    by_project: dict[str, set[Subscription]] = field(default_factory=dict)
    everywhere: set[Subscription] = field(default_factory=set)

    def add(self, sub: Subscription) -> None:
        for bucket in self._buckets(sub.scope, create=True):
            bucket.add(sub)

    def remove(self, sub: Subscription) -> None:
        for bucket in self._buckets(sub.scope, create=False):
            bucket.discard(sub)
        if sub.scope.session_id is not None and not self.by_session.get(sub.scope.session_id, True):
            del self.by_session[sub.scope.session_id]
        for project in sub.scope.projects or ():
            if not self.by_project.get(project, True):
                del self.by_project[project]

    def _buckets(self, scope: Scope, *, create: bool) -> list[set[Subscription]]:
        if scope.session_id is not None:
            keys, index = [scope.session_id], self.by_session
        elif scope.projects is not None:
            keys, index = sorted(scope.projects), self.by_project
        else:
            return [self.everywhere]
        if create:
            return [index.setdefault(key, set()) for key in keys]
        return [index[key] for key in keys if key in index]

    def holding(self, event: StreamEvent) -> list[Subscription]:
        subs = list(self.everywhere)
        subs.extend(self.by_session.get(event.session_id, ()))
        if event.project is not None:
            subs.extend(self.by_project.get(event.project, ()))
        return subs

    def any(self) -> bool:
        return bool(self.everywhere or self.by_session or self.by_project)

    def all(self) -> set[Subscription]:
        subs = set(self.everywhere)
        for bucket in (*self.by_session.values(), *self.by_project.values()):
            subs |= bucket
        return subs


class Hub:
    """The server's journal listener and its subscribers (see the module doc)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.stats = HubStats()
        self.position = ORIGIN  # the last journal row dispatched
        self.position_cursor = "0"
        self.max_frames, self.max_bytes = MAX_QUEUED_FRAMES, MAX_QUEUED_BYTES
        self.page_rows = PAGE_ROWS
        self._subs = _Subscribers()
        self._following = 0
        self._db: Database | None = None
        self._starting: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._feed_up = asyncio.Event()
        self._dirty = asyncio.Event()
        self._closing = False
        self._stale = False  # rows may have come while nobody followed: the position lags
        self._tick: asyncio.TimerHandle | None = None

    @property
    def open_streams(self) -> int:
        """How many event streams are open on this server (catching up or live)."""
        return self._following

    @property
    def subscribers(self) -> int:
        """How many subscriptions the reader hands rows to (live streams and waiting requests)."""
        return len(self._subs.all())

    # -- life ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start listening (once; later calls wait for the first): the feed, then the live end."""
        if self._closing:
            raise StreamClosed("drain")
        failed = (
            self._starting is not None
            and self._starting.done()
            and (self._starting.cancelled() or self._starting.exception() is not None)
        )
        if self._starting is None or failed:
            self._starting = asyncio.create_task(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        if self._db is None:
            self._db = await _open_reader(self.ctx)
            self._tasks.append(asyncio.create_task(self._follow_feed(), name="rem-hub-feed"))
        try:
            await asyncio.wait_for(self._feed_up.wait(), FEED_START_S)
        except TimeoutError:
            raise DatabaseUnreachable("the store's change feed is not answering; retry") from None
        # every commit from here on is heard: the live end read now misses none of them
        self.position, self.position_cursor = await self.read(live_end_sync)
        self._tasks.append(asyncio.create_task(self._read_loop(), name="rem-hub-reader"))
        self._schedule_heartbeat()

    async def close(self) -> None:
        """Close every subscription (`drain`: their clients resume elsewhere) and stop listening."""
        self._closing = True
        for sub in self._subs.all():
            sub.close("drain")
        if self._tick is not None:
            self._tick.cancel()
        for task in [*self._tasks, *([self._starting] if self._starting else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def read(self, fn: Callable[[Conn], T]) -> T:
        """`fn(conn)` on the hub's own read-only connection (one hop, no transaction left open)."""
        assert self._db is not None, "the hub is not started"
        return await self._db.run_in_thread(fn)  # not `read_beside`: that opens a second connection

    async def live_end(self) -> tuple[Position, str]:
        """The hub's position, brought to the live end first if nobody followed while rows came."""
        await self.start()
        if self._stale and not self._subs.any():
            end = await self.read(live_end_sync)
            # looked at again after the read: a subscriber that joined meanwhile needs every row
            # after the position it caught up to dispatched, so the position may not jump past them
            if self._stale and not self._subs.any() and end[0] > self.position:
                self.position, self.position_cursor = end
            self._stale = False
        return self.position, self.position_cursor

    async def check_cursor(self, cursor: Cursor) -> str | None:
        """Why `cursor` cannot be resumed from (`unknown`, `pruned`), or None."""
        await self.start()
        return await self.read(partial(check_cursor_sync, cursor=cursor))

    # -- hearing and reading ---------------------------------------------------------------------
    async def _follow_feed(self) -> None:
        try:
            if self.ctx.db_url:
                await self._follow_listen(self.ctx.db_url)
            else:
                async for _ in state_db_changes(self.ctx.data.root):
                    self._feed_up.set()
                    self._dirty.set()
        except OSError as exc:  # the inotify limit, a vanished dir: read at a slow pace instead
            log.warning(
                "cannot watch %s (%s); event streams read the journal every %.2f s",
                self.ctx.data.root,
                exc,
                FALLBACK_POLL_S,
            )
            self._feed_up.set()
            while True:
                self._dirty.set()
                await asyncio.sleep(FALLBACK_POLL_S)

    async def _follow_listen(self, url: str) -> None:
        # import time: psycopg's async side, only on a PostgreSQL store
        from backend.store.changes import JOURNAL_CHANNEL, listen_changes

        async for event in listen_changes(url, channel=JOURNAL_CHANNEL):
            if event.kind == "listening":  # anything may have committed while it was not
                self._feed_up.set()
                self._dirty.set()
            elif event.kind == "changed":
                self._dirty.set()

    async def _read_loop(self) -> None:
        delay: float | None = None
        while True:
            if delay is None:
                await self._dirty.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._dirty.wait(), delay)
            self._dirty.clear()
            if not self._subs.any():  # nobody follows: no read (the next one starts at the live end)
                self._stale, delay = True, None
                self.stats.unread += 1
                continue
            try:
                page = await self.read(partial(read_sync, after=self.position, limit=self.page_rows))
            except RemError as exc:
                log.warning("event streams cannot read the journal (%s); retrying", exc)
                delay = READ_RETRY_S
                continue
            except Exception:  # a bug must not silence every stream for good: log it, read again
                log.exception("event streams failed to read the journal; retrying")
                delay = READ_RETRY_S
                continue
            moved = page.last != self.position
            self._dispatch(page)
            if page.full:
                self._dirty.set()
                delay = None
            elif page.held:
                self.stats.held_rereads += 1
                delay = HELD_FIRST_S if moved or delay is None else min(delay * 2, HELD_MAX_S)
            else:
                delay = None

    def _dispatch(self, page: Page) -> None:
        self.stats.reads += 1
        for event in page.events:
            subs = self._subs.holding(event)
            if not subs:
                continue
            frame = Frame.of(event)
            self.stats.frames += 1
            for sub in subs:
                sub.offer(frame)
        if page.last_cursor is not None and page.last > self.position:  # `live_end` may have moved it
            self.position, self.position_cursor = page.last, page.last_cursor

    def _schedule_heartbeat(self) -> None:
        self._tick = asyncio.get_running_loop().call_later(HEARTBEAT_S, self._heartbeat)

    def _heartbeat(self) -> None:
        for sub in self._subs.all():
            sub.ping()
        self._schedule_heartbeat()

    # -- subscribers -----------------------------------------------------------------------------
    def subscribe(self, scope: Scope, pinger: Pinger | None = None) -> Subscription:
        """A live subscription to `scope`: every frame dispatched from now on (call after `start`);
        `pinger`: its stream's connection, for the heartbeats."""
        if self._closing:
            raise StreamClosed("drain")
        sub = Subscription(self, scope, self.max_frames, self.max_bytes, pinger)
        self._subs.add(sub)
        if self._stale:  # commits the reader let by while nobody followed: read from the position
            self._dirty.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.remove(sub)

    async def follow(
        self, scope: Scope, after: Position, pinger: Pinger | None = None
    ) -> AsyncIterator[Frame | None]:
        """Every event of `scope` after `after`, in stream order, then live (None: a heartbeat is due).

        It catches up from the store page by page up to the hub's position,
        subscribes (no await between reading that position and joining, so no
        dispatched frame falls between), reads what was dispatched meanwhile,
        then hands out the live frames past the last one it gave.
        """
        await self.live_end()
        self._following += 1
        sub: Subscription | None = None
        try:
            done = after
            async for frame in self._catch_up(scope, done, self.position):
                done = frame.position
                yield frame
            sub = self.subscribe(scope, pinger)
            async for frame in self._catch_up(scope, done, self.position):
                done = frame.position
                yield frame
            while True:
                live = await sub.next()
                if live is None or live.position > done:
                    done = live.position if live is not None else done
                    yield live
        finally:
            self._following -= 1
            if sub is not None:
                sub.close("gone")

    async def _catch_up(self, scope: Scope, after: Position, upto: Position) -> AsyncIterator[Frame]:
        while after < upto:
            if self._closing:
                raise StreamClosed("drain")
            page = await self.read(partial(read_sync, after=after, scope=scope, upto=upto))
            for event in page.events:
                yield Frame.of(event)
            if not page.full:
                return
            after = page.last


async def _open_reader(ctx: Context) -> Database:
    """The hub's own read-only connection: its reads wait for no request's, and make none wait."""
    if ctx.db_url:
        return await Database.connect(ctx.db_url, read_only=True)
    return await Database.open(ctx.data.state_db, read_only=True)


def hub_of(app: Any) -> Hub:
    """The app's hub (`create_app` makes one per app)."""
    hub: Hub = app.state.hub
    return hub
