"""The rem console: composes the widgets and routes keys and messages to the parts that do the work.

Refresh: the watch sees state.db or its WAL change (on PostgreSQL: the change
feed, `listen_changes`), or the slow poll fires -> the reading task (one worker,
`load_snapshots`) reads the gate's `data_version` and, only if it moved,
`ops.status` (`tui/loading.py`) -> `LiveView` shows or holds it (`tui/live.py`),
which ends the cycle; when the next one may start (the CPU budget) is
`tui/refresh.py`'s.
The parts: `tui/action_runner.py`, `timeline.py`, `panel_controls.py`,
`exports.py`, `gc_policy.py`, `probes.py`; rem itself only through `console_backend.py`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.containers import Grid, Horizontal
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from backend.ops.console import DataDir, ListLimits, StoreEvent, now_ms, settings, store_label
from backend.ops.records import Moment, Status
from tui.action_runner import ACTIONS, KILL_ACTIONS, ActionRunner
from tui.commands import ConsoleCommands
from tui.console_backend import ConsoleBackend, StatusLoader
from tui.exports import CsvExport
from tui.format import home_short, one_line_error, palette_from, visible
from tui.gc_policy import FULL_GC_EVERY_S, FullCollections
from tui.gc_policy import NO_AUTOMATIC_FULL_GC as NO_AUTOMATIC_FULL_GC  # tests name it here
from tui.keys import BINDINGS
from tui.live import LiveView
from tui.loading import SnapshotReader
from tui.panel_controls import PanelControls, focus_now
from tui.panels import BOTTOM, PANELS, TOP, new_panel
from tui.probes import STATS_KEPT, RefreshProbes
from tui.refresh import CPU_SHARE, RefreshScheduler, Ticker, WorkerGroup
from tui.screens.console import ConsoleScreen
from tui.screens.help import HelpScreen, help_markdown, help_sections
from tui.screens.recall import RecallScreen
from tui.timeline import Timeline
from tui.widgets.banner import Banner
from tui.widgets.filter_bar import FilterBar
from tui.widgets.header import ConsoleHeader
from tui.widgets.key_bar import KeyBar
from tui.widgets.snapshot_table import SnapshotTable
from tui.widgets.timeline_bar import TimelineBar
from tui.widgets.trends import Trends

log = logging.getLogger("rem.console")


def route(part: str, method: str) -> Callable[..., Any]:
    """An action or message handler that hands its arguments to `self.<part>.<method>`: the app
    routes keys and messages; the part of the console named does the work."""

    def routed(self: ConsoleApp, *args: Any) -> Any:
        return getattr(getattr(self, part), method)(*args)

    routed.__name__ = routed.__qualname__ = f"{part}.{method}"
    return routed


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
    | k | kill (SIGKILL) the selected worker, a lease's or a tool call's owner, or Chroma from the header |
    | 0 | focus the header's Chroma indicator (k there kills the local Chroma server) |
    | l | release the selected lease |
    | u | resume the selected session a model error holds |
    | a / n | approve / deny the tool call selected in Backlog (an `approve` row) |
    | o | resolve the unknown outcome selected in Backlog: done, retry or fail |
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
    BINDINGS: ClassVar = BINDINGS

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
        # at most one refresh a 40 ms: a commit right after a refresh waits at most that (100 ms gave
        # a p95 of 43-78 ms from commit to screen; 40 ms: 27-30 ms); a busy fleet's commits are
        # paced by the CPU budget instead (RefreshScheduler; None: no budget)
        min_interval_s: float = 0.04,
        cpu_share: float | None = CPU_SHARE,
        at: int | None = None,
        db_url: str | None = None,
    ) -> None:
        super().__init__()
        self.data = data if isinstance(data, DataDir) else DataDir.resolve(data)
        self.read_only, self.chroma_url, self.status_loader = read_only, chroma_url, status_loader
        # the state store watched: state.db in the data dir, or PostgreSQL (`--db`)
        self.db_url = db_url or settings.db_url
        self.data_label = data_label or (
            store_label(self.db_url) if self.db_url else home_short(self.data.root)
        )
        self.watch_files, self.poll_s = watch, poll_s
        self.backend: ConsoleBackend | None = None
        self.palette = palette_from({})  # the theme's colours for cells, resolved once mounted
        self.refresher = RefreshScheduler(
            lambda force: self.reader.start(force),
            self.set_timer,
            min_interval_s=min_interval_s,
            health_s=health_s,
            cpu_share=cpu_share,
        )
        self.timeline = Timeline(self, start_at=at)
        self.probes = RefreshProbes(STATS_KEPT)
        self.stats = self.probes.stats  # what the benchmarks read
        self.live = LiveView(self, self.probes, self.timeline)
        self.reader = SnapshotReader(self)
        self.ticker = Ticker(self.live.tick_panel, self.live.shown_within)
        self.runner = ActionRunner(self)
        self.csv = CsvExport(self)
        self.full_collections = FullCollections()
        self.controls = PanelControls(self)

    # what is shown (`tui/live.py`, `tui/timeline.py`), as the tests and benchmarks read it
    @property
    def latest(self) -> Status | None:
        return self.live.latest

    @property
    def applied(self) -> Status | None:
        return self.live.applied

    @property
    def paused(self) -> bool:
        return self.live.paused

    @property
    def moment(self) -> Moment | None:
        return self.timeline.moment

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Notifications carry ids, paths and errors from the data: one line of plain text, every
        control character (tabs and line breaks too) shown as `visible` shows it everywhere else
        (markup only when a caller asks for it)."""
        message, title = visible(message), visible(title)
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
            yield from map(new_panel, TOP)
        with Grid(id="bottom"):
            yield from map(new_panel, BOTTOM)
        yield FilterBar(id="filter")
        lead, tail = [("⏎", "detail", "Detail")], [("^p", "command_palette", "Palette")]
        yield KeyBar(self.BINDINGS, lead=lead, tail=tail, id="keys")

    def on_mount(self) -> None:
        # widget references held from mount on: timers firing during shutdown find them too
        self.header = self.query_one("#header", ConsoleHeader)
        self.banner = self.query_one("#banner", Banner)
        self.timeline_bar = self.query_one("#timeline", TimelineBar)
        self.trends = self.query_one("#trends", Trends)
        self.filter_bar = self.query_one("#filter", FilterBar)
        self.key_bar = self.query_one("#keys", KeyBar)
        self.show_keys()
        self._panels = {name: self.query_one(f"#{name}", SnapshotTable) for name, _ in PANELS}
        self.palette = palette_from(self.get_css_variables())
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.backend = ConsoleBackend(
            self.data,
            read_only=self.read_only,
            chroma_url=self.chroma_url,
            status_loader=self.status_loader,
            db_url=self.db_url,
        )
        self.header.set_state(palette=self.palette, now=now_ms())
        self.set_interval(Ticker.every_s, self.ticker.all)
        self.set_interval(self.poll_s, self.refresher.poll)
        self.panel("leases").focus()
        self.load_snapshots()
        self.request_refresh(force=True)  # the first read lists every row (`SnapshotReader.list_limits`)
        self.timeline.start()
        if self.watch_files and self.db_url:
            self.watch_store()
        elif self.watch_files:
            self.watch_data_dir()

    def _theme_changed(self, _theme: object) -> None:
        # cell colours are resolved from the theme when drawn: redraw them all
        self.palette = palette_from(self.get_css_variables())
        self.header.set_state(palette=self.palette)
        for table in self.panels():
            table.restyle(self.palette)

    def on_unmount(self) -> None:
        self.full_collections.give_back()  # the process outlives the app (tests, `rem bench`)
        if self.backend is not None:
            self.backend.close()

    def panel(self, name: str) -> SnapshotTable:
        return self._panels[name]

    def panels(self) -> list[SnapshotTable]:
        return [self.panel(name) for name, _ in PANELS]

    # -- live refresh (when: tui/refresh.py; what is shown: tui/live.py) ------------------
    def request_refresh(self, force: bool = False, urgent: bool = False) -> None:
        """Start a refresh now, or right after the running one (never two at once); `urgent` (the
        operator's own asking) waits for no budget."""
        self.refresher.request(force, urgent=urgent)

    # what showing a snapshot raises is a bug: it ends the app, as a message handler's would
    @work(exclusive=True, group=WorkerGroup.SNAPSHOT, exit_on_error=True)
    async def load_snapshots(self) -> None:
        """The reading task: each refresh cycle reads the snapshot if the gate moved (or forced) and
        hands it to `LiveView` (`tui/loading.py`)."""
        await self.reader.serve()

    def snapshot_loaded(self, snapshot: Status, version: int, took_ms: float, limits: ListLimits) -> None:
        self.live.snapshot_loaded(snapshot, version, took_ms, limits)

    def snapshot_failed(self, error: BaseException) -> None:
        self.live.failed(error)

    def store_changed(self, event: StoreEvent) -> None:
        self.live.store_changed(event)

    def seen_version(self) -> int | None:
        return self.live.seen_version

    def on_snapshot_table_window_changed(self, _message: SnapshotTable.WindowChanged) -> None:
        # rows scrolled into view (or a filter, a sort, a bigger panel) that were not read: read them
        self.request_refresh(force=True, urgent=True)

    def refresh_finished(self, read: bool = True) -> None:
        """The refresh cycle ended: the snapshot shown or held (`LiveView`), or none read (the gate)."""
        self.refresher.finished(read)

    def refresh_rate(self) -> str:
        """The refresh interval in use, for the header (`RefreshScheduler.describe`)."""
        return self.refresher.describe()

    @work(exclusive=True, group=WorkerGroup.WATCH, exit_on_error=False)
    async def watch_data_dir(self) -> None:
        """Ask for a refresh when state.db or its WAL changes (`tui/loading.py`)."""
        await self.reader.watch_data_dir()

    @work(exclusive=True, group=WorkerGroup.WATCH, exit_on_error=False)
    async def watch_store(self) -> None:
        """PostgreSQL: ask for a refresh for each burst of this store's commits (`tui/loading.py`)."""
        await self.reader.watch_store()

    apply_pending = route("live", "apply_pending")  # held back by a pause, a modal or the past
    tick = route("ticker", "all")  # every panel's countdowns (never the database)

    def apply_snapshot(self, snapshot: Status, now: int | None = None) -> None:
        """Show a snapshot (`now`: a recorded moment's time); `applied` is set once every panel shows it."""
        self.live.show(snapshot, now)

    def snapshot_shown(self, cycle_s: float, *, first: bool) -> None:
        if first:  # from the first snapshot shown on, full collections run on the console's timer
            self.full_collections.take_over(FULL_GC_EVERY_S, self.set_interval)

    # -- failures: one handler for every worker ------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker, state = event.worker, event.state
        finished = state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED)
        if state == WorkerState.ERROR:
            self._worker_failed(worker, worker.error)
        elif finished:
            self.runner.finished(worker)

    def _worker_failed(self, worker: Worker[Any], error: BaseException | None) -> None:
        if worker.group in (WorkerGroup.ACTION, WorkerGroup.DRY_RUN):
            self.runner.failed(worker, error)
        elif worker.group == WorkerGroup.TIMELINE:
            self.timeline.failed(self.one_line(error))
        elif worker.group == WorkerGroup.WATCH:
            watching = "the change feed" if self.db_url else "file watching"
            self.notify(f"{watching} stopped ({error}); polling every {self.poll_s:g} s", severity="warning")
        elif worker.group != WorkerGroup.SNAPSHOT:
            self.notify(f"{worker.group}: {self.one_line(error)}", severity="error")
            log.error("worker %s failed", worker.name, exc_info=error)

    def one_line(self, error: BaseException | None) -> str:
        """An error as one line, the data dir shown as in the header (short, and stable)."""
        return one_line_error(error).replace(str(self.data.root), self.data_label)

    # -- actions (tui/action_runner.py) and the timeline (tui/timeline.py) -------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ACTIONS and (self.read_only or self.timeline.moment is not None):
            return None  # greyed out; read-only: the library would refuse anyway; the past: not actionable
        return True

    execute_plan = route("runner", "execute")
    on_dry_run_ready = route("runner", "dry_run_ready")
    on_action_completed = route("runner", "action_completed")
    action_replay_selected = route("runner", "replay_selected")
    action_replay_all = route("runner", "replay_all")
    action_drain = route("runner", "drain")
    action_release = route("runner", "release")
    action_resume = route("runner", "resume")
    action_approve = route("runner", "approve")
    action_deny = route("runner", "deny")
    action_resolve = route("runner", "resolve")
    action_kill = route("runner", "kill")  # the plans: tui/kill.py
    action_kill_chroma = route("runner", "kill_chroma")

    def action_focus_header(self) -> None:
        focus_now(self.header)

    on_moment_loaded = route("timeline", "moment_loaded")
    action_timeline = route("timeline", "toggle")
    action_timeline_seek = route("timeline", "seek")

    # -- operator comforts ------------------------------------------------------------
    def action_recall(self) -> None:
        if self.backend is not None:
            self.push_screen(RecallScreen(self.backend.recall, describe_error=self.one_line))

    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_markdown(help_sections(self.BINDINGS))))

    def show_keys(self) -> None:
        """The key bar: what is disabled now greyed out, and Pause named for what it does."""
        labels = {"toggle_pause": "Resume" if self.paused else "Pause"}
        self.key_bar.show_keys(self.key_enabled, labels)

    def key_enabled(self, action: str) -> bool:
        """Whether the key bar shows `action` as usable now (a kill key, pressed anyway, says why not)."""
        if action in KILL_ACTIONS:
            return not (self.read_only or self.timeline.moment is not None)
        return self.check_action(action, ()) is True

    action_toggle_pause = route("live", "toggle_pause")

    focused_panel = route("controls", "focused_panel")
    on_descendant_focus = route("controls", "focus_changed")
    action_focus_panel = route("controls", "focus")
    action_filter = route("controls", "open_filter")
    on_filter_bar_filter_changed = route("controls", "filter_changed")
    action_sort = route("controls", "sort")
    action_reverse_sort = route("controls", "reverse_sort")
    on_panel_table_header_selected = route("controls", "header_clicked")
    on_panel_table_row_selected = route("controls", "row_selected")
    action_detail = route("controls", "detail")
    action_toggle_maximize = route("controls", "toggle_maximize")

    def action_refresh_now(self) -> None:
        self.request_refresh(force=True, urgent=True)

    action_export_csv = route("csv", "export_focused")  # to logs/ (or here); read-only: where asked
    action_copy_csv = route("csv", "copy_focused")
