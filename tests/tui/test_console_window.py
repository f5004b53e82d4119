"""A refresh costs what the screen shows: a backlog of 3 000 inputs is read and drawn a screenful at a time.

The promise: a refresh reads and renders what the visible rows need; the counts
come from the counters. The console runs over a real store (state.db, or a
real PostgreSQL) holding 3 000 waiting inputs; another connection commits as
an executor would (the oldest input promoted, a new one admitted), and the
refresh that commit causes is held to the rows on screen: the rows each
windowed list of the snapshot holds, and the rows each panel renders.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backend.core.datadir import DataDir
from backend.ops.console import LIST_CAP
from backend.ops.records import Status
from tests.tui import scenes
from tests.tui.test_console import SIZE, loaded, table, until
from tui.app import ConsoleApp
from tui.widgets.snapshot_table import SnapshotTable

BACKLOG = 3_000
NOW = scenes.NOW


def write_rows(
    data: DataDir, db_url: str | None, statements: list[tuple[str, list[tuple[Any, ...]]]]
) -> None:
    """Each statement with its rows, in one transaction, on the test's store (a migrated state.db, or
    the PostgreSQL database)."""
    if db_url is None:
        scenes.Scene(data.root).close()  # a migrated state.db
        with sqlite3.connect(data.state_db) as conn:
            for sql, rows in statements:
                conn.executemany(sql, rows)
        return
    with psycopg.connect(db_url) as pg:
        for sql, rows in statements:
            with pg.cursor() as cursor:
                cursor.executemany(sql.replace("?", "%s"), rows)


def fill(data: DataDir, db_url: str | None) -> None:
    """3 000 sessions with one waiting input each (oldest first by session), two executors."""
    sessions = [(f"s-{i:05d}", f"session {i}", NOW - 3_600_000, NOW - 3_600_000) for i in range(BACKLOG)]
    inputs = [
        (f"in_s-{i:05d}_1", f"s-{i:05d}", "{}", "queue", 1, 1, NOW - 600_000 + i) for i in range(BACKLOG)
    ]
    workers = [
        (scenes.EXEC_A, "executor", 4101, "ops-1", NOW - 600_000, NOW, "running"),
        (scenes.EXEC_B, "executor", 4102, "ops-1", NOW - 600_000, NOW, "running"),
    ]
    statements = [
        ("INSERT INTO session (id, title, time_created, time_updated) VALUES (?,?,?,?)", sessions),
        (
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES (?,?,?,?,?,?,?)",
            inputs,
        ),
        (
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES (?,?,?,?,?,?,?)",
            workers,
        ),
    ]
    write_rows(data, db_url, statements)


def fill_running(data: DataDir, db_url: str | None, calls: int) -> None:
    """`calls` tool calls in flight in executor A (one session each, oldest first), and the one
    input of the 3 000 the Backlog lists after them."""
    sessions = [(f"s-{i:05d}", f"session {i}", NOW - 3_600_000, NOW - 3_600_000) for i in range(calls)]
    running = [
        (f"c-{i:05d}", f"s-{i:05d}", f"e-{i}", f"m-{i}", "running", f"k-{i}", scenes.EXEC_A, NOW - 60_000 + i)
        for i in range(calls)
    ]
    statements = [
        ("INSERT INTO session (id, title, time_created, time_updated) VALUES (?,?,?,?)", sessions),
        (
            "INSERT INTO tool_call (id, session_id, execution_id, step, idx, model_call_id, tool, arguments, "
            "effect, effect_source, permission, state, idempotency_key, owner_id, epoch, starts, "
            "time_created, time_updated) VALUES (?, ?, ?, 1, 0, ?, 'demo.send', '{}', 'effect', 'config', "
            "'ask', ?, ?, ?, 1, 1, ?, ?)",
            [(*call, call[-1]) for call in running],
        ),
        (
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES (?,?,?,?,?,?,?)",
            [(scenes.EXEC_A, "executor", 4101, "ops-1", NOW - 600_000, NOW, "running")],
        ),
        (
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES (?,?,?,?,?,?,?)",
            [("in-last", "s-00000", "{}", "queue", 1, 1, NOW - 600_000)],
        ),
    ]
    write_rows(data, db_url, statements)


def executor_turn(data: DataDir, db_url: str | None, n: int) -> None:
    """What an executor's commit does to the backlog: the oldest input promoted, a new one admitted
    (to the same session, now the newest), and a journal row."""
    statements = [
        "UPDATE session_input SET promoted_seq = admitted_seq, wake_pending = 0 WHERE id = ?",
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
        "time_created) VALUES (?, ?, '{}', 'queue', 2, 1, ?)",
        "INSERT INTO event (time, kind, actor, session_id) VALUES (?, 'execution.claimed', ?, ?)",
    ]
    session = f"s-{n:05d}"
    params = [(f"in_{session}_1",), (f"in_{session}_2", session, NOW + n), (NOW + n, scenes.EXEC_A, session)]
    if db_url is None:
        with sqlite3.connect(data.state_db, isolation_level=None, timeout=10) as conn:
            conn.execute("BEGIN IMMEDIATE")
            for sql, values in zip(statements, params, strict=True):
                conn.execute(sql, values)
            conn.execute("COMMIT")
        return
    with psycopg.connect(db_url) as pg:
        for sql, values in zip(statements, params, strict=True):
            pg.execute(sql.replace("?", "%s"), values)


def windowed_rows(snapshot: Status) -> dict[str, int]:
    """The rows each windowed list of the snapshot holds, by the panel that shows it."""
    backlog, tools = snapshot["backlog"], snapshot["tools"]
    return {
        "backlog": len(backlog["inputs"])
        + len(backlog["recoveries"])
        + len(backlog["held"])
        + len(backlog["summary_jobs"]["failed_rows"])
        + len(tools["awaiting_approval"])
        + len(tools["unknown_outcome"])
        + len(tools["running"]),
        "receipts": len(snapshot["receipts"]["mismatched"]),
        "drift": len(snapshot["dream_drift"]),
        "events": len(snapshot["events"]),
        "actions": len(snapshot["recent_actions"]),
        "sessions": len(snapshot["usage"]["sessions"]),
    }


class Renders:
    """Every row a panel renders (cells made from a record): whether it was on screen then, and
    how many a snapshot's `show` rendered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.off_screen: list[tuple[str, str]] = []
        self.by_show: list[tuple[str, int]] = []  # (panel, rows rendered)
        update, show = SnapshotTable._update_cells, SnapshotTable.show
        renders = self

        def counted_update(table: SnapshotTable, row: Any, columns: Any) -> bool:
            if row.key not in table.keys_on_screen():
                renders.off_screen.append((str(table.id), row.key))
            return update(table, row, columns)

        def counted_show(table: SnapshotTable, *args: Any, **kwargs: Any) -> None:
            before = table.rows_rendered
            show(table, *args, **kwargs)
            renders.by_show.append((str(table.id), table.rows_rendered - before))

        monkeypatch.setattr(SnapshotTable, "_update_cells", counted_update)
        monkeypatch.setattr(SnapshotTable, "show", counted_show)


