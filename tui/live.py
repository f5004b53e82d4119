"""What the console shows of live state: a snapshot read, shown or held, and what is unreachable.

`tui/refresh.py` decides when a snapshot is read; this module decides what
happens to one once read, and then ends the refresh cycle. It is shown at
once, every panel in the same callback (each draws only its rows on screen,
so the screen is updated once), unless the operator paused (the header counts the events waiting), a
modal is open, or the timeline shows the past: then it waits, and the newest
one is shown when that ends (`apply_pending`). The banner says what is
unreachable (the database, Chroma, PostgreSQL's change feed) and clears
itself when it answers again. Between snapshots, countdowns and ages tick
without reading the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from textual.notifications import SeverityLevel
from textual.screen import Screen

from backend.ops.console import DataDir, ListLimits, RemError, StoreEvent, describe_refusal, now_ms
from backend.ops.records import Status
from tui.probes import RefreshProbes
from tui.refresh import new_events
from tui.timeline import Timeline
from tui.widgets.banner import Banner
from tui.widgets.header import ConsoleHeader
from tui.widgets.snapshot_table import SnapshotTable
from tui.widgets.trends import Trends, trend_values

log = logging.getLogger("rem.console")


class LiveHost(Protocol):
    """What showing live state needs of the app: its widgets, where it looks, and its state."""

    @property
    def header(self) -> ConsoleHeader: ...
    @property
    def trends(self) -> Trends: ...
    @property
    def banner(self) -> Banner: ...
    @property
    def data(self) -> DataDir: ...
    @property
    def data_label(self) -> str: ...
    @property
    def poll_s(self) -> float: ...
    @property
    def palette(self) -> Mapping[str, str]: ...

    @property
    def screen_stack(self) -> list[Screen[Any]]: ...

    def panels(self) -> list[SnapshotTable]: ...
    def panel(self, name: str) -> SnapshotTable: ...
    def apply_snapshot(self, snapshot: Status, now: int | None = None) -> None: ...
    def snapshot_shown(self, cycle_s: float, *, first: bool) -> None: ...
    def show_keys(self) -> None: ...
    def call_after_refresh(self, callback: Callable[[], object]) -> bool: ...
    def refresh_finished(self) -> None: ...
    def refresh_rate(self) -> str: ...
    def one_line(self, error: BaseException | None) -> str: ...
    def request_refresh(self, force: bool = False) -> None: ...
    def notify(self, message: str, *, severity: SeverityLevel = "information") -> None: ...


class LiveView:
    """The latest snapshot read, the one shown, and whether showing is paused."""

    def __init__(self, host: LiveHost, probes: RefreshProbes, timeline: Timeline) -> None:
        self.host, self.probes, self.timeline = host, probes, timeline
        self.latest: Status | None = None  # last snapshot loaded
        self.latest_limits: ListLimits | None = None  # the rows of each list it read
        self.applied: Status | None = None  # last snapshot shown (by every panel)
        self.paused = False
        self.seen_version: int | None = None  # the gate's data_version of the latest
        self._shown_at = -1e9  # when a live snapshot was last shown (`clock`)
        self.clock = time.monotonic

    def snapshot_loaded(self, snapshot: Status, version: int, took_ms: float, limits: ListLimits) -> None:
        """A snapshot was read (at gate `version`, in `took_ms`, `limits` rows of each list): the banner
        says what answers; show it, or hold it. The cycle ends once the screen shows it: the budget
        then counts what painting it cost."""
        try:
            self._take(snapshot, version, took_ms, limits)
        finally:
            self.host.call_after_refresh(self.host.refresh_finished)

    def _take(self, snapshot: Status, version: int, took_ms: float, limits: ListLimits) -> None:
        self.seen_version, self.latest, self.latest_limits = version, snapshot, limits
        self.probes.loaded(took_ms)
        self.host.banner.set_problem("database", None)
        chroma = snapshot["chroma"]
        error = str(chroma["error"] or "no answer").replace(str(self.host.data.root), self.host.data_label)
        unreachable = f"Chroma unreachable: {error} — replay needs it; everything else is live"
        refused = chroma.get("refused")  # (a moment recorded before it existed has none)
        self.host.banner.set_problem("chroma", None if chroma["healthy"] or refused else unreachable)
        self.host.banner.set_problem("chroma-refused", describe_refusal(refused) if refused else None)
        modal_open = len(self.host.screen_stack) > 1
        if self.paused or modal_open or self.timeline.holds_live:
            self.show_waiting()
            return
        self.host.apply_snapshot(snapshot)

    def failed(self, error: BaseException | None) -> None:
        """Reading a snapshot failed: the banner says so; the next answer reloads in full."""
        self.seen_version = None
        if not isinstance(error, RemError):
            log.error("refresh failed", exc_info=error)
        message = f"database unreachable: {self.host.one_line(error)} (retrying every {self.host.poll_s:g} s)"
        self.host.banner.set_problem("database", message)

    def store_changed(self, event: StoreEvent) -> None:
        """PostgreSQL's change feed: the banner while it is lost (reads go on at the poll's pace)."""
        lost = f"change feed lost: {event.error}; reconnecting in {event.retry_in_s:g} s, "
        reading = f"reading every {self.host.poll_s:g} s meanwhile"
        self.host.banner.set_problem("feed", lost + reading if event.kind == "lost" else None)
        self.host.request_refresh()

    def show(self, snapshot: Status, now: int | None = None) -> None:
        """Header, trends and every panel; a moment of the timeline at `now`."""
        started = time.perf_counter()
        recorded = now is not None
        now = now_ms() if now is None else now
        self.host.header.set_state(snapshot=snapshot, now=now, waiting="", refresh=self.host.refresh_rate())
        if not recorded:
            self.host.trends.record(now, trend_values(snapshot, now))
        palette = self.host.palette
        # what each list read: the live snapshot's limits; a recorded moment holds its lists whole
        limits = vars(self.latest_limits) if snapshot is self.latest and self.latest_limits else {}
        for table in self.host.panels():
            table.show(snapshot, now, palette, limits.get(table.LIST) if table.LIST else None)
        first, self.applied = self.applied is None, snapshot
        if not recorded:
            self._shown_at = self.clock()
        self.host.snapshot_shown(self.probes.applied(time.perf_counter() - started), first=first)

    def shown_within(self, seconds: float) -> bool:
        """Whether a live snapshot was shown within the last `seconds` (its countdowns are fresh)."""
        return self.clock() - self._shown_at < seconds

    def apply_pending(self) -> None:
        """Show the latest snapshot if it was held back (pause ended, modal closed, back from the past)."""
        if self.timeline.moment is not None:
            return
        if not self.paused and self.latest is not None and self.latest is not self.applied:
            self.host.apply_snapshot(self.latest)

    def show_waiting(self) -> None:
        self.host.header.set_state(paused=self.paused, waiting=new_events(self.latest, self.applied))

    def toggle_pause(self) -> None:
        """Freeze the tables (the header counts what waits), or show the newest again."""
        self.paused = not self.paused
        for table in self.host.panels():
            table.frozen = self.paused
        self.host.show_keys()
        self.show_waiting()
        if not self.paused:
            self.apply_pending()
        self.host.notify("paused: tables frozen, press p to resume" if self.paused else "live again")

    def tick_panel(self, name: str) -> None:
        """Countdowns and ages of one panel as of now (never the database); the past stands still."""
        if self.timeline.moment is not None:
            return
        now = now_ms()
        if name == "leases":
            self.host.header.set_state(now=now, refresh=self.host.refresh_rate())
            if self.latest is not None:
                self.host.trends.record(now, trend_values(self.latest, now))
        self.host.panel(name).tick(now)
