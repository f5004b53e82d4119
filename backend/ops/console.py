"""The console's door into rem: what `tui/` uses besides the operator actions of `backend.ops`.

The console reaches rem only through `backend.ops` (an import-linter contract
in pyproject.toml holds `tui` to it), so everything it needs from below is
named here, in one `__all__`, and nowhere else:

* `ConsoleSession`: `ops.status` as the console reads it (the rows its panels
  show, `ListLimits`; Chroma's health asked again only when told), the reads
  it makes besides — the refresh gate (`PRAGMA data_version` on a connection of its own, or on
  PostgreSQL the change events heard), the journal around a row, recorded
  moments of the timeline — and the actions, on one `Context` that never
  starts a Chroma server and never holds a read transaction open;
* the change feeds: PostgreSQL's LISTEN (`listen_changes`, `StoreEvent`) and
  the watch on state.db and its WAL (`state_db_changes`, the daemons' too),
  which the console runs as long-lived workers on its own loop. They are
  re-exported as they are, not wrapped, because they are streams the console
  iterates, not requests: the narrow door for the change feeds;
* the vocabulary its widgets and messages name: errors, the clock, the data
  dir, settings, private exports, liveness rules, this host's name (a kill
  signals only its own host's processes), and `visible` for text from the data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from backend.core import clock
from backend.core.datadir import DataDir
from backend.core.errors import BadInput, DataDirError, Refused, RemError
from backend.core.inert import visible
from backend.core.private import create_export, export_path, inside, make_private_dir
from backend.core.settings import settings
from backend.ops import actions, kills, memory, timeline, tool_decisions, tool_status
from backend.ops.records import ChromaHealth, Moment, ReplayReport, Status
from backend.ops.results import DrainReport, KillReport, LeaseReleased, ResumeReport, ToolDecision
from backend.ops.snapshot import ListLimits
from backend.ops.status_queries import EVENT_TAIL, LIST_CAP, RECENT_ACTIONS
from backend.runtime.context import Context
from backend.runtime.refusals import describe as describe_refusal
from backend.store import events
from backend.store.changes import StoreEvent, listen_changes
from backend.store.history import HistoryStore
from backend.store.postgres import store_label
from backend.store.sqlite_file import sqlite_errors
from backend.store.watch import MarksProbe, state_db_changes
from backend.store.workers import LIVE_STATES, heartbeat_alive, host_name, worker_alive

__all__ = [
    "EVENT_TAIL",
    "LIST_CAP",
    "LIVE_STATES",
    "BadInput",
    "ConsoleSession",
    "DataDir",
    "DataDirError",
    "ListLimits",
    "RECENT_ACTIONS",
    "Refused",
    "RemError",
    "StatusLoader",
    "StoreEvent",
    "create_export",
    "describe_refusal",
    "export_path",
    "heartbeat_alive",
    "host_name",
    "inside",
    "listen_changes",
    "make_private_dir",
    "now_ms",
    "settings",
    "state_db_changes",
    "store_label",
    "visible",
    "worker_alive",
]

# `ops.status`, or a stand-in with its keywords (`chroma`, `limits`)
StatusLoader = Callable[..., Awaitable[Status]]


def now_ms() -> int:
    """rem's clock (a test's frozen one included), as Unix time in ms."""
    return clock.now_ms()


# how long after a shut gate it is looked at once more (`ConsoleSession.status_if_changed`)
GATE_RECHECK_S = 0.01


class ConsoleSession:
    """Status, the refresh gate, journal history, recorded moments and the actions for one store."""

    def __init__(
        self,
        data: DataDir,
        *,
        read_only: bool = False,
        chroma_url: str | None = None,
        status_loader: StatusLoader | None = None,
        db_url: str | None = None,
    ) -> None:
        self.data = data
        self.db_url = db_url or settings.db_url
        # never start a Chroma server from the console: a server tied to the
        # console's lifetime would vanish under the daemons when it closes
        self.ctx = Context(
            data, chroma_url=chroma_url, read_only=read_only, start_chroma=False, db_url=self.db_url
        )
        # the refresh gate on state.db: `PRAGMA data_version` on a read-only connection of its own
        self._gate: MarksProbe | None = None
        # PostgreSQL: change events heard, and whether the listener hears them now
        self.changes_heard = 0
        self.listening = False
        self._history_store: HistoryStore | None = None
        self._status_loader = status_loader or actions.status
        self._chroma: ChromaHealth | None = None  # Chroma's health as last asked

    def _require_state_db(self) -> None:
        if self.db_url:
            return  # the state is in PostgreSQL: the data dir may hold no state.db at all
        self.data.check_usable()
        if not self.data.exists():
            raise DataDirError(
                f"no rem data at {self.data.root} (state.db missing); "
                f"run `rem init --data {self.data.root}` or `rem up`"
            )

    async def data_version(self) -> int:
        """A number that moves when anyone else commits: `PRAGMA data_version` of the gate
        connection, or on PostgreSQL the change events heard (`heard`)."""
        if self.db_url:
            if not self.listening:
                self.changes_heard += 1  # deaf: open the gate, changes could go unheard
            return self.changes_heard
        # read here, on the caller's thread (a few microseconds): a hop to a connection's thread
        # and back was two thread wakes on every refresh
        if self._gate is None:
            self._require_state_db()
            self._gate = MarksProbe(self.data.state_db)
        with sqlite_errors(self.data.state_db):
            return self._gate.read()[0]  # a replaced or vanished file: reopened on the next call

    def heard(self, event: StoreEvent) -> None:
        """The change listener's report: a change, (re)connected, or lost.

        The feed is per database, so another database's commits on the same
        server never open the gate; while the listener is not connected the
        gate stays open (every poll reads), since changes could go unheard.
        """
        self.listening = event.kind != "lost"
        self.changes_heard += 1  # changed, or (re)connected after a time anything may have changed

    async def status_if_changed(
        self, seen: int | None, *, force: bool, limits: ListLimits | None
    ) -> tuple[int, Status | None]:
        """The gate's `data_version`, and the snapshot (Chroma asked if `force`) if it moved from `seen`.

        On state.db a shut gate is looked at once more `GATE_RECHECK_S` later: a commit's
        writes to the WAL (which the watch hears) end with the WAL index's update (a shared
        memory write, which no watch hears), so a look between the two finds the gate shut and
        nothing more is heard of that commit until the next one (on a busy host ~1 in 10 of a
        fleet's commits at 10 a second waited for the next one so)."""
        version = await self.data_version()
        if not force and version == seen and not self.db_url:
            await asyncio.sleep(GATE_RECHECK_S)
            version = await self.data_version()
        if not force and version == seen:
            return version, None
        return version, await self.status(check_chroma=force, limits=limits)

    async def status(self, *, check_chroma: bool = True, limits: ListLimits | None = None) -> Status:
        """`ops.status` with `limits`; Chroma's health as last asked unless `check_chroma` (or never asked).

        Asking is an HTTP heartbeat and a look at who listens on Chroma's port (~7 ms of CPU):
        the console asks on its forced refreshes (every few seconds), not on each of its own. The
        data dir's own checks (reachable, private: ~20 stats) go with it.
        """
        if check_chroma or self._chroma is None:
            self._require_state_db()
        known = None if check_chroma else self._chroma
        status = await self._status_loader(self.ctx, chroma=known, limits=limits)
        self._chroma = status["chroma"]
        return status

    async def history(self, session_id: str | None, target: str | None) -> list[dict[str, Any]]:
        """Journal rows about a session and/or a target (lease id, owner id), newest first."""
        return await events.history(await self.ctx.db(), session_id=session_id, target=target)

    async def moment(self, how: str, time: int, entry_id: int) -> Moment | None:
        """A recorded moment (`backend.ops.timeline.seek`): panels as they were, the journal around it."""
        self._require_state_db()
        if self._history_store is None:  # read-only whatever the console is: only `rem up` writes it
            self._history_store = await asyncio.to_thread(HistoryStore.open, self.data.root, read_only=True)
        return await timeline.seek(self.ctx, self._history_store, how, time, entry_id)

    async def replay(
        self, summary_ids: list[str] | None, *, all_mismatched: bool, dry_run: bool
    ) -> ReplayReport:
        return await actions.replay(self.ctx, summary_ids, all_mismatched=all_mismatched, dry_run=dry_run)

    async def recall(self, query: str, project: str | None, k: int) -> dict[str, Any]:
        return await memory.recall(self.ctx, query, project=project, k=k)

    async def drain(self, owner_id: str) -> DrainReport:
        return await actions.drain(self.ctx, owner_id, wait=False)

    async def release(self, lease_id: str, *, kind: str, expected_epoch: int | None) -> LeaseReleased:
        return await actions.release(self.ctx, lease_id, kind=kind, expected_epoch=expected_epoch)

    async def resume(self, session_id: str) -> ResumeReport:
        return await actions.resume(self.ctx, [session_id])

    async def approve(self, call_id: str) -> ToolDecision:
        return await tool_decisions.approve(self.ctx, call_id)

    async def deny(self, call_id: str, reason: str | None) -> ToolDecision:
        return await tool_decisions.deny(self.ctx, call_id, reason)

    async def resolve(self, call_id: str, choice: tool_decisions.Choice, text: str | None) -> ToolDecision:
        return await tool_decisions.resolve(self.ctx, call_id, choice, text)

    async def kill(self, target: str) -> KillReport:
        return await kills.kill(self.ctx, target)

    async def tool_calls(self, session_id: str) -> list[dict[str, Any]]:
        """A session's tool calls (`rem show`'s), each with its state, key, result and times."""
        db = await self.ctx.db()
        return await db.read_in_thread(lambda conn: tool_status.session_calls_sync(conn, session_id))

    async def close(self) -> None:
        """Close both connections (and the history store, if a moment was read)."""
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        if self._history_store is not None:
            self._history_store.close()
            self._history_store = None
        await self.ctx.close()
