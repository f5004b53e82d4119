"""What a refresh reads and what starts one: the snapshot read, and the watches on the store.

A read asks `ops.status` for the rows the panels show (`ListLimits`: a
screenful of each list that grows with the data) and for Chroma's health
only when forced (each ask is an HTTP heartbeat and a look at /proc: every
`health_s`, or when the operator or an action asks). A watch reports a
change, then waits until the refresh it asked for has started: whatever is
committed meanwhile, that refresh reads, so a busy fleet's commits cost one
wake a refresh, not one each (inotify and the change feed keep what arrives
meanwhile, and it is read as one change). The app runs each of these as a
worker (`tui/app.py`).
"""

from __future__ import annotations

import time
from typing import Protocol

from textual.message import Message

from backend.ops.console import LIST_CAP, DataDir, ListLimits, listen_changes, state_db_changes
from backend.ops.records import Status
from tui import messages
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
    def post_message(self, message: Message) -> bool: ...


class SnapshotReader:
    """The bodies of the app's snapshot and watch workers."""

    def __init__(self, host: ReaderHost) -> None:
        self.host = host

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

    async def load(self, force: bool) -> bool:
        """Read data_version; if it moved (or forced), read the snapshot and report it (True: reported)."""
        backend = self.host.backend
        assert backend is not None
        started = time.perf_counter()
        limits = self.list_limits()
        version, snapshot = await backend.status_if_changed(
            self.host.seen_version(), force=force, limits=limits
        )
        if snapshot is None:
            return False
        took_ms = (time.perf_counter() - started) * 1000
        self.host.post_message(messages.SnapshotLoaded(snapshot, version, took_ms, limits))
        return True

    async def watch_data_dir(self) -> None:
        """Post DataDirChanged when state.db or its WAL changes, then wait for the refresh to start."""
        started = self.host.refresher.started
        async for _ in state_db_changes(self.host.data.root):
            started.clear()
            self.host.post_message(messages.DataDirChanged())
            await started.wait()

    async def watch_store(self) -> None:
        """PostgreSQL: post StoreChanged for each burst of commits (then wait for the refresh to
        start), and when the feed drops or comes back."""
        backend, url = self.host.backend, self.host.db_url
        assert backend is not None and url
        started = self.host.refresher.started
        async for event in listen_changes(url):
            backend.heard(event)  # the gate moves before the refresh it causes reads it
            started.clear()
            self.host.post_message(messages.StoreChanged(event))
            if event.kind == "changed":  # commits meanwhile wait on the socket: then one event
                await started.wait()
