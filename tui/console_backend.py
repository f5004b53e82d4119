"""The console's only way into rem: `backend.ops` and read helpers, run on a private loop.

On state.db it holds two connections: the `Context`'s (used by `ops.status`
and the actions; read-only when the console is) and one persistent read-only
connection used for nothing but `PRAGMA data_version`, the cheap gate in
front of every refresh. Neither keeps a transaction open between calls.

On PostgreSQL (`db_url`) the gate is the change feed instead: the console's
listener (`backend.store.changes`) reports here, and `data_version` is the
number of change events heard. The feed is per database, so another
database's commits on the same server never open the gate; while the
listener is not connected the gate stays open (every poll reads), since
changes could go unheard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from backend import ops
from backend.core.datadir import DataDir
from backend.core.errors import DataDirError
from backend.core.settings import settings
from backend.ops.records import Moment, ReplayReport, Status
from backend.runtime.context import Context
from backend.store import events
from backend.store.changes import StoreEvent
from backend.store.db import Database
from backend.store.history import HistoryStore
from tui.backend_loop import BackendLoop

log = logging.getLogger("rem.console")

StatusLoader = Callable[[Context], Awaitable[Status]]


class ConsoleBackend:
    """Status, journal history and operator actions for one data dir, off the UI loop."""

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
        self.read_only = read_only
        self.db_url = db_url or settings.db_url
        # never start a Chroma server from the console: a server tied to the
        # console's lifetime would vanish under the daemons when it closes
        self.ctx = Context(
            data, chroma_url=chroma_url, read_only=read_only, start_chroma=False, db_url=self.db_url
        )
        self.loop = BackendLoop().start()
        self._gate: Database | None = None
        # PostgreSQL: change events heard, and whether the listener hears them now
        self.changes_heard = 0
        self.listening = False
        self._history_store: HistoryStore | None = None
        self._status_loader = status_loader or ops.status

    def _require_state_db(self) -> None:
        if self.db_url:
            return  # the state is in PostgreSQL: the data dir may hold no state.db at all
        self.data.check_usable()
        if not self.data.exists():
            raise DataDirError(
                f"no rem data at {self.data.root} (state.db missing); "
                f"run `rem init --data {self.data.root}` or `rem up`"
            )

    async def _open_gate(self) -> Database:
        if self._gate is None:
            self._require_state_db()
            self._gate = await Database.open(self.data.state_db, read_only=True)
        return self._gate

    async def _data_version(self) -> int:
        gate = await self._open_gate()
        try:
            return await gate.data_version()
        except Exception:
            # a replaced or vanished file: reopen on the next call
            self._gate = None
            await gate.close()
            raise

    async def data_version(self) -> int:
        """A number that moves when anyone else commits: `PRAGMA data_version` of the gate
        connection, or on PostgreSQL the change events heard (see the module doc)."""
        if self.db_url:
            if not self.listening:
                self.changes_heard += 1  # deaf: open the gate, changes could go unheard
            return self.changes_heard
        return await self.loop.run(self._data_version())

    def heard(self, event: StoreEvent) -> None:
        """The change listener's report: a change, (re)connected, or lost."""
        self.listening = event.kind != "lost"
        self.changes_heard += 1  # changed, or (re)connected after a time anything may have changed

    async def _status(self) -> Status:
        self._require_state_db()
        return await self._status_loader(self.ctx)

    async def status(self) -> Status:
        return await self.loop.run(self._status())

    async def _history(self, session_id: str | None, target: str | None) -> list[dict[str, Any]]:
        return await events.history(await self.ctx.db(), session_id=session_id, target=target)

    async def history(
        self, *, session_id: str | None = None, target: str | None = None
    ) -> list[dict[str, Any]]:
        """Journal rows about a session and/or a target (lease id, owner id), newest first."""
        return await self.loop.run(self._history(session_id, target))

    async def _moment(self, how: str, time: int, entry_id: int) -> Moment | None:
        # import time: the timeline (PyYAML, by its alert rules), only when the operator opens it
        from backend.ops import timeline

        self._require_state_db()
        if self._history_store is None:  # read-only whatever the console is: only `rem up` writes it
            self._history_store = await asyncio.to_thread(HistoryStore.open, self.data.root, read_only=True)
        return await timeline.seek(self.ctx, self._history_store, how, time, entry_id)

    async def moment(self, how: str, time: int, entry_id: int = 0) -> Moment | None:
        """A recorded moment (`backend.ops.timeline.seek`): panels as they were, the journal around it."""
        return await self.loop.run(self._moment(how, time, entry_id))

    async def replay(
        self, summary_ids: list[str] | None = None, *, all_mismatched: bool = False, dry_run: bool = False
    ) -> ReplayReport:
        return await self.loop.run(
            ops.replay(self.ctx, summary_ids, all_mismatched=all_mismatched, dry_run=dry_run)
        )

    async def recall(self, query: str, project: str | None = None, k: int = 20) -> dict[str, Any]:
        """Ranked memory items, as `rem recall` gives them (never starts Chroma: lexical without it)."""
        return await self.loop.run(ops.recall(self.ctx, query, project=project, k=k))

    async def drain(self, owner_id: str) -> dict[str, Any]:
        return await self.loop.run(ops.drain(self.ctx, owner_id, wait=False))

    async def release(self, lease_id: str, *, kind: str, expected_epoch: int | None) -> dict[str, Any]:
        return await self.loop.run(ops.release(self.ctx, lease_id, kind=kind, expected_epoch=expected_epoch))

    async def resume(self, session_id: str) -> dict[str, Any]:
        return await self.loop.run(ops.resume(self.ctx, [session_id]))

    async def _close(self) -> None:
        if self._gate is not None:
            await self._gate.close()
            self._gate = None
        if self._history_store is not None:
            self._history_store.close()
            self._history_store = None
        await self.ctx.close()

    def close(self) -> None:
        """Close both connections and stop the loop (called once, at exit)."""
        try:
            self.loop.run_blocking(self._close(), timeout=5)
        except Exception:  # closing must never turn an exit into a crash
            log.warning("closing the console backend failed", exc_info=True)
        self.loop.stop()
