"""Keys that arrive in one go, as tmux's send-keys or a quick hand sends them: a number key focuses
its panel before the next key is handled, so `1` then Home moves Backlog's cursor, not the cursor
of the panel focused before."""

from __future__ import annotations

from textual import events

from backend.core.datadir import DataDir
from tests.tui.test_console import SIZE, console, loaded, table, until


async def test_a_number_key_then_home_in_one_go_moves_the_new_panels_cursor(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        backlog, leases = table(app, "backlog"), table(app, "leases")
        await pilot.press("1", "down", "down", "2", "down")
        await until(pilot, lambda: backlog.cursor_row == 2 and leases.cursor_row == 1, "both cursors moved")
        for key, character in (("1", "1"), ("home", None)):  # queued together, nothing handled between
            app.post_message(events.Key(key, character))
        await until(pilot, lambda: app.focused is backlog, "Backlog focused")
        await pilot.pause()
        assert backlog.cursor_row == 0 and leases.cursor_row == 1
