"""The console's only way into rem: `backend.ops` (its `ConsoleSession`), run on a private loop.

What is read and how (the `data_version` gate, the journal, recorded moments,
the actions) is `backend.ops.console.ConsoleSession`'s; this module only runs
each call on the `BackendLoop`, off Textual's loop, so that a hung Chroma or a
slow query never freezes keys and mouse. On state.db the session holds two
connections (the `Context`'s, read-only when the console is, and the gate's),
neither with a transaction open between calls. On PostgreSQL (`db_url`) the
gate is the change feed: the console's listener reports here (`heard`).
"""

from __future__ import annotations

import logging
from typing import Any

from backend.ops.console import ConsoleSession, DataDir, ListLimits, StatusLoader, StoreEvent
from backend.ops.records import Moment, ReplayReport, Status
from backend.ops.results import DrainReport, KillReport, LeaseReleased, ResumeReport, ToolDecision
from tui.backend_loop import BackendLoop

log = logging.getLogger("rem.console")

__all__ = ["ConsoleBackend", "StatusLoader"]


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
        self.session = ConsoleSession(
            data, read_only=read_only, chroma_url=chroma_url, status_loader=status_loader, db_url=db_url
        )
        self.db_url = self.session.db_url
        self.loop = BackendLoop().start()

    @property
    def listening(self) -> bool:
        """PostgreSQL: whether the change listener is connected (changes are heard)."""
        return self.session.listening

    @property
    def changes_heard(self) -> int:
        return self.session.changes_heard

    async def data_version(self) -> int:
        """A number that moves when anyone else commits (`ConsoleSession.data_version`)."""
        if self.db_url:  # a counter in memory: no need to hop loops
            return await self.session.data_version()
        return await self.loop.run(self.session.data_version())

    def heard(self, event: StoreEvent) -> None:
        """The change listener's report: a change, (re)connected, or lost."""
        self.session.heard(event)

    async def status(self, *, check_chroma: bool = True, limits: ListLimits | None = None) -> Status:
        """`ops.status` with the rows the panels show; Chroma asked again only if `check_chroma`."""
        return await self.loop.run(self.session.status(check_chroma=check_chroma, limits=limits))

    async def status_if_changed(
        self, seen: int | None, *, force: bool, limits: ListLimits
    ) -> tuple[int, Status | None]:
        """The gate's `data_version`, and the snapshot if it moved from `seen` (or `force`): in one hop
        to the backend's loop (each hop is a wake of both loops, a refresh's largest fixed cost
        after the screen), none on PostgreSQL when the gate is shut (its gate is in memory)."""
        if self.db_url:
            version = await self.data_version()
            if not force and version == seen:
                return version, None
            return version, await self.status(check_chroma=force, limits=limits)
        return await self.loop.run(self.session.status_if_changed(seen, force=force, limits=limits))

    async def history(
        self, *, session_id: str | None = None, target: str | None = None
    ) -> list[dict[str, Any]]:
        """Journal rows about a session and/or a target (lease id, owner id), newest first."""
        return await self.loop.run(self.session.history(session_id, target))

    async def moment(self, how: str, time: int, entry_id: int = 0) -> Moment | None:
        """A recorded moment (`backend.ops.timeline.seek`): panels as they were, the journal around it."""
        return await self.loop.run(self.session.moment(how, time, entry_id))

    async def replay(
        self, summary_ids: list[str] | None = None, *, all_mismatched: bool = False, dry_run: bool = False
    ) -> ReplayReport:
        return await self.loop.run(
            self.session.replay(summary_ids, all_mismatched=all_mismatched, dry_run=dry_run)
        )

    async def recall(self, query: str, project: str | None = None, k: int = 20) -> dict[str, Any]:
        """Ranked memory items, as `rem recall` gives them (never starts Chroma: lexical without it)."""
        return await self.loop.run(self.session.recall(query, project, k))

    async def drain(self, owner_id: str) -> DrainReport:
        return await self.loop.run(self.session.drain(owner_id))

    async def release(self, lease_id: str, *, kind: str, expected_epoch: int | None) -> LeaseReleased:
        return await self.loop.run(self.session.release(lease_id, kind=kind, expected_epoch=expected_epoch))

    async def resume(self, session_id: str) -> ResumeReport:
        return await self.loop.run(self.session.resume(session_id))

    async def approve(self, call_id: str) -> ToolDecision:
        return await self.loop.run(self.session.approve(call_id))

    async def deny(self, call_id: str, reason: str | None = None) -> ToolDecision:
        return await self.loop.run(self.session.deny(call_id, reason))

    async def resolve(self, call_id: str, choice: Any, text: str | None = None) -> ToolDecision:
        """`choice`: done, retry or fail (`backend.ops.resolve`, which refuses anything else)."""
        return await self.loop.run(self.session.resolve(call_id, choice, text))

    async def tool_calls(self, session_id: str) -> list[dict[str, Any]]:
        return await self.loop.run(self.session.tool_calls(session_id))

    async def kill(self, target: str) -> KillReport:
        """SIGKILL a worker of this host, or `chroma` (`backend.ops.kill`, which re-checks and journals)."""
        return await self.loop.run(self.session.kill(target))

    def close(self) -> None:
        """Close both connections and stop the loop (called once, at exit)."""
        try:
            self.loop.run_blocking(self.session.close(), timeout=5)
        except Exception:  # closing must never turn an exit into a crash
            log.warning("closing the console backend failed", exc_info=True)
        self.loop.stop()
