"""Live refresh for the console: when to read the next snapshot, and how to show it.

`RefreshScheduler` decides when a snapshot is read: the watch on state.db and
its WAL (`backend.store.watch`, shared with the daemons) saw a change, the slow poll fired, or an action asked. It never starts a
refresh while one runs (the request is remembered and served right after),
keeps at most one per `min_interval_s`, and never lets refreshing take more
than half the time on a big data dir (the gap grows with the last cycle), so
heavy writes cannot starve keys and daemons. Every `health_s` one refresh is
forced past the `data_version` gate: Chroma health and heartbeat ages change
without a commit.

`ApplyChain` shows a snapshot within a frame budget. On a big data dir one
panel update costs 10-30 ms; all seven in one frame would hold keys and mouse
for over 100 ms, so once a frame has spent FRAME_BUDGET_MS the remaining
panels wait for the next frame. A snapshot that arrives meanwhile continues
the same queue (panels still waiting first), so under constant writes no panel
starves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from enum import StrEnum

from backend.ops.records import Status
from tui.widgets.snapshot_table import SnapshotTable

FRAME_BUDGET_MS = 15.0
# panels with live (time-derived) cells, in the order the 1 s tick visits them
TICK_ORDER = ("leases", "workers", "backlog", "receipts", "drift")


class WorkerGroup(StrEnum):
    """The console's worker groups: the one `Worker.StateChanged` handler tells them apart."""

    SNAPSHOT = "snapshot"  # data_version gate + ops.status
    WATCH = "watch"  # the watch on state.db and its WAL
    ACTION = "action"  # a confirmed replay, drain or release
    DRY_RUN = "dry-run"  # the replay dry run shown in the confirmation
    DETAIL_HISTORY = "detail-history"  # a detail screen's journal rows
    DETAIL_TOOLS = "detail-tools"  # a detail screen's tool calls of its session
    DETAIL_DIFF = "detail-diff"  # a detail screen's live receipt diff
    TIMELINE = "timeline"  # a recorded moment read from the status history


class RefreshScheduler:
    """Starts snapshot loads through `load(force)`, one at a time, paced (see the module doc)."""

    def __init__(
        self,
        load: Callable[[bool], object],
        set_timer: Callable[[float, Callable[[], None]], object],
        *,
        min_interval_s: float,
        health_s: float,
    ) -> None:
        self._load = load
        self._set_timer = set_timer
        self.min_interval_s = min_interval_s
        self.health_s = health_s
        self.running = False
        self._wanted = self._force_next = self._timer_pending = False
        self._last_start = self._last_forced = 0.0
        # how long the last load + apply took: the least gap before the next refresh
        self.last_cycle_s = 0.0

    def request(self, force: bool = False) -> None:
        """Start a refresh now, or right after the running one (never two at once)."""
        self._force_next |= force
        if self.running:
            self._wanted = True
            return
        wait = self._last_start + max(self.min_interval_s, self.last_cycle_s) - time.monotonic()
        if wait > 0:
            if not self._timer_pending:
                self._timer_pending = True
                self._set_timer(wait, self._start)
            return
        self._start()

    def poll(self) -> None:
        """The slow fallback poll: a refresh, forced once every `health_s`."""
        self.request(force=time.monotonic() - self._last_forced >= self.health_s)

    def finished(self) -> None:
        """The running load ended (loaded, skipped at the gate, or failed): serve what waited."""
        self.running = False
        if self._wanted or self._force_next:
            self.request()

    def _start(self) -> None:
        self._timer_pending = False
        if self.running:
            self._wanted = True
            return
        force, self._force_next = self._force_next, False
        self.running, self._wanted = True, False
        self._last_start = time.monotonic()
        if force:
            self._last_forced = self._last_start
        self._load(force)


class ApplyChain:
    """Shows a snapshot on the panels a few per frame (see the module doc)."""

    def __init__(
        self,
        next_frame: Callable[[Callable[[], None]], object],
        palette: Callable[[], Mapping[str, str]],
        done: Callable[[Status, float], None],
    ) -> None:
        self._next_frame = next_frame
        self._palette = palette
        self._done = done  # (snapshot, seconds since it was handed over) once every panel shows it
        self._queue: list[SnapshotTable] = []
        self._running = False
        self._showing: Status | None = None
        self._now = 0
        self._started = 0.0

    def apply(self, snapshot: Status, now: int, tables: list[SnapshotTable]) -> None:
        self._started = time.perf_counter()
        self._showing, self._now = snapshot, now
        waiting = self._queue
        self._queue = waiting + [t for t in tables if t not in waiting]
        if not self._running:
            self._running = True
            self._next()

    def _next(self) -> None:
        showing = self._showing
        assert showing is not None  # set before the chain starts
        started = time.perf_counter()
        while self._queue and (time.perf_counter() - started) * 1000 < FRAME_BUDGET_MS:
            self._queue.pop(0).show(showing, self._now, self._palette())
        if self._queue:
            self._next_frame(self._next)
            return
        self._running = False
        self._done(showing, time.perf_counter() - self._started)


class Ticker:
    """Re-renders countdowns and ages without touching the database.

    Each panel's live cells are redrawn once a second, the panels a fifth of a
    second apart (`every_step_s`), so no single frame redraws them all; the
    lease countdown keeps a steady 1 s beat.
    """

    every_step_s = 1.0 / len(TICK_ORDER)

    def __init__(self, tick_panel: Callable[[str], None]) -> None:
        self._tick_panel = tick_panel
        self._count = 0

    def step(self) -> None:
        """The next panel's tick (call every `every_step_s`)."""
        self._tick_panel(TICK_ORDER[self._count % len(TICK_ORDER)])
        self._count += 1

    def all(self) -> None:
        """Every panel's tick at once."""
        for name in TICK_ORDER:
            self._tick_panel(name)


def new_events(latest: Status | None, applied: Status | None) -> str:
    """How many journal events arrived since the snapshot shown (`100+` past the tail)."""
    if latest is None or applied is None or latest is applied:
        return "0 new events"
    shown = max((e["id"] for e in applied["events"]), default=0)
    new = [e["id"] for e in latest["events"]]
    count = sum(1 for i in new if i > shown)
    more = "+" if new and count == len(new) and min(new) > shown + 1 else ""
    return f"{count}{more} new events"
