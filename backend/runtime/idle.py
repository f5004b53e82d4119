"""An idle daemon's sleep: woken by another process's commit, by work falling due, or by a slow poll.

A daemon with nothing to do must cost nothing. It sleeps until one of:

* another process commits news to the store. Every lifecycle transition
  and operator action appends to `event` in the transaction that makes it
  (the design's rule), so a commit that moved no journal row (another
  worker's heartbeat, a lease renewal, model-call records) made no work
  for anyone; nor did one whose only journal rows are streamed parts
  (`message.part`, schema v13: the API's streams follow them; a step's end
  journals `execution.step` for the daemons). SQLite: a watch on state.db
  and its WAL (`backend.store.watch`: inotify, no thread, no timer) hears the write, and
  `PRAGMA data_version` with the journal's head, read in one statement on
  the loop's thread on a small connection of its own (`MarksProbe`), tells a
  commit from a checkpoint and news from upkeep: the daemon sleeps on after
  that one small read. PostgreSQL: the store's change feed (LISTEN/NOTIFY,
  `backend.store.changes`) on its journal channel, which carries only the
  commits that wrote the journal, the daemon's own set aside by their server
  backend: upkeep never reaches the process, and what does is news once the
  journal's head (parts left out) moved, one indexed read;
* time-based work of its role falls due: a lease expiring, a retry time
  passing (`DUE_SQL`, one indexed read when it goes idle);
* a wake from inside the process (`wake()`), or a drain;
* the slow fallback poll, `REM_DAEMON_IDLE_POLL_MS` (5 s): whatever else is
  time-based (the periodic sweeps) and a belt for anything unheard.

Without a watch (inotify refused: the system's watch limit) or while the
PostgreSQL feed is down, it polls `data_version` every POLL_S, as before.
Under a stream of other processes' commits it runs at most one pass every
MIN_GAP_S, so a busy neighbour cannot spin it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from backend.core import clock
from backend.core.errors import RemError
from backend.core.settings import settings
from backend.store.db import Database
from backend.store.watch import MarksProbe, state_db_changes
from backend.store.workers import WorkerRole

# the poll without a watch or a feed (and its pace is the least gap between passes woken by commits)
POLL_S = 0.05
MIN_GAP_S = POLL_S
# a lease falling due is looked at this much after its expiry (clocks of other hosts drift a little)
DUE_SLACK_MS = 50

# When each role's time-based work next falls due (ms since the epoch; NULL: nothing is waiting
# on the clock). Each term is a seek on an index of its column; only times still ahead count.
DUE_SQL: dict[str, str] = {
    WorkerRole.EXECUTOR: """
        SELECT min(expires_at) FROM session_execution
        WHERE expires_at > :now AND recovery_error IS NULL""",
    WorkerRole.SUMMARIZER: """
        SELECT min(lease_expires_at) FROM summary_job
        WHERE lease_expires_at IS NOT NULL AND lease_expires_at > :now""",
    WorkerRole.DREAM: """
        SELECT min(due) FROM (
            SELECT min(lease_expires_at) AS due FROM dream_state
            WHERE lease_expires_at IS NOT NULL AND lease_expires_at > :now
            UNION ALL
            SELECT min(next_attempt_at) FROM dream_state
            WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision
              AND next_attempt_at > :now
            UNION ALL
            SELECT min(overlay_retry_at) FROM dream_state
            WHERE overlay_pending = 1 AND overlay_retry_at > :now) AS dues""",
}

PG_HEAD_SQL = "SELECT count(*), max(id) FROM event WHERE id > :floor AND kind <> 'message.part'"
# PostgreSQL: a journal row committed late lands within this many ids below the newest
HEAD_WINDOW = 1000
# PostgreSQL: after this long without a notification the feed asks the server something, to find a
# link that died silently (the console's listener asks after 5 s). A daemon's slow poll runs a pass
# meanwhile, so a dead feed costs it at most the poll's wake latency, never an input; and each ask
# is a round trip that woke an idle daemon as often as its polls did
FEED_KEEPALIVE_S = 30.0

Woken = Literal["changed", "wake", "due", "poll", "draining"]


@dataclass
class IdleStats:
    """Why the idle waits ended, counted (for the log and the benchmarks)."""

    changed: int = 0
    wake: int = 0
    due: int = 0
    poll: int = 0
    draining: int = 0
    no_commit: int = 0  # the watch heard a write that was no commit (a checkpoint)
    upkeep: int = 0  # another process committed, but no journal row: nothing new to do


class IdleWait:
    """One daemon's idle wait over its store (see the module doc)."""

    def __init__(
        self, db: Database, role: str, root: Path, log: logging.Logger, *, min_gap_s: float = MIN_GAP_S
    ) -> None:
        self.db = db
        self.min_gap_s = min_gap_s
        self.role = role
        self.root = root
        self.log = log
        self.stats = IdleStats()
        self.changed = asyncio.Event()  # the watch or the feed heard something
        self.live = False  # a watch or a feed is up: no polling needed
        self._marks: tuple[int | None, object] = (None, None)  # (data_version, journal head)
        # SQLite: the marks are read on the loop's thread, on a connection of their own
        self._probe = None if db.postgres else MarksProbe(db.path)
        self._last_pass = 0.0
        self._due_wait = False  # the wait under way ends when work falls due, not at the slow poll
        self._task: asyncio.Task[None] | None = None

    # -- the sources of change -------------------------------------------------
    def start(self, db_url: str | None, ignore_pids: Callable[[], Collection[int]]) -> None:
        """Start hearing changes: the change feed on PostgreSQL, the file watch on SQLite."""
        if self.db.postgres and db_url:
            self._task = asyncio.create_task(self._follow_feed(db_url, ignore_pids))
        elif not self.db.postgres:
            self._task = asyncio.create_task(self._follow_watch())

    async def _follow_watch(self) -> None:
        try:
            async for _ in state_db_changes(self.root):
                self.live = True  # the first yield: the watch is up
                self.changed.set()
        except OSError as exc:  # the watch limit, a vanished dir: poll from now on
            self.log.warning("cannot watch %s (%s); idle waits poll the store", self.root, exc)
        finally:
            self.live = False

    async def _follow_feed(self, url: str, ignore_pids: Callable[[], Collection[int]]) -> None:
        # import time: psycopg, only for PostgreSQL
        from backend.store.changes import JOURNAL_CHANNEL, listen_changes

        try:  # journaled commits only: another worker's heartbeat or renewal never reaches this process
            async for event in listen_changes(
                url, ignore_pids=ignore_pids, channel=JOURNAL_CHANNEL, keepalive_s=FEED_KEEPALIVE_S
            ):
                self.live = event.kind != "lost"  # lost: the idle wait polls until it is back
                if event.kind == "changed" and not event.journaled:
                    self.stats.upkeep += 1  # another worker's heartbeat, a renewal: no journal row
                elif self.live:
                    self.changed.set()  # `listening`: anything may have committed while it was not
        except Exception as exc:  # not a lost connection (those are retried inside): poll from now on
            self.log.warning("change feed stopped (%s); idle waits poll the store", exc)
        finally:
            self.live = False

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._probe is not None:
            self._probe.close()

    # -- around a pass ---------------------------------------------------------
    async def before_pass(self) -> None:
        """Mark the store's state the coming pass sees: a commit from here on ends the next wait."""
        self._last_pass = asyncio.get_running_loop().time()
        self.changed.clear()  # before the read below: a commit after it is heard, never lost
        self._marks = await self._read_marks(self._marks[1], rebase=True)

    def _journal_heard(self) -> bool:
        """PostgreSQL with its feed up: every change heard is another process's journaled commit
        (or the feed's `listening`): whether it was a commit needs no asking, only whether it
        journaled more than streamed parts (the head)."""
        return self.db.postgres and self.live

    async def wait(
        self, wake: asyncio.Event, draining: asyncio.Event, *, within_s: float | None = None
    ) -> Woken:
        """Sleep until another process commits, work falls due (the role's, or in `within_s`), a wake,
        a drain, or the slow poll."""
        loop = asyncio.get_running_loop()
        timeout = await self._timeout()
        if within_s is not None and within_s < timeout:
            timeout, self._due_wait = within_s, True
        deadline = loop.time() + timeout
        why = await self._sleep(wake, draining, deadline)
        if why == "changed":
            gap = self._last_pass + self.min_gap_s - loop.time()
            if gap > 0:  # commits keep coming: one pass per gap at most
                await asyncio.sleep(gap)
        setattr(self.stats, why, getattr(self.stats, why) + 1)
        return why

    async def _sleep(self, wake: asyncio.Event, draining: asyncio.Event, deadline: float) -> Woken:
        loop = asyncio.get_running_loop()
        while True:
            if draining.is_set():
                return "draining"
            if wake.is_set():
                wake.clear()
                return "wake"
            if self.changed.is_set() and await self._news():
                return "changed"
            left = deadline - loop.time()
            if left <= 0:
                return "due" if self._due_wait else "poll"
            if self.live:
                await first_of(self.changed, wake, draining, timeout=left)
                continue
            await first_of(wake, draining, timeout=min(left, POLL_S))  # no watch, no feed: poll
            self.changed.set()

    async def _news(self) -> bool:
        """The change heard was another process's commit that journaled something (see the module doc)."""
        self.changed.clear()
        (version, head), (seen_version, seen_head) = await self._read_marks(self._marks[1]), self._marks
        self._marks = (version, head)
        if version == seen_version and not self._journal_heard():
            self.stats.no_commit += 1  # a checkpoint (the feed sets this process's own commits aside)
            return False
        if head == seen_head:
            self.stats.upkeep += 1
            return False
        return True

    async def _read_marks(self, seen_head: object, *, rebase: bool = False) -> tuple[int | None, object]:
        """(`data_version`, the journal's head) in one read (PostgreSQL with its feed up: the head alone).

        The head leaves streamed parts out (`message.part`: news to the API's
        streams, no work for a daemon). SQLite has one writer at a time, so
        journal ids commit in order and the newest id is the head. PostgreSQL's
        come from a sequence and commit in any order (a lower id can land after
        a higher one), so its head is the number of rows above a floor
        HEAD_WINDOW ids below the newest, and the newest id; `rebase` moves the
        floor up to the head seen.
        """
        if self._probe is not None:
            try:
                return self._probe.read()
            except sqlite3.Error:
                return None, object()  # unreadable for now: taken as news, the pass meets the error
        version = None if self._journal_heard() else await self.db.data_version()
        floor = seen_head[0] if isinstance(seen_head, tuple) else 0
        if rebase and isinstance(seen_head, tuple) and seen_head[2] is not None:
            floor = max(0, int(seen_head[2]) - HEAD_WINDOW)
        row = await self.db.fetchone(PG_HEAD_SQL, {"floor": floor})
        assert row is not None
        return version, (floor, row[0], row[1])

    async def _timeout(self) -> float:
        """Seconds until the role's time-based work falls due, at most the slow poll."""
        poll_s = settings.daemon_idle_poll_ms / 1000
        self._due_wait = False
        sql = DUE_SQL.get(self.role)
        if sql is None:
            return poll_s
        now = clock.now_ms()
        try:
            due = await self.db.scalar(sql, {"now": now})
        except RemError:
            return poll_s  # the pass that follows meets the same error and reports it
        if due is None:
            return poll_s
        until_s = (int(due) - now + DUE_SLACK_MS) / 1000
        if until_s >= poll_s:
            return poll_s
        self._due_wait = True
        return max(0.0, until_s)


async def first_of(*events: asyncio.Event, timeout: float) -> None:
    """Return when any of `events` is set, or after `timeout` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
