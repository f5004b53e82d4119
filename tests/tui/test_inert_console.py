"""The console shows stored text inert: markup as typed, control characters as escapes.

Hostile text goes where other processes, hosts and models put it (a worker's host and owner
id, a journal row's actor, target and data, a held session's reason, a failed summary's error,
a parked recovery's error); the console then shows its panels, the detail of a journal row,
a drain confirmation, the drain's notification and the action log. What reaches the screen
holds no control character, and the full values show, escaped.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from rich.console import Console
from textual.widgets import DataTable, Input, Static

from backend import ops
from backend.core import clock
from backend.core.datadir import DataDir
from backend.core.inert import is_inert, visible
from backend.runtime.context import Context
from tests.backend.test_recall import settle, write_jsonl
from tests.hostile import as_column, hostile_text
from tests.tui import scenes
from tests.tui.test_console import SIZE, confirm_modal, console, loaded, press_confirm, select, until
from tui.app import ConsoleApp
from tui.screens.detail import DetailScreen
from tui.screens.recall import RecallScreen


def hostile_scene(text: str) -> Callable[[scenes.Scene], None]:
    line = as_column(text)
    owner = f"executor-{line}-4109-abcdef"

    def step(scene: scenes.Scene) -> None:
        def rows() -> None:
            scene.worker(owner, "executor", 4109, host=line)
            scene.usage("s-held", tokens=(10, 10, 0, 0), cost=0.01, turns=1, held=line)
            scene.summary("s-failed", status="failed", error=line, attempts=3)
            scene.recovery("exe_0042", "s-parked", error=line, attempts=10)
            scene.event("operator.release", line, ago_ms=1_000, target=line, error=text)

        scene.tx(rows)

    return step


def screen_text(app: ConsoleApp) -> str:
    """Every character the current screen draws (its strips' text, without Textual's own controls)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def rendered(widget: Static) -> str:
    """A Static's content as Rich renders it, wide enough never to wrap or fold."""
    out = Console(width=4000, file=io.StringIO(), record=True)
    out.print(widget.content)
    return out.export_text()


def flat(text: str) -> str:
    return " ".join(text.split())


async def show_everything(app: ConsoleApp, text: str) -> None:
    line = as_column(text)
    owner = f"executor-{line}-4109-abcdef"
    async with app.run_test(size=(160, 50)) as pilot:
        await loaded(pilot)
        assert is_inert(screen_text(app), multiline=True), screen_text(app)
        # the journal row's detail: its actor, target and data in full
        await pilot.press("7")  # the action log, where operator.* journal rows show
        await pilot.press("home", "enter")
        detail = await until(pilot, lambda: isinstance(app.screen, DetailScreen) and app.screen, "the detail")
        history = detail.query_one("#history", Static)
        await until(pilot, lambda: "loading" not in rendered(history), "the journal history")
        assert is_inert(screen_text(app), multiline=True), screen_text(app)
        assert flat(visible(line)) in flat(rendered(history))
        assert flat(visible(line)) in flat(rendered(detail.query_one("#row", Static)))
        await pilot.press("escape")
        # a drain names the worker's owner id and host; the notification names the owner again
        await pilot.press("5")
        await select(pilot, app.panel("workers"), owner)
        await pilot.press("d")
        confirm = await confirm_modal(pilot)
        assert is_inert(screen_text(app), multiline=True), screen_text(app)
        assert flat(f"on {visible(line)}") in flat(rendered(confirm.query_one("#body", Static)))
        await press_confirm(pilot)
        notes = await until(pilot, lambda: [n for n in app._notifications if "drain" in n.message], "a note")
        assert flat(visible(owner)) in flat(notes[0].message)
        await pilot.pause()
        assert is_inert(screen_text(app), multiline=True), screen_text(app)
        actions = app.panel("actions")
        assert any(is_inert(actions.cell_text(key, "message")) for key in actions.shown_keys())


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_text)
@example(text="\U000e0041[/]\ud800[/][/]\t¯\t")  # CI: the drain notification kept the raw tabs
def test_stored_text_reaches_the_console_inert(clock_at_scene: clock.FrozenClock, text: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        data = scenes.build(Path(root) / "data", hostile_scene(text))
        app = ConsoleApp(data, data_label="data", watch=False)
        asyncio.run(show_everything(app, text))


# the turn: markup that crashed, styled and linked; a title, a clear screen and a NUL
TURN = "zebrafish \x1b]0;pwned\x07 \x1b[2J\x00 [/] [bold red]RED[/] [link=https://evil.example]x[/link]"
SPEAKER = "[/]eve\x1b[2J"


async def test_recalled_turns_show_inert_on_the_recall_screen(
    data_dir: DataDir, chroma_url: str, collection: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_CHROMA_COLLECTION", collection)
    row = {"project": "ops", "session": "s1", "id": "m1", "role": "user", "speaker": SPEAKER, "text": TURN}
    ctx = Context(data_dir, chroma_url=chroma_url)
    try:
        await ops.import_file(ctx, write_jsonl(tmp_path / "chat.jsonl", [{**row, "time": 1_700_000_000_000}]))
        await settle(ctx)
    finally:
        await ctx.close()
    async with console(data_dir, chroma_url=chroma_url, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        app.action_recall()
        screen = await until(pilot, lambda: isinstance(app.screen, RecallScreen) and app.screen, "recall")
        screen.query_one("#recall-query", Input).value = "zebrafish"
        screen.query_one("#recall-project", Input).value = "ops"
        screen.query_one("#recall-query", Input).focus()
        await pilot.press("enter")
        items = screen.query_one("#recall-items", DataTable)
        await until(pilot, lambda: items.row_count > 0, "ranked items")
        turn = next(r for r in map(items.get_row_at, range(items.row_count)) if str(r[1]) == "turn")
        assert str(turn[4]) == visible(SPEAKER)  # escaped, never markup
        # the import kept the NUL as U+FFFD
        assert str(turn[5]).startswith(r"zebrafish \x1b]0;pwned\x07 \x1b[2J" + "\ufffd [/] [bold red]RED[/]")
        assert is_inert(screen_text(app), multiline=True), screen_text(app)