@pytest.mark.both_stores
async def test_a_refresh_reads_and_draws_no_more_rows_than_the_screen_shows(
    tmp_path: Path, db_url: str | None, monkeypatch: pytest.MonkeyPatch, clock_at_scene: Any
) -> None:
    data = DataDir(tmp_path / "data")
    await asyncio.to_thread(fill, data, db_url)
    renders = Renders(monkeypatch)
    app = ConsoleApp(data, data_label="data", db_url=db_url, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        if db_url:
            await until(pilot, lambda: app.backend is not None and app.backend.listening, "the listener")
        backlog = table(app, "backlog")
        await until(pilot, lambda: app.refresher.idle and backlog.shown_keys()[:1] == ["in:s-00000"])
        for n in range(3):  # three commits, three refreshes (or fewer: each reads what is committed)
            renders.by_show.clear()
            applied = app.stats["applies"]
            await asyncio.to_thread(executor_turn, data, db_url, n)
            first = f"in:s-{n + 1:05d}"
            await until(pilot, lambda f=first: backlog.shown_keys()[:1] == [f], "the oldest promoted")
            await until(pilot, lambda a=applied: app.stats["applies"] > a and app.refresher.idle)
            snapshot = app.latest
            assert snapshot is not None and snapshot is app.applied
            on_screen = {panel.id: panel.body_height for panel in app.panels()}
            # read: every windowed list holds at most the rows its panel shows
            for panel, rows in windowed_rows(snapshot).items():
                assert rows <= on_screen[panel], (panel, rows, on_screen[panel])
            assert windowed_rows(snapshot)["backlog"] == on_screen["backlog"]
            # drawn: at most the rows on screen, by each snapshot shown
            assert renders.by_show, "no snapshot shown"
            for panel, rows in renders.by_show:
                assert rows <= on_screen[panel], (panel, rows, on_screen[panel])
        # and never a row off screen, by a refresh or by the countdowns' tick
        assert renders.off_screen == []
        # what is not read is still counted (the counters), and the panel scrolls over it
        assert snapshot["counts"]["backlog"] == BACKLOG
        assert backlog.border_title == f"Backlog {BACKLOG}"
        assert backlog.shown_keys() == [f"in:s-{n:05d}" for n in range(3, 3 + on_screen["backlog"])]
        assert backlog.total_rows > len(backlog.shown_keys())


@pytest.mark.both_stores
async def test_rows_scrolled_into_view_are_read_then(
    tmp_path: Path, db_url: str | None, clock_at_scene: Any
) -> None:
    data = DataDir(tmp_path / "data")
    await asyncio.to_thread(fill, data, db_url)
    app = ConsoleApp(data, data_label="data", db_url=db_url, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        if db_url:
            await until(pilot, lambda: app.backend is not None and app.backend.listening, "the listener")
        backlog = table(app, "backlog")
        await asyncio.to_thread(executor_turn, data, db_url, 0)  # a refresh after the first: a window
        await until(pilot, lambda: backlog.shown_keys()[:1] == ["in:s-00001"] and app.refresher.idle)
        assert len(backlog.shown_keys()) == backlog.body_height
        reads = app.stats["loads"]
        await pilot.press("1", "pagedown", "pagedown")
        # the cursor is on a row not read yet: it is read (no commit needed) and the cursor lands on it
        row = backlog.cursor_row
        assert row >= 2 * backlog.body_height - 1
        await until(
            pilot, lambda: backlog.selected_key() == f"in:s-{row + 1:05d}", "the row under the cursor"
        )
        assert app.stats["loads"] > reads
        # what was read: the rows down to the bottom of the screen, no more
        assert app.latest is not None
        assert len(app.latest["backlog"]["inputs"]) == backlog.first_row_on_screen() + backlog.body_height


async def test_an_export_has_every_row_the_panel_lists_not_those_on_screen(
    tmp_path: Path, clock_at_scene: Any
) -> None:
    data = DataDir(tmp_path / "data")
    await asyncio.to_thread(fill, data, None)
    app = ConsoleApp(data, data_label="data", poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        backlog = table(app, "backlog")
        await asyncio.to_thread(executor_turn, data, None, 0)
        await until(pilot, lambda: backlog.shown_keys()[:1] == ["in:s-00001"] and app.refresher.idle)
        assert len(backlog.shown_keys()) == backlog.body_height  # a window of the list
        await pilot.press("1", "e")
        await until(pilot, lambda: list(data.logs.glob("console-backlog-*.csv")), "the export")
        (path,) = data.logs.glob("console-backlog-*.csv")
        rows = path.read_text().splitlines()[1:]
        assert len(rows) == LIST_CAP  # what the panel lists (the title counts all 3 000)
        assert rows[0].startswith("input,s-00001,") and rows[-1].startswith(f"input,s-{LIST_CAP:05d},")
        # then back to a window: the next refresh reads the rows on screen again
        await asyncio.to_thread(executor_turn, data, None, 1)
        await until(pilot, lambda: backlog.shown_keys()[:1] == ["in:s-00002"] and app.refresher.idle)
        assert len(backlog.shown_keys()) == backlog.body_height


@pytest.mark.both_stores
async def test_the_running_calls_are_counted_so_the_backlog_scrolls_over_all_of_them(
    tmp_path: Path, db_url: str | None, clock_at_scene: Any
) -> None:
    """More calls in flight than the Backlog shows: it reads a screenful of them, scrolls over all
    (the count includes them) and reads the rest, down to the input after them, once scrolled to."""
    data = DataDir(tmp_path / "data")
    calls = 60
    await asyncio.to_thread(fill_running, data, db_url, calls)
    app = ConsoleApp(data, data_label="data", db_url=db_url, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        backlog = table(app, "backlog")
        await until(pilot, lambda: app.refresher.idle and backlog.shown_keys()[:1] == ["tool:c-00000"])
        loads = app.stats["loads"]
        await pilot.press("ctrl+r")  # a refresh after the first (read before the layout): a window
        await until(pilot, lambda: app.stats["loads"] > loads and app.refresher.idle)
        assert app.latest is not None and app.latest["tools"]["counts"]["running"] == calls
        assert len(app.latest["tools"]["running"]) <= backlog.body_height < calls  # a window of them
        assert backlog.total_rows == calls + 1
        await pilot.press("1", "end")
        await until(pilot, lambda: backlog.selected_key() == "in:s-00000", "the input after the calls")
        assert app.latest is not None and len(app.latest["tools"]["running"]) == calls
