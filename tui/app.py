"""The rem console: wiring of panels, live refresh, and operator actions.

Refresh: watchfiles sees state.db / state.db-wal change (or the slow poll
fires) -> the `RefreshScheduler` starts one worker, which reads `PRAGMA
data_version` on the gate connection and, only if it moved, `ops.status` ->
`SnapshotLoaded` -> the `ApplyChain` updates the tables in place, a few per
frame. The next refresh starts only after the previous one finished
(`tui/refresh.py`). On PostgreSQL (`--db`) the store's change feed (LISTEN,
`backend.store.changes`) takes the file watch's place and is the gate.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.events import DescendantFocus
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from backend.core import clock, private
from backend.core.datadir import DataDir
from backend.core.errors import Refused, RemError
from backend.core.settings import settings
from backend.ops.records import Moment, Status
from backend.runtime import refusals
from backend.store.changes import listen_changes
from backend.store.postgres import store_label
from tui import actions
from tui.actions import ActionPlan, NotActionable
from tui.commands import ConsoleCommands
from tui.console_backend import ConsoleBackend, StatusLoader
from tui.format import home_short, one_line_error, palette_from
from tui.messages import (
    ActionCompleted,
    DataDirChanged,
    DryRunReady,
    MomentLoaded,
    SnapshotLoaded,
    StoreChanged,
)
from tui.refresh import ApplyChain, RefreshScheduler, Ticker, WorkerGroup, new_events, state_db_changes
from tui.screens.confirm import ConfirmScreen
from tui.screens.detail import DetailScreen
from tui.screens.export import ExportScreen
from tui.screens.help import HelpScreen, help_markdown, help_sections
from tui.screens.recall import RecallScreen
from tui.widgets.action_log import ActionLogTable
from tui.widgets.backlog import BacklogTable
from tui.widgets.banner import Banner
from tui.widgets.drift import DriftTable
from tui.widgets.events import EventTable
from tui.widgets.filter_bar import FilterBar
from tui.widgets.header import ConsoleHeader
from tui.widgets.key_bar import KeyBar
from tui.widgets.leases import LeaseTable
from tui.widgets.panel_table import PanelTable
from tui.widgets.receipts import ReceiptTable
from tui.widgets.sessions import SessionsTable
from tui.widgets.snapshot_table import SnapshotTable
from tui.widgets.timeline_bar import TimelineBar
from tui.widgets.trends import Trends, trend_values
from tui.widgets.workers import WorkerTable

log = logging.getLogger("rem.console")

ACTIONS = frozenset({"replay_selected", "replay_all", "drain", "release", "resume"})
# the timings of this many latest refreshes are kept (the benchmarks read them): a console left
# open for days refreshing ten times a second must not grow by them (~2 MB an hour unbounded)
STATS_KEPT = 20_000
# Python's full cyclic collections run on a timer of their own, every this many seconds,
# not inside whichever callback allocated the object that tipped the threshold (a screen
# update, mostly): a key then waits for one of them, never both
FULL_GC_EVERY_S = 2.0
# gc's threshold for the oldest generation while the console owns full collections (never reached)
NO_AUTOMATIC_FULL_GC = 1_000_000_000
PANELS: tuple[tuple[str, type[SnapshotTable]], ...] = (
    ("backlog", BacklogTable),
    ("leases", LeaseTable),
    ("receipts", ReceiptTable),
    ("drift", DriftTable),
    ("workers", WorkerTable),
    ("events", EventTable),
    ("actions", ActionLogTable),
    ("sessions", SessionsTable),
)


class ConsoleScreen(Screen[None]):
    """The main screen; coming back to it applies any snapshot held while a modal was open."""

    def on_screen_resume(self) -> None:
        app = self.app
        if isinstance(app, ConsoleApp):
            app.apply_pending()


class ConsoleApp(App[None]):
    """The on-call console over one rem data dir.

    | Key | Does |
    | :- | :- |
    | ? | help: every key |
    | p | pause / resume applying updates |
    | / | filter the focused panel |
    | s / S | cycle the sort column / reverse it |
    | enter | detail of the selected row |
    | 1 … 8 | focus backlog, leases, receipts, drift, workers, events, action log, sessions |
    | z | maximize / restore the focused panel |
    | r / R | replay the selected receipt / all mismatched (dry run first) |
    | d | drain the selected worker |
    | l | release the selected lease |
    | u | resume the selected session a model error holds |
    | e / c | export the focused panel as CSV / copy it to the clipboard |
    | t | timeline: the panels as recorded (`rem up` records them) / back to live |
    | [ / ] | timeline: previous / next recorded snapshot |
    | { / } | timeline: previous / next incident start |
    | ctrl+r | refresh now |
    | ctrl+p | command palette |
    | q | quit |
    """

    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses live elsewhere
    TITLE = "rem console"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]
    # the order is the key bar's: what an incident needs first
    BINDINGS: ClassVar = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("t", "timeline", "Timeline"),
        Binding("l", "release", "Release"),
        Binding("d", "drain", "Drain"),
        Binding("r", "replay_selected", "Replay"),
        Binding("R", "replay_all", "Replay all"),
        Binding("u", "resume", "Resume"),
        Binding("s", "sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse sort", show=False),
        Binding("e", "export_csv", "Export CSV"),
        Binding("c", "copy_csv", "Copy CSV", show=False),
        Binding("z", "toggle_maximize", "Zoom"),
        Binding("left_square_bracket", "timeline_seek('back')", "Timeline: step back", show=False),
        Binding("right_square_bracket", "timeline_seek('forward')", "Timeline: step forward", show=False),
        Binding(
            "left_curly_bracket", "timeline_seek('incident_back')", "Timeline: previous incident", show=False
        ),
        Binding(
            "right_curly_bracket", "timeline_seek('incident_forward')", "Timeline: next incident", show=False
        ),
        Binding("ctrl+r", "refresh_now", "Refresh now", show=False),
        *(
            Binding(str(i), f"focus_panel('{name}')", f"Focus {name}", show=False)
            for i, (name, _) in enumerate(PANELS, start=1)
        ),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        data: DataDir | str | os.PathLike[str],
        *,
        read_only: bool = False,
        chroma_url: str | None = None,
        data_label: str | None = None,
        status_loader: StatusLoader | None = None,
        watch: bool = True,
        poll_s: float = 2.0,
        health_s: float = 10.0,
        min_interval_s: float = 0.1,
        at: int | None = None,
        db_url: str | None = None,
    ) -> None:
        super().__init__()
        self.data = data if isinstance(data, DataDir) else DataDir.resolve(data)
        self.read_only = read_only
        self.chroma_url = chroma_url
        # the state store watched: state.db in the data dir, or PostgreSQL (`--db`)
        self.db_url = db_url or settings.db_url
        self.data_label = data_label or (
            store_label(self.db_url) if self.db_url else home_short(self.data.root)
        )
        self.status_loader = status_loader
        self.watch_files, self.poll_s = watch, poll_s
        self.backend: ConsoleBackend | None = None
        self.paused = False
        self.latest: Status | None = None  # last snapshot loaded
        self.applied: Status | None = None  # last snapshot shown
        self._gc_thresholds: tuple[int, int, int] | None = None  # the interpreter's, while ours are set
        self._seen_version: int | None = None
        self.refresher = RefreshScheduler(
            self.load_snapshot, self.set_timer, min_interval_s=min_interval_s, health_s=health_s
        )
        self.apply_chain = ApplyChain(self.call_after_refresh, lambda: self._palette, self._applied)
        self._last_panel = "leases"
        self._action_workers: dict[Worker[Any], ActionPlan] = {}
        self.ticker = Ticker(self._tick_panel)
        self._palette = palette_from({})
        # the timeline: a recorded moment shown instead of live state (None: live)
        self.start_at = at
        self.moment: Moment | None = None
        # `--at`: live snapshots wait until the moment asked for has been shown (or failed to load)
        self._awaiting_moment = at is not None
        # figures the benchmarks read: snapshots loaded and applied, and the latest ones' ms
        self.stats: dict[str, Any] = {
            "loads": 0,
            "applies": 0,
            "load_ms": deque(maxlen=STATS_KEPT),
            "apply_ms": deque(maxlen=STATS_KEPT),
        }

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Notifications carry ids, paths and errors from the data: plain text unless asked otherwise."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    # -- layout ------------------------------------------------------------------
    def get_default_screen(self) -> Screen[Any]:
        return ConsoleScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield ConsoleHeader(self.data_label, read_only=self.read_only, id="header")
        yield TimelineBar(id="timeline")
        yield Banner(id="banner")
        yield Trends(id="trends")
        with Horizontal(id="panels"):
            for name, cls in PANELS[:4]:
                yield cls(id=name)
        with Grid(id="bottom"):
            yield WorkerTable(id="workers")
            yield SessionsTable(id="sessions")
            yield EventTable(id="events")
            yield ActionLogTable(id="actions")
        yield FilterBar(id="filter")
        yield KeyBar(
            self.BINDINGS,
            lead=[("⏎", "detail", "Detail")],
            tail=[("^p", "command_palette", "Palette")],
            id="keys",
        )

    def on_mount(self) -> None:
        # widget references held from mount on: timers firing during shutdown find them too
        self.header = self.query_one("#header", ConsoleHeader)
        self.banner = self.query_one("#banner", Banner)
        self.timeline_bar = self.query_one("#timeline", TimelineBar)
        self.trends = self.query_one("#trends", Trends)
        self.filter_bar = self.query_one("#filter", FilterBar)
        self.key_bar = self.query_one("#keys", KeyBar)
        self._show_keys()
        self._panels = {name: self.query_one(f"#{name}", SnapshotTable) for name, _ in PANELS}
        self._palette = palette_from(self.get_css_variables())
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.backend = ConsoleBackend(
            self.data,
            read_only=self.read_only,
            chroma_url=self.chroma_url,
            status_loader=self.status_loader,
            db_url=self.db_url,
        )
        self.header.set_state(palette=self._palette, now=clock.now_ms())
        self.set_interval(Ticker.every_step_s, self.ticker.step)
        self.set_interval(self.poll_s, self.refresher.poll)
        self.panel("leases").focus()
        self.request_refresh(force=True)
        if self.start_at is not None:
            self.load_moment("at", self.start_at)
        if self.watch_files:
            if self.db_url:
                self.watch_store()
            else:
                self.watch_data_dir()

    def _theme_changed(self, _theme: object) -> None:
        # cell colours are resolved from the theme when drawn: redraw them all
        self._palette = palette_from(self.get_css_variables())
        self.header.set_state(palette=self._palette)
        for table in self.panels():
            table.restyle(self._palette)

    def on_unmount(self) -> None:
        if self._gc_thresholds is not None:  # the process outlives the app (tests, `rem bench`)
            gc.set_threshold(*self._gc_thresholds)
            self._gc_thresholds = None
        if self.backend is not None:
            self.backend.close()

    def _collect_fully(self) -> None:
        """A full cyclic collection, as a callback of its own (`FULL_GC_EVERY_S`)."""
        gc.collect()

    def panel(self, name: str) -> SnapshotTable:
        return self._panels[name]

    def panels(self) -> list[SnapshotTable]:
        return [self.panel(name) for name, _ in PANELS]

    def focused_panel(self) -> SnapshotTable:
        if isinstance(self.focused, SnapshotTable):
            return self.focused
        return self.panel(self._last_panel)

    def on_descendant_focus(self, event: DescendantFocus) -> None:
        if isinstance(event.widget, SnapshotTable) and event.widget.id:
            self._last_panel = event.widget.id

    # -- live refresh --------------------------------------------------------------
    def request_refresh(self, force: bool = False) -> None:
        """Start a refresh now, or right after the running one (never two at once)."""
        self.refresher.request(force)

    @work(exclusive=True, group=WorkerGroup.SNAPSHOT, exit_on_error=False)
    async def load_snapshot(self, force: bool) -> None:
        """Read data_version; if it moved (or forced), read the snapshot and report it."""
        assert self.backend is not None
        started = time.perf_counter()
        version = await self.backend.data_version()
        if not force and version == self._seen_version:
            return
        snapshot = await self.backend.status()
        self.post_message(SnapshotLoaded(snapshot, version, (time.perf_counter() - started) * 1000))

    @work(exclusive=True, group=WorkerGroup.WATCH, exit_on_error=False)
    async def watch_data_dir(self) -> None:
        """Post DataDirChanged whenever state.db or its WAL changes."""
        async for _ in state_db_changes(self.data.root):
            self.post_message(DataDirChanged())

    def on_data_dir_changed(self, _message: DataDirChanged) -> None:
        self.request_refresh()

    @work(exclusive=True, group=WorkerGroup.WATCH, exit_on_error=False)
    async def watch_store(self) -> None:
        """PostgreSQL: post StoreChanged for each burst of this store's commits, and when the feed drops."""
        assert self.backend is not None and self.db_url
        async for event in listen_changes(self.db_url):
            self.backend.heard(event)  # the gate moves before the refresh it causes reads it
            self.post_message(StoreChanged(event))

    def on_store_changed(self, message: StoreChanged) -> None:
        event = message.event
        self.banner.set_problem(
            "feed",
            f"change feed lost: {event.error}; reconnecting in {event.retry_in_s:g} s, "
            f"reading every {self.poll_s:g} s meanwhile"
            if event.kind == "lost"
            else None,
        )
        self.request_refresh()

    def on_snapshot_loaded(self, message: SnapshotLoaded) -> None:
        self._seen_version = message.data_version
        self.latest = message.snapshot
        self.stats["loads"] += 1
        self.stats["load_ms"].append(message.took_ms)
        self.banner.set_problem("database", None)
        chroma = message.snapshot["chroma"]
        error = str(chroma["error"] or "no answer").replace(str(self.data.root), self.data_label)
        self.banner.set_problem(
            "chroma",
            None
            if chroma["healthy"] or chroma.get("refused")
            else f"Chroma unreachable: {error} — replay needs it; everything else is live",
        )
        refused = chroma.get("refused")
        self.banner.set_problem("chroma-refused", refusals.describe(refused) if refused else None)
        if self.paused or len(self.screen_stack) > 1 or self.moment is not None or self._awaiting_moment:
            self._show_waiting()
            return
        self.apply_snapshot(message.snapshot)

    def apply_snapshot(self, snapshot: Status, now: int | None = None) -> None:
        """Show a snapshot: header and trends at once, the panels as frames allow.

        `applied` is set once every panel shows the newest snapshot.
        """
        recorded = now is not None  # a moment of the timeline, shown as of its own time
        now = clock.now_ms() if now is None else now
        self.header.set_state(snapshot=snapshot, now=now, waiting="")
        if not recorded:
            self.trends.record(now, trend_values(snapshot, now))
        self.apply_chain.apply(snapshot, now, self.panels())

    def _applied(self, snapshot: Status, took_s: float) -> None:
        if self.applied is None:
            # Textual, the modules and the first snapshot are long-lived: keep them out of
            # the cyclic GC's full scans, which otherwise stop every thread for 50-150 ms
            # about once a second on a big data dir (refcounting still frees them)
            gc.freeze()
            # a full collection scans every object made since (26 000-31 000 at 10x, most of
            # them Textual's strips and their caches): 12-63 ms. Left automatic, about once a
            # second it lands inside a screen update of 40-60 ms, and input waits for both
            self._gc_thresholds = gc.get_threshold()
            young, middle, _ = self._gc_thresholds
            gc.set_threshold(young, middle, NO_AUTOMATIC_FULL_GC)
            self.set_interval(FULL_GC_EVERY_S, self._collect_fully)
        self.applied = snapshot
        self.stats["applies"] += 1
        self.stats["apply_ms"].append(took_s * 1000)
        load_s = self.stats["load_ms"][-1] / 1000 if self.stats["load_ms"] else 0
        self.refresher.last_cycle_s = took_s + load_s

    def apply_pending(self) -> None:
        """Show the latest snapshot if it was held back (pause ended, modal closed, back from the past)."""
        if self.moment is not None:
            return
        if not self.paused and self.latest is not None and self.latest is not self.applied:
            self.apply_snapshot(self.latest)

    def _show_waiting(self) -> None:
        self.header.set_state(paused=self.paused, waiting=new_events(self.latest, self.applied))

    def tick(self) -> None:
        """Countdowns, heartbeat ages and trends for every panel at once (never the database)."""
        self.ticker.all()

    def _tick_panel(self, name: str) -> None:
        if self.moment is not None:  # a recorded moment stands still: no countdown runs in the past
            return
        now = clock.now_ms()
        if name == "leases":
            self.header.set_state(now=now)
            if self.latest is not None:
                self.trends.record(now, trend_values(self.latest, now))
        self.panel(name).tick(now)

    # -- failures: one handler for every worker ------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        finished = event.state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED)
        if worker.group == WorkerGroup.SNAPSHOT and finished:
            if event.state == WorkerState.ERROR:
                self._snapshot_failed(worker.error)
            self.refresher.finished()
        if event.state != WorkerState.ERROR:
            if finished:
                self._action_workers.pop(worker, None)
            return
        error = worker.error
        if worker.group in (WorkerGroup.ACTION, WorkerGroup.DRY_RUN):
            self._action_failed(self._action_workers.pop(worker, None), worker.name, error)
        elif worker.group == WorkerGroup.TIMELINE:
            self.notify(f"timeline: {self.one_line(error)}", severity="error", timeout=10)
            if self._awaiting_moment:  # show live state rather than nothing
                self._awaiting_moment = False
                self.apply_pending()
        elif worker.group == WorkerGroup.WATCH:
            watching = "the change feed" if self.db_url else "file watching"
            self.notify(f"{watching} stopped ({error}); polling every {self.poll_s:g} s", severity="warning")
        elif worker.group != WorkerGroup.SNAPSHOT:
            self.notify(f"{worker.group}: {self.one_line(error)}", severity="error")
            log.error("worker %s failed", worker.name, exc_info=error)

    def _snapshot_failed(self, error: BaseException | None) -> None:
        self._seen_version = None  # force a full reload once it answers again
        message = self.one_line(error)
        if not isinstance(error, RemError):
            log.error("refresh failed", exc_info=error)
        self.banner.set_problem(
            "database", f"database unreachable: {message} (retrying every {self.poll_s:g} s)"
        )

    def _action_failed(self, plan: ActionPlan | None, name: str, error: BaseException | None) -> None:
        outcome = "refused" if isinstance(error, Refused) else "failed"  # ReadOnly is a Refused
        action = plan.action if plan else name
        target = plan.target_text if plan else "-"
        message = self.one_line(error)
        self.notify(
            f"{action} {target} {outcome}: {message}",
            title=f"{action} {outcome}",
            severity="error",
            timeout=8,
        )
        self._log_action(action, target, outcome, message)
        if not isinstance(error, RemError):
            log.error("%s failed", action, exc_info=error)

    def _log_action(self, action: str, target: str, outcome: str, message: str) -> None:
        """One line in the action log, stamped now."""
        action_log = self.panel("actions")
        assert isinstance(action_log, ActionLogTable)
        action_log.log_action(
            time=clock.now_ms(), action=action, target=target, outcome=outcome, message=message
        )

    def one_line(self, error: BaseException | None) -> str:
        """An error as one line, the data dir shown as in the header (short, and stable)."""
        return one_line_error(error).replace(str(self.data.root), self.data_label)

    # -- actions -----------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ACTIONS and (self.read_only or self.moment is not None):
            return None  # greyed out; read-only: the library would refuse anyway; the past: not actionable
        return True

    def _selected(self, name: str, what: str) -> dict[str, Any] | None:
        record = self.panel(name).selected_record()
        if record is None:
            self.notify(
                f"no {what} selected: focus the {name} panel "
                f"({[p for p, _ in PANELS].index(name) + 1}) and pick a row",
                severity="warning",
            )
        return record

    def action_replay_selected(self) -> None:
        record = self._selected("receipts", "receipt")
        if record is not None:
            self.prepare_replay([record], False)

    def action_replay_all(self) -> None:
        records = self.panel("receipts").all_records()
        if not records:
            self.notify("no mismatched receipts to replay", severity="information")
            return
        self.prepare_replay(records, True)

    @work(exclusive=True, group=WorkerGroup.DRY_RUN, exit_on_error=False, name="replay")
    async def prepare_replay(self, records: list[dict[str, Any]], all_mismatched: bool) -> None:
        """Ask the library for the dry-run diff, then confirm with it."""
        assert self.backend is not None
        ids = [str(r.get("summary_id")) for r in records]
        result = await self.backend.replay(
            None if all_mismatched else ids, all_mismatched=all_mismatched, dry_run=True
        )
        self.post_message(
            DryRunReady(actions.replay_plan(records, all_mismatched=all_mismatched, dry_run=result))
        )

    def on_dry_run_ready(self, message: DryRunReady) -> None:
        plan = message.plan
        self._log_action(
            plan.action, plan.target_text, "dry-run", plan.preview.splitlines()[0] if plan.preview else ""
        )
        self.confirm(message.plan)

    def action_drain(self) -> None:
        record = self._selected("workers", "worker")
        if record is not None:
            leases = self.applied["leases"] if self.applied is not None else []
            self.confirm(actions.drain_plan(record, leases, clock.now_ms()))

    def action_resume(self) -> None:
        panel = self.focused_panel()
        record = panel.selected_record() if panel.PANEL_NAME in ("backlog", "sessions") else None
        if record is None:
            self.notify(
                "no held session selected: focus Backlog (1) or Sessions (8) and pick a held row",
                severity="warning",
            )
            return
        try:
            self.confirm(actions.resume_plan(record))
        except NotActionable as exc:
            self.notify(str(exc), severity="warning")

    def action_release(self) -> None:
        record = self._selected("leases", "lease")
        if record is None:
            return
        try:
            self.confirm(actions.release_plan(record, clock.now_ms()))
        except NotActionable as exc:
            self.notify(str(exc), severity="warning")

    def confirm(self, plan: ActionPlan) -> None:
        """Show the confirmation; run the plan only if the operator confirms."""

        def decided(confirmed: bool | None) -> None:
            if confirmed:
                self.execute_plan(plan)
            else:
                self._log_action(plan.action, plan.target_text, "cancelled", "cancelled at the confirmation")

        self.push_screen(ConfirmScreen(plan), callback=decided)

    def execute_plan(self, plan: ActionPlan) -> Worker[None]:
        worker = self._run_plan(plan)
        self._action_workers[worker] = plan
        return worker

    @work(group=WorkerGroup.ACTION, exit_on_error=False)
    async def _run_plan(self, plan: ActionPlan) -> None:
        assert self.backend is not None
        result = await actions.execute(plan, self.backend)
        self.post_message(ActionCompleted(plan, result))

    def on_action_completed(self, message: ActionCompleted) -> None:
        text = actions.describe_result(message.plan, message.result)
        self.notify(text, title=f"{message.plan.action} done", timeout=8)
        self._log_action(message.plan.action, message.plan.target_text, "ok", text)
        self.request_refresh(force=True)

    # -- the timeline: recorded moments instead of live state ---------------------------
    def action_timeline(self) -> None:
        """Enter the timeline at the newest recorded snapshot, or go back to live."""
        if self.moment is None:
            self.load_moment("at", clock.now_ms())
            return
        self.moment = None
        self.timeline_bar.show_moment(None)
        self.header.show_timeline(None)
        self.trends.display = True
        self._show_keys()
        if self.latest is not None:
            self.apply_snapshot(self.latest)
        self.notify("live again")

    def action_timeline_seek(self, how: str) -> None:
        if self.moment is None:  # not in the timeline yet: start at the newest snapshot, then move
            self.load_moment("at", clock.now_ms(), then=how)
            return
        recorded = self.moment["recorded"]
        self.load_moment(how, recorded["time"], recorded["id"])

    @work(exclusive=True, group=WorkerGroup.TIMELINE, exit_on_error=False)
    async def load_moment(self, how: str, time_ms: int, entry_id: int = 0, then: str | None = None) -> None:
        """Read a recorded moment from the history store and the journal around it."""
        assert self.backend is not None
        moment = await self.backend.moment(how, time_ms, entry_id)
        if moment is not None and then is not None:
            recorded = moment["recorded"]
            moment = await self.backend.moment(then, int(recorded["time"]), int(recorded["id"])) or moment
        self.post_message(MomentLoaded(moment, how))

    def on_moment_loaded(self, message: MomentLoaded) -> None:
        moment = message.moment
        self._awaiting_moment = False
        if moment is None:
            where = "no recorded status history yet" if self.moment is None else "nothing further that way"
            self.notify(f"timeline: {where}", severity="warning")
            return
        recorded = moment["recorded"]
        self.moment = moment
        self.timeline_bar.show_moment(recorded)
        self.header.show_timeline(int(recorded["time"]))
        self.trends.display = False  # the sparklines are the live minutes, not the moment shown
        self._show_keys()
        self.apply_snapshot(moment, now=int(recorded["time"]))

    # -- operator comforts ------------------------------------------------------------
    def action_recall(self) -> None:
        if self.backend is None:
            return
        self.push_screen(RecallScreen(self.backend.recall, describe_error=self.one_line))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_markdown(help_sections(self.BINDINGS))))

    def _show_keys(self) -> None:
        self.key_bar.show_keys(
            lambda action: self.check_action(action, ()) is True,
            {"toggle_pause": "Resume" if self.paused else "Pause"},
        )

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self._show_keys()
        self._show_waiting()
        if not self.paused:
            self.apply_pending()
        self.notify("paused: tables frozen, press p to resume" if self.paused else "live again")

    def action_filter(self) -> None:
        table = self.focused_panel()
        self.filter_bar.open_for(table.id or "", table.PANEL_NAME, table.filter_text)

    def on_filter_bar_filter_changed(self, message: FilterBar.FilterChanged) -> None:
        table = self.panel(message.target)
        table.set_filter(message.text)
        if message.done:
            self.filter_bar.close()
            table.focus()

    def action_sort(self) -> None:
        table = self.focused_panel()
        self.notify(f"{table.PANEL_NAME}: {table.cycle_sort()}", timeout=2)

    def action_reverse_sort(self) -> None:
        table = self.focused_panel()
        self.notify(f"{table.PANEL_NAME}: {table.reverse_sort()}", timeout=2)

    @on(PanelTable.HeaderSelected)
    def _header_clicked(self, event: PanelTable.HeaderSelected) -> None:
        if isinstance(event.table, SnapshotTable):
            event.table.sort_by(event.column_key)

    @on(PanelTable.RowSelected)
    def _row_selected(self, event: PanelTable.RowSelected) -> None:
        if isinstance(event.table, SnapshotTable):
            self.show_detail(event.table)

    def action_detail(self) -> None:
        self.show_detail(self.focused_panel())

    def show_detail(self, table: SnapshotTable) -> None:
        record = table.selected_record()
        if record is not None and self.backend is not None:
            screen = DetailScreen.of_row(
                table.PANEL_NAME, table.selected_key(), record, self.backend, describe_error=self.one_line
            )
            self.push_screen(screen)

    def action_focus_panel(self, name: str) -> None:
        self.panel(name).focus()

    def action_toggle_maximize(self) -> None:
        if self.screen.maximized is not None:
            self.screen.minimize()
        else:
            self.screen.maximize(self.focused_panel())

    def action_refresh_now(self) -> None:
        self.request_refresh(force=True)

    def action_export_csv(self) -> None:
        """Write the focused panel as CSV: to logs/ (or the current folder); read-only, where the operator says."""
        table = self.focused_panel()
        if self.read_only:
            self.ask_export_path(table, table.to_csv(), table.csv_file_name())
            return
        path = table.export_csv([self.data.logs, Path.cwd()])
        if path is None:
            self.notify(
                "could not write the CSV to the data dir's logs/ or the current directory", severity="error"
            )
        else:
            self.notify(f"exported {len(table.shown_keys())} {table.PANEL_NAME} rows to {path}")

    def ask_export_path(self, table: SnapshotTable, text: str, name: str) -> None:
        """Read-only: the data dir gets no new bytes, so the operator names a file outside it."""
        folder = Path.cwd() if not private.inside(Path.cwd(), self.data.root) else Path.home()
        rows = len(table.shown_keys())

        def chosen(path: Path | None) -> None:
            if path is None:
                return
            try:
                private.create_export(path, text)
            except RemError as exc:
                self.notify(f"export failed: {exc}", severity="error")
                return
            self.notify(f"exported {rows} {table.PANEL_NAME} rows to {path}")

        self.push_screen(ExportScreen(table.PANEL_NAME, rows, folder / name, self.data.root), callback=chosen)

    def action_copy_csv(self) -> None:
        table = self.focused_panel()
        self.copy_to_clipboard(table.to_csv())
        self.notify(f"copied {len(table.shown_keys())} {table.PANEL_NAME} rows as CSV")
