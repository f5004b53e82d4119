"""What a refresh paints: the lines it changed, and nothing else (counted, never timed).

A screen update costs what it paints, so these count what is painted: the
widgets whose lines a screen update renders (`Widget.render_lines`), and
the row strips a panel renders. The console runs over a real data dir; a
commit by another connection is what a refresh shows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual._styles_cache import StylesCache
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.screen import Screen as TextualScreen
from textual.widget import Widget

from backend.core.datadir import DataDir
from tests.tui import scenes
from tests.tui.test_console import SIZE, console, loaded, until
from tui.app import ConsoleApp
from tui.live import LiveView
from tui.refresh import Ticker
from tui.widgets.panel_table import PanelTable, TableColumn


class Painted:
    """From `start()` on: the widgets whose lines screen updates render (from their cache or not),
    and how many lines were rendered anew (not from a widget's cache of its lines)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.widgets: Counter[str] = Counter()
        self.lines = 0
        self.on = False
        render_lines, render_line = Widget.render_lines, StylesCache.render_line
        painted = self

        def counted(widget: Widget, crop: Region) -> Any:
            if painted.on:
                painted.widgets[widget.id or type(widget).__name__] += 1
            return render_lines(widget, crop)

        def counted_line(cache: StylesCache, *args: Any) -> Any:
            painted.lines += painted.on
            return render_line(cache, *args)

        monkeypatch.setattr(Widget, "render_lines", counted)
        monkeypatch.setattr(StylesCache, "render_line", counted_line)

    def start(self) -> None:
        self.widgets.clear()
        self.lines, self.on = 0, True


async def refreshed(pilot: Any, app: ConsoleApp, applies: int) -> None:
    """Wait until a snapshot after the `applies`th is shown and painted (its cycle ends once painted)."""
    await until(pilot, lambda: app.stats["applies"] > applies and app.refresher.idle, "the refresh")


async def test_a_refresh_that_changes_nothing_paints_nothing(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    painted = Painted(monkeypatch)
    # no budget: the header's interval is the floor, not what this machine's CPU made it
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600, cpu_share=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        for n in range(4):  # the same rows read again (forced: past the data_version gate), and shown
            applies = app.stats["applies"]
            painted.start()
            await pilot.press("ctrl+r")
            await refreshed(pilot, app, applies)
            await pilot.pause()
            assert app.applied is app.latest
            if n:  # (the first read a window of each list where the very first read them whole)
                assert painted.widgets == Counter(), painted.widgets


def one_commit(data: DataDir, n: int) -> None:
    """A journal row, and a lease renewed: Events (bottom left) and Leases (top, second) change."""
    scene = scenes.Scene(data.root)
    try:
        scene.tx(
            lambda: (
                scene.event("execution.step", scenes.EXEC_A, ago_ms=100 - n, session_id="s-alpha"),
                scene.x("UPDATE session_execution SET expires_at = expires_at + 5000 WHERE id = 'exe_0001'"),
            )
        )
    finally:
        scene.close()


def journal(data: DataDir, n: int) -> None:
    """A journal row: only Events changes."""
    scene = scenes.Scene(data.root)
    try:
        scene.tx(lambda: scene.event("execution.step", scenes.EXEC_A, ago_ms=-n, session_id="s-alpha"))
    finally:
        scene.close()


def admit(data: DataDir, session: str) -> None:
    """An input admitted (its journal row too): Backlog, its trend, Events and the header change."""
    scene = scenes.Scene(data.root)
    try:
        scene.tx(
            lambda: (
                scene.inputs(session, 1, oldest_ago_ms=9_000),
                scene.event("input.admitted", "cli", ago_ms=100, session_id=session),
            )
        )
    finally:
        scene.close()


async def test_a_commit_paints_the_widgets_it_changed_and_no_other(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The panels inside the box around the two that changed (Backlog above Events, Workers between
    them, Receipts beside Leases), the containers behind them and the screen render nothing, and
    the two that changed only their lines that changed."""
    painted = Painted(monkeypatch)
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600, cpu_share=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        for n in range(3):
            one_commit(healthy_dir, n)
            applies = app.stats["applies"]
            painted.start()
            app.request_refresh()
            await refreshed(pilot, app, applies)
            await pilot.pause()
            assert {"leases", "events"} <= set(painted.widgets), painted.widgets
            if n:  # (the first read a window of each list where the very first read them whole)
                # (nor the panels' scrollbars: a row that changed is no reason to paint its bar)
                assert set(painted.widgets) <= {"leases", "events"}, painted.widgets
                # a lease row moved (renewed: later expiry), the event rows moved down one
                rows = app.panel("leases").row_count + app.panel("events").body_height
                assert painted.lines <= rows, (painted.lines, painted.widgets)


class Screen:
    """A terminal's cells as an app's screen updates left them (what a real terminal would show)."""

    def __init__(self, width: int, height: int) -> None:
        self.cells = [[("?", "")] * width for _ in range(height)]

    def apply(self, segments: list[Segment]) -> None:
        x = y = 0
        for segment in segments:
            if segment.control:
                for control in segment.control:
                    if len(control) == 3:  # CURSOR_MOVE_TO x y
                        _, x, y = control
                continue
            for char in segment.text:
                if char == "\n":
                    x, y = 0, y + 1
                    continue
                self.cells[y][x] = (char, str(segment.style))
                x += cell_len(char)

    def text(self) -> list[str]:
        return ["".join(c for c, _ in row) for row in self.cells]


async def test_the_screen_painted_line_by_line_is_the_screen_rendered_whole(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every update a real terminal would get, applied in turn, leaves the screen a full render draws:
    no line is left stale by painting only the lines that changed."""
    updates: list[Any] = []
    display = App._display

    def captured(app: App[Any], screen: Any, renderable: Any) -> None:
        if renderable is not None:
            updates.append(renderable)
        display(app, screen, renderable)

    monkeypatch.setattr(App, "_display", captured)
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        for n in range(4):  # commits that move rows of several panels, and keys that move a cursor
            admit(healthy_dir, f"s-new-{n}")
            one_commit(healthy_dir, n)
            applies = app.stats["applies"]
            app.request_refresh()
            await refreshed(pilot, app, applies)
            await pilot.press("1", "down", "6", "down")
            await pilot.pause()
        terminal = Screen(*SIZE)
        for update in updates:
            terminal.apply(list(app.console.render(update)))
        for widget in app.screen.walk_children(with_self=True):  # drawn afresh: no line kept
            widget._styles_cache.clear()
        whole = Screen(*SIZE)
        whole.apply(list(app.console.render(app.screen._compositor.render_full_update())))
        assert len(updates) > 8
        assert terminal.text() == whole.text()
        assert terminal.cells == whole.cells


class Rows(PanelTable):
    """A panel table over rows given as key -> (version, text)."""

    def __init__(self) -> None:
        super().__init__(id="rows")
        self.rows: dict[str, tuple[int, str]] = {"a": (1, "alpha"), "b": (1, "bravo")}

    def row_cells(self, key: str) -> list[Text]:
        return [Text(self.rows[key][1])]

    def row_version(self, key: str) -> int:
        return self.rows[key][0]


class RowsApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Rows()


async def test_a_row_changed_once_is_rendered_once_not_on_every_paint_after() -> None:
    app = RowsApp()
    async with app.run_test(size=(40, 6)) as pilot:
        table = app.query_one(Rows)
        table.set_columns([TableColumn("text", "text", 10)])
        table.set_order(["a", "b"])
        table.refresh_changed()
        await pilot.pause()
        assert table.strips_made == 2
        table.rows["b"] = (2, "bravo 2")  # a countdown ticked, a cell changed
        table.refresh_changed()
        await pilot.pause()
        assert table.strips_made == 3
        for _ in range(2):  # painted again as it is (a row moved, a panel repainted): from the cache
            table.refresh()
            await pilot.pause()
            assert table.strips_made == 3


async def test_a_row_that_moves_is_not_framed_again() -> None:
    """A row drawn before and moved to another line (the rows above it changed) is neither rendered
    nor framed (border, padding) again: both are kept by row, not by line."""
    app = RowsApp()
    async with app.run_test(size=(40, 6)) as pilot:
        table = app.query_one(Rows)
        table.styles.border = ("round", "white")
        table.set_columns([TableColumn("text", "text", 10)])
        table.rows["c"] = (1, "charlie")
        table.set_order(["a", "b", "c"])
        table.refresh_changed()
        await pilot.pause()
        made, framed = table.strips_made, table._styles_cache.framed
        table.set_order(["b", "c"])  # "a" gone: "b" and "c" move up a line ("b" under the cursor)
        table.refresh_changed()
        await pilot.pause()
        assert table.strips_made == made + 1  # "b" has the cursor now: drawn again, once
        # framed: "b" (the cursor's look) and the blank line "c" left; "c", moved up, is not
        assert table._styles_cache.framed == framed + 2
        assert [table.render_line(y).text.strip() for y in (1, 2)] == ["bravo", "charlie"]


async def test_a_column_that_widens_within_the_panel_lays_nothing_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An auto column grows with its widest cell; while the rows fit in the panel the virtual size
    stays, and with it the screen's layout (a whole-screen layout was ~5 ms of a refresh); rows
    wider than the panel get their width, to scroll to."""
    layouts: list[TextualScreen[Any]] = []
    refresh_layout = TextualScreen._refresh_layout

    def counted(screen: TextualScreen[Any], *args: Any, **kwargs: Any) -> None:
        layouts.append(screen)
        refresh_layout(screen, *args, **kwargs)

    monkeypatch.setattr(TextualScreen, "_refresh_layout", counted)
    app = RowsApp()
    async with app.run_test(size=(40, 6)) as pilot:
        table = app.query_one(Rows)
        table.set_columns([TableColumn("text", "text", None)])
        table.set_order(["a", "b"])
        table.refresh_changed()
        await pilot.pause()
        viewport, virtual, width = table.scrollable_content_region.width, table.virtual_size, table.row_width
        layouts.clear()
        table.rows["b"] = (2, "bravo, a little wider")
        table.measure_columns()
        table.refresh_changed()
        await pilot.pause()
        assert width < table.row_width <= viewport
        assert table.virtual_size == virtual and layouts == []
        assert "bravo, a little wider" in table.render_line(2).text
        await pilot.resize_terminal(20, 6)  # the panel narrower than its rows: they scroll now
        await pilot.pause()
        assert table.virtual_size.width == table.row_width > table.scrollable_content_region.width
        await pilot.resize_terminal(40, 6)
        await pilot.pause()
        table.rows["b"] = (3, "bravo, " + "much " * 10 + "wider than the panel")
        table.measure_columns()
        await pilot.pause()
        assert table.virtual_size.width == table.row_width > viewport and layouts


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_snapshots_shown_each_second_draw_the_countdowns_without_the_tick(
    healthy_dir: DataDir, clock_at_scene: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each snapshot shown draws the countdowns of a new second, in panels no commit changed too;
    a tick within half a second of one has nothing to add and does nothing, a later one ticks."""
    monkeypatch.setattr(Ticker, "every_s", 3600.0)  # the test ticks by hand
    ticked = Counter[str]()
    tick_panel = LiveView.tick_panel

    def counted(live: LiveView, name: str) -> None:
        ticked[name] += 1
        tick_panel(live, name)

    monkeypatch.setattr(LiveView, "tick_panel", counted)
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600, cpu_share=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        app.live.clock = clock = Clock()
        leases = app.panel("leases")
        left = int(leases.cell_text("execution:exe_0002", "left")[:-1])
        for n in range(3):  # a journal row a second: Events changes, Leases does not
            clock_at_scene.advance(1_000)
            await asyncio.to_thread(journal, healthy_dir, n)
            applies = app.stats["applies"]
            app.request_refresh()
            await refreshed(pilot, app, applies)
            # the lease's countdown moved with the clock, drawn by the snapshot shown (no tick ran)
            assert leases.cell_text("execution:exe_0002", "left") == f"{left - n - 1}s"
            clock.now += 0.4
            app.ticker.all()  # 0.4 s after a snapshot: it drew this second's countdowns already
            assert ticked == Counter()
        clock.now += 0.2  # no snapshot for 0.6 s: the tick draws the countdowns again
        app.ticker.all()
        assert ticked["leases"] == 1 and app.ticker.skipped == 3
