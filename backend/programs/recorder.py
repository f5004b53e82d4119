"""The status history recorder `rem up` runs: a snapshot every few seconds and at every operator action.

It reads through its own read-only context (never the supervisor's
connection, never starting anything) and takes a snapshot every
`REM_HISTORY_INTERVAL_MS` (5 s), but records it only when it differs from
the last one recorded by more than the clock (`timeline.fingerprint`: ages,
countdowns and heartbeat times set aside, alerts counted): an idle fleet
adds nothing to history.db, and a moment of the timeline is the last
snapshot at or before it. It sleeps between snapshots like an idle daemon
(`backend.runtime.idle`): a commit that journaled something wakes it to
look at the operator index, so that an action taken from any process (the
console, the CLI, a runbook) is followed by a snapshot of the state it left
at once (at most one look per ACTION_GAP_S while commits keep coming). It
prunes the store once a minute. A failure (a locked or full disk, state.db
briefly unreadable) is logged and retried at the next tick: the recorder
never takes `rem up` down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from typing import Any

from backend.core import clock
from backend.core.datadir import DataDir
from backend.core.errors import RemError
from backend.core.settings import settings
from backend.ops import timeline
from backend.ops.actions import status
from backend.runtime.context import Context
from backend.runtime.idle import IdleWait
from backend.store.events import OPERATOR_KINDS
from backend.store.history import DAY_MS, HistoryStore

log = logging.getLogger("rem.recorder")

ACTION_GAP_S = 0.5
PRUNE_EVERY_S = 60.0
# a store that cannot be read (a PostgreSQL restart) is tried again this often
STORE_RETRY_S = 1.0
# the same IN list as the snapshot's action log, so the planner uses the partial event_operator_idx
LATEST_ACTION_SQL = (
    "SELECT id, kind FROM event INDEXED BY event_operator_idx WHERE kind IN ("
    + ", ".join(f"'{k}'" for k in OPERATOR_KINDS)
    + ") ORDER BY id DESC LIMIT 1"
)


class HistoryRecorder:
    """Records one data dir's status history into its `history.db`."""

    def __init__(
        self,
        data: DataDir,
        *,
        chroma_url: str | None = None,
        db_url: str | None = None,
        interval_ms: int | None = None,
    ) -> None:
        self.data = data
        self.ctx = Context(data, chroma_url=chroma_url, read_only=True, start_chroma=False, db_url=db_url)
        self.interval_s = (interval_ms or settings.history_interval_ms) / 1000
        self.history: HistoryStore | None = None
        self.recorded = 0
        self.skipped = 0  # interval snapshots equal to the last one recorded
        self._last_action: int | None = None
        self._last_fingerprint: str | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Record until `stopping` is set; returns after one last snapshot."""
        self.history = await asyncio.to_thread(HistoryStore.open, self.data.root)
        idle = IdleWait(await self.ctx.db(), "recorder", self.data.root, log, min_gap_s=ACTION_GAP_S)
        idle.start(self.ctx.db_url, (await self.ctx.db()).server_pids)
        next_record = next_prune = time.monotonic()
        reason, never = "start", asyncio.Event()
        try:
            while not stopping.is_set():
                if not await self._before_pass(idle, stopping):
                    continue
                action = await self._new_action()
                now = time.monotonic()
                if action is not None or now >= next_record:
                    await self._record(action or reason)
                    reason, next_record = "interval", now + self.interval_s
                if now >= next_prune:
                    await self._prune()
                    next_prune = now + PRUNE_EVERY_S
                await idle.wait(never, stopping, within_s=min(next_record, next_prune) - time.monotonic())
            await self._record("stop")
        finally:
            await idle.close()
            await self.ctx.close()
            await asyncio.to_thread(self.history.close)
            log.info("history: %d snapshots recorded, %d equal ones skipped", self.recorded, self.skipped)

    async def _before_pass(self, idle: IdleWait, stopping: asyncio.Event) -> bool:
        """The idle wait's marks before a pass; False (after a pause) while the store cannot be
        read: a restarting store stops no history, it only pauses it."""
        try:
            await idle.before_pass()
        except (RemError, sqlite3.Error) as exc:
            log.warning("history: cannot read the store: %s; trying again in %.0f s", exc, STORE_RETRY_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), STORE_RETRY_S)
            return False
        return True

    async def _new_action(self) -> str | None:
        """The kind of the newest operator event if it is newer than the last one seen."""
        try:
            db = await self.ctx.db()
            row = await db.fetchone(LATEST_ACTION_SQL)
        except (RemError, sqlite3.Error) as exc:
            log.warning("history: cannot read the journal: %s", exc)
            return None
        latest = int(row[0]) if row is not None else 0
        seen, self._last_action = self._last_action, latest
        if seen is None or latest <= seen or row is None:
            return None
        return str(row[1])

    async def _record(self, reason: str) -> dict[str, Any] | None:
        """Take a snapshot and record it; an interval one equal to the last recorded is skipped."""
        assert self.history is not None
        try:
            snapshot = await status(self.ctx)
            mark = timeline.fingerprint(snapshot)
            if reason == "interval" and mark == self._last_fingerprint:
                self.skipped += 1
                return None
            result = await timeline.record(self.ctx, self.history, reason, shown=snapshot)
        except (RemError, sqlite3.Error, OSError) as exc:
            log.warning("history: snapshot not recorded (%s): %s", reason, exc)
            return None
        self._last_fingerprint = mark
        self.recorded += 1
        incident = ", incident" if result["incident"] else ""
        log.info("history: recorded %s (%d bytes%s)", reason, result["size"], incident)
        return result

    async def _prune(self) -> None:
        assert self.history is not None
        try:
            result = await asyncio.to_thread(
                self.history.prune,
                now=clock.now_ms(),
                retention_ms=settings.history_retention_days * DAY_MS,
                max_bytes=settings.history_max_mb * 1024 * 1024,
            )
        except (RemError, sqlite3.Error) as exc:
            log.warning("history: prune failed: %s", exc)
            return
        if any(result.values()):
            log.info("history: pruned %s", result)
