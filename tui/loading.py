"""What a refresh reads and what starts one: the snapshot read, and the watches on the store.

A read asks `ops.status` for the rows the panels show (`ListLimits`: a
screenful of each list that grows with the data) and for Chroma's health
only when forced (each ask is an HTTP heartbeat and a look at /proc: every
`health_s`, or when the operator or an action asks). A watch reports a
change, then waits until the refresh it asked for has started: whatever is
committed meanwhile, that refresh reads, so a busy fleet's commits cost one
wake a refresh, not one each (inotify and the change feed keep what arrives
meanwhile, and it is read as one change). The app runs each of these as one
long-lived worker (`tui/app.py`): a refresh is a wake of the reader's task and
direct calls into the app, not a worker started and messages posted per refresh
(~1 ms of a ~10 ms refresh, when a busy fleet's commits come 10 a second).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from backend.ops.console import LIST_CAP, DataDir, ListLimits, StoreEvent, listen_changes, state_db_changes
from backend.ops.records import Status
from tui.console_backend import ConsoleBackend
from tui.refresh import RefreshScheduler
from tui.widgets.snapshot_table import SnapshotTable


class ReaderHost(Protocol):
    """What reading needs of the app: the backend, the panels, the refresh state, messages."""

    @property
    def backend(self) -> ConsoleBackend | None: ...
    @property
    def data(self) -> DataDir: ...
    @property
    def db_url(self) -> str | None: ...
    @property
    def refresher(self) -> RefreshScheduler: ...

    def panels(self) -> list[SnapshotTable]: ...
    def seen_version(self) -> int | None: ...
    @property
    def applied(self) -> Status | None: ...
    def request_refresh(self, force: bool = False) -> None: ...
    def refresh_finished(self, read: bool = True) -> None: ...
    def snapshot_loaded(self, snapshot: Status, version: int, took_ms: float, limits: ListLimits) -> None: ...
    def snapshot_failed(self, error: BaseException) -> None: ...
    def store_changed(self, event: StoreEvent) -> None: ...


class SnapshotReader:
    """The bodies of the app's snapshot and watch workers."""

    def __init__(self, host: ReaderHost) -> None:
        self.host = host
        self._asked = asyncio.Event()
        self._force = False

    def start(self, force: bool) -> None:
        """Start a refresh cycle (`RefreshScheduler` calls this): wake the reading task."""
        self._force |= force
        self._asked.set()

    async def serve(self) -> None:
        """The reading task: one cycle per `start`, ended by the host once the snapshot is shown or
        held, or here when the gate was shut or the read failed (the banner says so). What showing
        raises is a bug: it ends the task, and the app with it (as a message handler's would)."""
        while True:
            await self._asked.wait()
            self._asked.clear()
            force, self._force = self._force, False
            try:
                read = await self.load(force)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the next cycle reads again
                self.host.snapshot_failed(error)
                self.host.refresh_finished()
                continue
            if read is None:  # the gate was shut: nothing read
                self.host.refresh_finished(read=False)
            else:
                self.host.snapshot_loaded(*read)

    def list_limits(self) -> ListLimits:
        """The rows of each list the panels show (what a refresh reads); before the first snapshot is
        shown, every row each panel lists: the layout may still move, and a second read to fill
        a panel that grew would be a read no commit asked for."""
        first = self.host.applied is None
        wanted = {
            table.LIST: LIST_CAP if first else table.rows_wanted()
            for table in self.host.panels()
            if table.LIST is not None
        }
        return ListLimits(**wanted)

    async def load(self, force: bool) -> tuple[Status, int, float, ListLimits] | None:
        """Read data_version; if it moved (or forced), the snapshot, its version, how long the read
        took (ms) and the rows of each list it asked for (None: the gate was shut)."""
        backend = self.host.backend
        assert backend is not None
        started = time.perf_counter()
        limits = self.list_limits()
        version, snapshot = await backend.status_if_changed(
            self.host.seen_version(), force=force, limits=limits
        )
        if snapshot is None:
            return None
        return snapshot, version, (time.perf_counter() - started) * 1000, limits

    async def watch_data_dir(self) -> None:
        """Ask for a refresh when state.db or its WAL changes, then wait for it to start."""
        started = self.host.refresher.started
        async for _ in state_db_changes(self.host.data.root):
            started.clear()
            self.host.request_refresh()
            await started.wait()

    async def watch_store(self) -> None:
        """PostgreSQL: report each burst of commits (then wait for the refresh it asks for to start),
        and when the feed drops or comes back."""
        backend, url = self.host.backend, self.host.db_url
        assert backend is not None and url
        started = self.host.refresher.started
        async for event in listen_changes(url):
            backend.heard(event)  # the gate moves before the refresh it causes reads it
            started.clear()
            self.host.store_changed(event)
            if event.kind == "changed":  # commits meanwhile wait on the socket: then one event
                await started.wait()
