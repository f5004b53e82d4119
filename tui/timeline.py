"""The timeline mode: a recorded moment shown instead of live state (`t`, `[ ]`, `{ }`, `--at`).

`rem up` records the status snapshot into a history store; the timeline reads
one moment back (`backend.ops.timeline.seek`, through the console backend)
and shows it in the same panels, with the timeline bar and a header badge so
the past is unmistakable. While it shows a moment, live snapshots keep
loading but wait (`holds_live`), countdowns stand still and actions are
disabled. `--at TIME` starts the console in the past: live snapshots wait
until that moment has been shown, or failed to load.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Protocol

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import Worker

from backend.ops.console import now_ms
from backend.ops.records import Moment, Status
from tui.console_backend import ConsoleBackend
from tui.messages import MomentLoaded
from tui.refresh import WorkerGroup
from tui.widgets.header import ConsoleHeader
from tui.widgets.timeline_bar import TimelineBar
from tui.widgets.trends import Trends


class TimelineHost(Protocol):
    """What the timeline needs of the app: its widgets, the backend, and how to show a snapshot."""

    @property
    def backend(self) -> ConsoleBackend | None: ...
    @property
    def latest(self) -> Status | None: ...
    @property
    def timeline_bar(self) -> TimelineBar: ...
    @property
    def header(self) -> ConsoleHeader: ...
    @property
    def trends(self) -> Trends: ...

    def notify(
        self, message: str, *, severity: SeverityLevel = "information", timeout: float | None = None
    ) -> None: ...
    def post_message(self, message: Message) -> bool: ...
    def run_worker(
        self,
        work: Callable[[], Coroutine[Any, Any, None]],
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
    ) -> Worker[None]: ...
    def apply_snapshot(self, snapshot: Status, now: int | None = None) -> None: ...
    def apply_pending(self) -> None: ...
    def show_keys(self) -> None: ...


class Timeline:
    """Which recorded moment is shown (None: live), and the moves between moments."""

    def __init__(self, host: TimelineHost, start_at: int | None) -> None:
        self.host = host
        self.start_at = start_at
        self.moment: Moment | None = None
        # `--at`: live snapshots wait until the moment asked for has been shown (or failed to load)
        self.awaiting = start_at is not None

    @property
    def holds_live(self) -> bool:
        """Whether live snapshots wait (a moment is shown, or the one asked for is loading)."""
        return self.moment is not None or self.awaiting

    def start(self) -> None:
        """`--at`: load the moment asked for (called once the app is mounted)."""
        if self.start_at is not None:
            self.load("at", self.start_at)

    def toggle(self) -> None:
        """Enter the timeline at the newest recorded snapshot, or go back to live."""
        if self.moment is None:
            self.load("at", now_ms())
            return
        self.moment = None
        self._show(None)
        if self.host.latest is not None:
            self.host.apply_snapshot(self.host.latest)
        self.host.notify("live again")

    def seek(self, how: str) -> None:
        """`back`/`forward` one snapshot, `incident_back`/`incident_forward` to an incident start."""
        if self.moment is None:  # not in the timeline yet: start at the newest snapshot, then move
            self.load("at", now_ms(), then=how)
            return
        recorded = self.moment["recorded"]
        self.load(how, recorded["time"], recorded["id"])

    def load(self, how: str, time_ms: int, entry_id: int = 0, then: str | None = None) -> None:
        """Read a moment in a worker (one at a time: a newer move cancels the older)."""
        self.host.run_worker(
            partial(self._read, how, time_ms, entry_id, then),  # started with the worker, as `@work` does
            name="timeline",
            group=WorkerGroup.TIMELINE,
            exclusive=True,
            exit_on_error=False,
        )

    async def _read(self, how: str, time_ms: int, entry_id: int, then: str | None) -> None:
        """Read a recorded moment (and, with `then`, move from it once more); report it."""
        backend = self.host.backend
        assert backend is not None
        moment = await backend.moment(how, time_ms, entry_id)
        if moment is not None and then is not None:
            recorded = moment["recorded"]
            moment = await backend.moment(then, int(recorded["time"]), int(recorded["id"])) or moment
        self.host.post_message(MomentLoaded(moment, how))

    def moment_loaded(self, message: MomentLoaded) -> None:
        """Show a moment just read; None: there is none that way (said, the view stays)."""
        moment = message.moment
        self.awaiting = False
        if moment is None:
            where = "no recorded status history yet" if self.moment is None else "nothing further that way"
            self.host.notify(f"timeline: {where}", severity="warning")
            return
        recorded = moment["recorded"]
        self.moment = moment
        self._show(int(recorded["time"]))
        self.host.apply_snapshot(moment, now=int(recorded["time"]))

    def failed(self, message: str) -> None:
        """Reading a moment failed: say so; `--at` shows live state rather than nothing."""
        self.host.notify(f"timeline: {message}", severity="error", timeout=10)
        if self.awaiting:
            self.awaiting = False
            self.host.apply_pending()

    def _show(self, at: int | None) -> None:
        """The bar, the header badge and the trends for a moment at `at` (None: live)."""
        self.host.timeline_bar.show_moment(self.moment["recorded"] if self.moment is not None else None)
        self.host.header.show_timeline(at)
        self.host.trends.display = at is None  # the sparklines are the live minutes, not a moment
        self.host.show_keys()
