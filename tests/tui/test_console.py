"""Pilot tests: the console over a real data dir, every binding, what the widgets show."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Input, Label

from backend.core import clock, private
from backend.core.datadir import DataDir
from backend.ops.console import ConsoleSession, ListLimits
from backend.store.schema import SCHEMA_VERSION
from tests.helpers import await_until
from tests.tui import scenes
from tui import app as app_module
from tui.app import NO_AUTOMATIC_FULL_GC, PANELS, ConsoleApp
from tui.gc_policy import YOUNG_THRESHOLD
from tui.screens.confirm import ConfirmScreen
from tui.screens.detail import DetailScreen
from tui.screens.help import HelpScreen, help_sections
from tui.widgets.banner import Banner
from tui.widgets.header import ConsoleHeader
from tui.widgets.snapshot_table import SnapshotTable

SIZE = (120, 40)


def console(data: DataDir, **kwargs: Any) -> ConsoleApp:
    kwargs.setdefault("data_label", "data")
    return ConsoleApp(data, **kwargs)


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], message: str = "condition", timeout: float = 15.0
) -> Any:
    async def check() -> Any:
        await pilot.pause()
        return predicate()

    return await await_until(check, timeout=timeout, message=message)


async def select(pilot: Pilot[Any], panel: SnapshotTable, key: str) -> None:
    """Move the focused panel's cursor down to the row `key`, failing (not spinning) if it never comes."""
    for _ in range(len(panel.shown_keys()) + 1):
        if panel.selected_key() == key:
            return
        await pilot.press("down")
    raise AssertionError(
        f"row {key!r} not reachable in {panel.id}: shown {panel.shown_keys()}, "
        f"cursor on {panel.selected_key()!r}"
    )


async def loaded(pilot: Pilot[Any]) -> ConsoleApp:
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(pilot, lambda: app.applied is not None, "the first snapshot")
    return app


def plain(widget: Any) -> str:
    """The text a Static shows (its content rendered by Rich, wide enough not to wrap)."""
    out = Console(width=240, file=io.StringIO(), record=True)
    out.print(widget.content)
    return out.export_text()


def table(app: ConsoleApp, name: str) -> SnapshotTable:
    return app.panel(name)


def write(data: DataDir, sql: str, *params: Any) -> None:
    """A commit by another connection, exactly as another process would make it."""
    conn = sqlite3.connect(data.state_db, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        for statement in sql.split(";"):
            if statement.strip():
                conn.execute(statement, params if "?" in statement else ())
        conn.execute("COMMIT")
    finally:
        conn.close()


# -- what the panels show --------------------------------------------------------------
async def test_panels_show_every_part_of_the_snapshot(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases = table(app, "leases")
        assert leases.shown_keys() == ["execution:exe_0002", "execution:exe_0001"]  # soonest first
        assert leases.cell_text("execution:exe_0002", "left") == "-12s"
        assert leases.cell_text("execution:exe_0002", "owner") == "✗ exec:4102"
        assert leases.cell_text("execution:exe_0001", "owner") == "● exec:4101"
        assert leases.has_class("-alert")
        assert "1 expired" in str(leases.border_title)
        receipts = table(app, "receipts")
        assert receipts.cell_text("summary_s-golf", "keys") == "title, dreamInputRevision"
        assert receipts.cell_text("summary_s-hotel", "verdict") == "missing"
        assert receipts.cell_text("summary_s-juliet", "keys").startswith("quarantined: envelope")
        drift = {r["session_id"]: r["class"] for r in table(app, "drift").all_records()}
        assert drift == {
            "s-kilo": "dream_pending",
            "s-lima": "stale_completion",
            "s-mike": "deferred",
            "s-november": "undigestible",
            "s-oscar": "legacy_only",
            "s-papa": "summary_stale",
        }
        backlog = table(app, "backlog")
        # tool calls waiting for a person (unknown outcomes, then approvals), held, then parked first
        assert backlog.shown_keys()[:4] == ["tool:call_b1", "tool:call_a2", "held:s-tango", "rec:exe_0099"]
        assert backlog.cell_text("tool:call_b1", "what") == "unknown"
        assert backlog.cell_text("tool:call_a2", "detail").startswith("demo.outbox_send subject=rollback")
        assert backlog.cell_text("held:s-tango", "what") == "held"
        assert backlog.cell_text("held:s-tango", "detail").startswith("2 asleep · auth: HTTP 401")
        assert backlog.cell_text("rec:exe_0099", "what") == "parked"
        sessions = table(app, "sessions")
        assert sessions.shown_keys() == ["s:s-echo", "s:s-alpha", "s:s-bravo", "s:s-tango"]  # costliest first
        assert sessions.cell_text("s:s-echo", "cost") == "$0.0644"
        assert sessions.cell_text("s:s-echo", "tokens") == "351.9k"
        assert sessions.cell_text("s:s-tango", "error") == "HELD auth"
        assert sessions.cell_text("s:s-alpha", "error") == "rate_limited"
        assert "1 held" in str(sessions.border_title) and sessions.has_class("-alert")
        header = app.header.header_text().plain
        assert "model DOWN (auth) 11% err 3 retries p95 1.8 s" in header
        assert backlog.cell_text("in:s-charlie", "detail") == "3 queued"
        workers = table(app, "workers")
        assert workers.cell_text(scenes.EXEC_B, "state") == "✗ dead"
        assert workers.cell_text(scenes.EXEC_A, "state") == "running"
        events = table(app, "events").all_records()
        assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
        header = app.query_one(ConsoleHeader).header_text().plain
        assert "data" in header and f"schema v{SCHEMA_VERSION}" in header and "Chroma DOWN" in header


async def test_a_commit_by_another_connection_shows_without_a_key_press(healthy_dir: DataDir) -> None:
    async with console(healthy_dir, poll_s=60).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert "in:s-zulu" not in table(app, "backlog").shown_keys()
        write(
            healthy_dir,
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s-zulu', 1, 1);"
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES ('in-z', 's-zulu', '{}', 'queue', 1, 1, ?)",
            scenes.NOW - 2_000,
        )
        # no key pressed and the fallback poll is 60 s away: only the file watch can do this
        await until(pilot, lambda: "in:s-zulu" in table(app, "backlog").shown_keys(), "the new input")
        assert table(app, "backlog").cell_text("in:s-zulu", "age") == "2s"


async def test_the_fallback_poll_refreshes_when_the_file_watch_is_off(healthy_dir: DataDir) -> None:
    async with console(healthy_dir, watch=False, poll_s=0.2).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        write(healthy_dir, "UPDATE session_execution SET epoch = 9 WHERE id = 'exe_0001'")
        await until(pilot, lambda: table(app, "leases").cell_text("execution:exe_0001", "epoch") == "9")


async def test_full_collections_run_in_a_callback_of_their_own_and_the_policy_is_given_back(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "FULL_GC_EVERY_S", 0.1)
    before = gc.get_threshold()
    full: list[bool] = []  # each full collection: was it the console's own timer callback?

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            frame, timed = sys._getframe(1), False
            while frame is not None and not timed:
                timed, frame = frame.f_code.co_name == "_collect_fully", frame.f_back
            full.append(timed)

    gc.callbacks.append(seen)
    try:
        async with console(healthy_dir, poll_s=0.05).run_test(size=SIZE) as pilot:
            app = await loaded(pilot)
            assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], NO_AUTOMATIC_FULL_GC)
            full.clear()
            # refreshes and redraws allocate as usual; every full collection is the timer's
            await until(pilot, lambda: len(full) >= 3, "three full collections")
            assert all(full), full
            assert app.applied is not None
    finally:
        gc.callbacks.remove(seen)
    assert gc.get_threshold() == before  # the process outlives the app: its policy is back


async def test_refreshes_are_gated_on_data_version(healthy_dir: DataDir) -> None:
    async with console(healthy_dir, watch=False, poll_s=0.1, health_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        loads = app.stats["loads"]
        await pilot.pause(0.8)  # ~8 polls, nothing committed
        assert app.stats["loads"] == loads
        write(healthy_dir, "UPDATE worker SET heartbeat_at = heartbeat_at + 1")
        await until(pilot, lambda: app.stats["loads"] == loads + 1, "one reload after one commit")


async def test_a_refresh_that_found_the_gate_shut_tells_the_budget_it_read_nothing(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polls that find nothing committed end as reads of nothing (`RefreshScheduler.finished`: they
    then hold no commit's refresh back); a commit's refresh ends as a read."""
    async with console(healthy_dir, watch=False, poll_s=0.1, health_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        reads: list[bool] = []
        finished = app.refresher.finished

        def noted(read: bool = True) -> None:
            reads.append(read)
            finished(read)

        monkeypatch.setattr(app.refresher, "finished", noted)
        await until(pilot, lambda: len(reads) >= 3, "three polls")
        assert not any(reads)
        write(healthy_dir, "UPDATE worker SET heartbeat_at = heartbeat_at + 1")
        await until(pilot, lambda: True in reads, "the commit's refresh")


async def test_a_commit_made_visible_just_after_the_gate_was_read_shut_is_still_read(
    healthy_dir: DataDir,
) -> None:
    """A commit's WAL writes (which the watch hears) come before its WAL index update (which makes it
    visible, and which no watch hears): a gate read between the two is read once more shortly
    after, or the commit would wait for the next one (SQLite only: PostgreSQL's feed hears a
    commit once it is visible)."""
    session = ConsoleSession(healthy_dir)
    try:
        seen = await session.data_version()

        async def commit() -> None:  # on this loop: it runs at the gate's first wait, not before
            write(healthy_dir, "UPDATE session_execution SET epoch = 7 WHERE id = 'exe_0001'")

        visible_now = asyncio.create_task(commit())
        version, snapshot = await session.status_if_changed(seen, force=False, limits=ListLimits())
        await visible_now
        assert version != seen and snapshot is not None
        assert any(lease["epoch"] == 7 for lease in snapshot["leases"])
    finally:
        await session.close()


async def test_a_refresh_starts_no_worker_of_its_own(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refreshes are cycles of one long-lived reading task: none starts a worker (a worker a refresh,
    its state messages and handlers, was ~1 ms of a busy fleet's 10 refreshes a second)."""
    async with console(healthy_dir, watch=False, poll_s=3600, health_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh")
        started: list[Any] = []
        run_worker = app.run_worker

        def counted(*args: Any, **kwargs: Any) -> Any:
            started.append(kwargs.get("group"))
            return run_worker(*args, **kwargs)

        monkeypatch.setattr(app, "run_worker", counted)
        for i in range(3):
            loads = app.stats["loads"]
            write(healthy_dir, "UPDATE worker SET heartbeat_at = heartbeat_at + ?", i + 1)
            app.request_refresh()
            await until(pilot, lambda n=loads: app.stats["loads"] > n and app.refresher.idle, "a refresh")
        assert started == []


async def test_a_console_left_open_keeps_a_bounded_record_of_its_refreshes(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tui.app

    monkeypatch.setattr(tui.app, "STATS_KEPT", 2)
    async with console(healthy_dir, watch=False, poll_s=0.05, health_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        for i in range(3):
            loads = app.stats["loads"]
            write(healthy_dir, "UPDATE worker SET heartbeat_at = heartbeat_at + ?", i + 1)
            await until(pilot, lambda n=loads: app.stats["loads"] > n, "a reload after a commit")
        await until(pilot, lambda: app.stats["applies"] >= 4, "every reload applied")
        assert app.stats["loads"] >= 4
        assert len(app.stats["load_ms"]) == len(app.stats["apply_ms"]) == 2  # the latest two, no more


async def test_refreshes_never_overlap(healthy_dir: DataDir) -> None:
    from backend import ops

    running = {"now": 0, "max": 0, "calls": 0}

    async def slow_status(ctx: Any, **options: Any) -> dict[str, Any]:
        import asyncio

        running["now"] += 1
        running["calls"] += 1
        running["max"] = max(running["max"], running["now"])
        try:
            await asyncio.sleep(0.15)
            return await ops.status(ctx, **options)
        finally:
            running["now"] -= 1

    app = console(healthy_dir, status_loader=slow_status, poll_s=0.05, min_interval_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        for i in range(15):
            write(healthy_dir, "UPDATE worker SET heartbeat_at = ? WHERE owner_id = ?", i, scenes.EXEC_A)
            await pilot.pause(0.02)
        await until(pilot, lambda: running["calls"] >= 3)
    assert running["max"] == 1


async def test_countdowns_tick_and_expire_without_the_database(
    healthy_dir: DataDir, clock_at_scene: clock.FrozenClock
) -> None:
    async with console(healthy_dir, watch=False, poll_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases = table(app, "leases")
        assert leases.cell_text("execution:exe_0002", "left") == "18s"
        assert not leases.has_class("-alert")
        loads = app.stats["loads"]
        clock_at_scene.advance(19_000)
        await until(pilot, lambda: leases.cell_text("execution:exe_0002", "left") == "-1s", "the tick")
        assert leases.has_class("-alert")
        assert leases._rows["execution:exe_0002"].cells["left"].style.bold  # the error look
        assert app.stats["loads"] == loads  # the tick never read the database


async def test_dead_worker_marker_appears_as_the_heartbeat_ages(
    healthy_dir: DataDir, clock_at_scene: clock.FrozenClock
) -> None:
    async with console(healthy_dir, watch=False, poll_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases, workers = table(app, "leases"), table(app, "workers")
        assert leases.cell_text("execution:exe_0001", "owner") == "● exec:4101"
        clock_at_scene.advance(11_000)  # past WORKER_DEAD_AFTER_MS with no heartbeat
        await until(pilot, lambda: workers.cell_text(scenes.EXEC_A, "state") == "✗ dead")
        # panels tick 200 ms apart: the lease panel marks the owner within the same second
        await until(
            pilot, lambda: leases.cell_text("execution:exe_0001", "owner") == "✗ exec:4101", timeout=2
        )
        assert "dead" in str(workers.border_title)


async def test_a_death_its_supervisor_recorded_marks_the_owner_dead_at_once_and_the_release_says_so(
    healthy_dir: DataDir, clock_at_scene: clock.FrozenClock
) -> None:
    """`exited_at` (the supervisor saw the pid exit; --no-reap left the lease standing) makes the
    owner ✗ with the next refresh, its heartbeat still fresh, and the release confirmation says DEAD."""
    async with console(healthy_dir, poll_s=0.1).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases, workers = table(app, "leases"), table(app, "workers")
        assert leases.cell_text("execution:exe_0001", "owner") == "● exec:4101"
        write(
            healthy_dir,
            "UPDATE worker SET exited_at = ? WHERE owner_id = ?",
            clock_at_scene.now,
            scenes.EXEC_A,
        )
        await until(pilot, lambda: leases.cell_text("execution:exe_0001", "owner") == "✗ exec:4101", "the ✗")
        assert workers.cell_text(scenes.EXEC_A, "state") == "✗ dead"
        clock_at_scene.advance(2_000)
        await pilot.press("2")
        await select(pilot, leases, "execution:exe_0001")
        await pilot.press("l")
        assert isinstance(app.screen, ConfirmScreen)
        body = "\n".join(app.screen.plan.lines)
        assert "DEAD: its supervisor saw it exit 2s ago" in body
        assert not app.screen.plan.warning  # no "the owner is alive and renewing" for a dead process
        await pilot.press("escape")


async def test_the_workers_panel_names_each_workers_host_and_counts_hosts(
    healthy_dir: DataDir, clock_at_scene: clock.FrozenClock
) -> None:
    async with console(healthy_dir, poll_s=0.1).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        workers = table(app, "workers")
        assert workers.cell_text(scenes.EXEC_A, "host") == "ops-1"
        assert "hosts" not in str(workers.border_title)  # one host: nothing to say
        write(
            healthy_dir,
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES ('executor-ops-2-77-abcdef', 'executor', 77, 'ops-2', ?, ?, 'running')",
            clock_at_scene.now - 1000,
            clock_at_scene.now - 500,
        )
        await until(
            pilot, lambda: "executor-ops-2-77-abcdef" in workers.shown_keys(), "the other host's worker"
        )
        assert workers.cell_text("executor-ops-2-77-abcdef", "host") == "ops-2"
        await until(pilot, lambda: "on 2 hosts" in str(workers.border_title), "the host count")


async def test_the_workers_panel_shows_an_api_server_as_role_server(
    healthy_dir: DataDir, clock_at_scene: clock.FrozenClock
) -> None:
    async with console(healthy_dir, poll_s=0.1).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        workers = table(app, "workers")
        write(
            healthy_dir,
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state, info) "
            "VALUES ('server-ops-1-88-abcdef', 'server', 88, 'ops-1', ?, ?, 'running', ?)",
            clock_at_scene.now - 1000,
            clock_at_scene.now - 500,
            json.dumps({"listen": "http://127.0.0.1:8765", "streams_open": 2}),
        )
        await until(pilot, lambda: "server-ops-1-88-abcdef" in workers.shown_keys(), "the API server's row")
        assert workers.cell_text("server-ops-1-88-abcdef", "role") == "server"
        assert workers.cell_text("server-ops-1-88-abcdef", "state") == "running"


async def test_cursor_and_scroll_survive_a_refresh_that_adds_rows_above(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        drift = table(app, "drift")
        drift.focus()
        await pilot.press("down", "down")
        chosen = drift.selected_key()
        assert chosen is not None
        cursor_before = drift.cursor_row
        scroll_before = drift.scroll_y
        write(
            incident_dir,
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s-aaa', 1, 1);"
            "INSERT INTO dream_state (session_id, input_revision, digest_state, time_published, "
            "time_updated) VALUES ('s-aaa', 'sha256:00', 'pending', 1, 1)",
        )
        await until(pilot, lambda: "dream_pending:s-aaa" in drift.shown_keys(), "the new drift row")
        assert drift.displayed_keys() == drift.shown_keys()  # drawn in urgency order
        assert drift.displayed_keys()[0] == "dream_pending:s-aaa"
        assert drift.selected_key() == chosen
        assert drift.displayed_keys().index(chosen) == drift.cursor_row
        assert drift.cursor_row in (cursor_before, cursor_before + 1)
        assert drift.scroll_y == scroll_before


async def test_the_event_tail_keeps_new_events_on_top_under_a_top_cursor(healthy_dir: DataDir) -> None:
    async with console(healthy_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        events = table(app, "events")
        await pilot.press("6")
        first = events.selected_key()
        for i in range(12):
            write(
                healthy_dir,
                "INSERT INTO event (time, kind, actor) VALUES (?, 'input.admitted', 'cli')",
                scenes.NOW + i,
            )
        with sqlite3.connect(healthy_dir.state_db) as conn:
            newest = [str(r[0]) for r in conn.execute("SELECT id FROM event ORDER BY id DESC LIMIT 12")]
        # the tail shows the newest events, newest first, as many as its rows on screen
        await until(pilot, lambda: events.shown_keys()[:1] == newest[:1], "the newest event on top")
        shown = events.shown_keys()
        assert shown == newest[: len(shown)] and len(shown) == min(12, events.body_height)
        assert events.displayed_keys() == shown
        assert events.cursor_row == 0 and events.scroll_y == 0
        assert events.selected_key() != first and int(events.selected_key() or 0) > int(first or 0)


def rendered(panel: SnapshotTable) -> list[str]:
    """The lines the panel actually draws (header first), from its line renderer."""
    return [panel.render_line(y).text for y in range(panel.size.height)]


async def test_what_is_drawn_follows_every_change_of_a_row(healthy_dir: DataDir) -> None:
    async with console(healthy_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        workers = table(app, "workers")

        def drawn_beat() -> str:
            line = next(line for line in rendered(workers) if "exec:4101" in line)
            return line.split()[2]

        for age_s in (3, 5, 3, 7):  # a repeat value must not be served from a stale cache
            write(
                healthy_dir,
                "UPDATE worker SET heartbeat_at = ? WHERE owner_id = ?",
                scenes.NOW - age_s * 1000,
                scenes.EXEC_A,
            )
            await until(pilot, lambda a=age_s: workers.cell_text(scenes.EXEC_A, "heartbeat") == f"{a}s")
            await pilot.pause()
            assert drawn_beat() == f"{age_s}s"
        assert rendered(workers)[0].split()[:3] == ["worker", "state", "beat"]
        # one strip kept a row, the one drawn: a new version replaces the old, none piles up
        assert set(workers._strips.keys()) <= set(workers.order)
        # scrolled sideways, every line (header too) is the same line moved left
        before = rendered(workers)
        assert workers.max_scroll_x > 2
        workers.scroll_to(x=2, animate=False, immediate=True)
        await pilot.pause()
        assert [line[:-2] for line in rendered(workers)] == [line[2:] for line in before]


# -- bindings ------------------------------------------------------------------------------
async def test_pause_holds_updates_and_counts_what_waits(healthy_dir: DataDir) -> None:
    async with console(healthy_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("p")
        assert app.paused
        assert "Resume" in str(app.key_bar._shown)
        header = app.query_one(ConsoleHeader)
        assert header.has_class("-paused")
        write(
            healthy_dir,
            "INSERT INTO event (time, kind, actor) VALUES (1, 'input.admitted', 'cli');"
            "INSERT INTO event (time, kind, actor) VALUES (2, 'input.admitted', 'cli');"
            "UPDATE session_execution SET epoch = 7 WHERE id = 'exe_0001'",
        )
        await until(pilot, lambda: app.latest is not app.applied, "the held snapshot")
        assert table(app, "leases").cell_text("execution:exe_0001", "epoch") == "3"  # frozen
        assert "PAUSED 2 new events" in header.header_text().plain
        await pilot.press("down")  # navigation still works while paused
        await pilot.press("p")
        assert not app.paused
        assert table(app, "leases").cell_text("execution:exe_0001", "epoch") == "7"
        assert "PAUSED" not in header.header_text().plain


async def test_filter_narrows_the_focused_panel_and_escape_clears(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("3")  # receipts
        await pilot.press("slash")
        await pilot.press(*"golf")
        receipts = table(app, "receipts")
        assert receipts.shown_keys() == ["summary_s-golf"]
        assert "of 4" in str(receipts.border_subtitle)
        await pilot.press("enter")  # keep it
        assert app.focused is receipts and receipts.filter_text == "golf"
        await pilot.press("slash", "escape")
        assert len(receipts.shown_keys()) == 4 and app.focused is receipts


async def test_sort_cycles_columns_and_reverses(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("4")  # drift
        drift = table(app, "drift")
        await pilot.press("s")  # by session
        sessions = [k.split(":", 1)[1] for k in drift.shown_keys()]
        assert sessions == sorted(sessions)
        await pilot.press("S")
        assert [k.split(":", 1)[1] for k in drift.shown_keys()] == sorted(sessions, reverse=True)
        assert "sort session ▼" in str(drift.border_subtitle)


async def test_clicking_a_header_sorts_by_it(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        receipts = table(app, "receipts")
        await pilot.click("#receipts", offset=(14, 1))  # the "verdict" header
        assert receipts.sort_column == "verdict"
        verdicts = [r["verdict"] for r in receipts.shown_records()]
        assert verdicts == sorted(verdicts)


async def test_enter_opens_the_detail_with_journal_history(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("2", "enter")  # leases; the expired one is first
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        assert screen.record["id"] == "exe_0002"
        history = screen.query_one("#history")
        await until(pilot, lambda: "execution.step" in plain(history), "the journal rows")
        assert "execution.claimed" in plain(history)  # by session s-bravo
        await pilot.press("escape")
        assert not isinstance(app.screen, DetailScreen)


async def test_receipt_detail_shows_the_receipt_vs_chroma_diff(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("3", "enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        diff = plain(app.screen.query_one("#receipt-diff"))
        assert "Deploy rollback plan" in diff and "Deploy plan" in diff and "dreamInputRevision" in diff
        live = app.screen.query_one("#live-diff")
        # no Chroma in this data dir: the live diff says so instead of failing
        await until(pilot, lambda: "loading" not in plain(live), "the live diff attempt")
        assert "unavailable" in plain(live)


async def test_mouse_click_twice_opens_the_detail(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.click("#workers", offset=(3, 4))  # the third row: selects it
        assert not isinstance(app.screen, DetailScreen)
        assert table(app, "workers").cursor_row == 2
        await pilot.click("#workers", offset=(3, 4))  # clicking the selected row opens it
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "detail by mouse")


async def test_help_lists_every_key(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.markdown
        for binding in ConsoleApp.BINDINGS:
            assert binding.description in text, binding
        assert "| :- | :- |\n| `?` | Help |" in text  # rows directly under the header: a table
        for section, rows in help_sections(ConsoleApp.BINDINGS):
            assert f"## {section}" in text
            for key, _ in rows:
                assert f"`{key}`" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_the_key_bar_is_clickable(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        offset = app.key_bar.content.plain.index("? Help")  # type: ignore[union-attr]
        await pilot.click("#keys", offset=(1 + offset + 2, 0))  # 1: the bar's left padding
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help opened by a click")


async def test_number_keys_focus_panels_and_z_zooms(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        for i, (name, _) in enumerate(PANELS, start=1):
            await pilot.press(str(i))
            assert app.focused is table(app, name), name
        await pilot.press("2", "z")
        assert app.screen.maximized is table(app, "leases")
        await pilot.press("z")
        assert app.screen.maximized is None


async def test_export_writes_csv_to_logs_and_copy_fills_the_clipboard(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("3", "e")
        files = list(incident_dir.logs.glob("console-receipts-*.csv"))
        assert len(files) == 1
        lines = files[0].read_text().splitlines()
        assert lines[0].startswith("summary_id,session_id,verdict")
        assert len(lines) == 5 and any("summary_s-golf" in line for line in lines)
        assert "Deploy rollback plan" in files[0].read_text()  # full values, not the cut cells
        await pilot.press("c")
        assert app.clipboard == files[0].read_text()


async def test_changing_the_theme_recolours_the_cells(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases = table(app, "leases")
        before = leases._rows["execution:exe_0002"].cells["left"].style.color
        app.theme = "nord"
        await until(
            pilot,
            lambda: leases._rows["execution:exe_0002"].cells["left"].style.color != before,
            "the expired countdown in the new theme's error colour",
        )
        from rich.color import Color

        assert leases._rows["execution:exe_0002"].cells["left"].style.color == Color.parse(
            app.get_css_variables()["error"]
        )


async def test_ctrl_r_forces_a_reload(healthy_dir: DataDir) -> None:
    async with console(healthy_dir, watch=False, poll_s=3600).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        loads = app.stats["loads"]
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.stats["loads"] == loads + 1, "a forced reload")


# -- failures become banners -------------------------------------------------------------
async def test_database_unreachable_is_a_banner_not_a_crash(healthy_dir: DataDir) -> None:
    async with console(healthy_dir, watch=False, poll_s=0.1).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        banner = app.query_one(Banner)
        assert "database" not in banner.problems
        moved = healthy_dir.root.parent / "moved"
        healthy_dir.root.rename(moved)
        await until(pilot, lambda: "database" in banner.problems, "the database banner")
        assert "state.db missing" in banner.problems["database"]
        assert banner.has_class("-shown")
        moved.rename(healthy_dir.root)
        await until(pilot, lambda: "database" not in banner.problems, "recovery")
        assert app.is_running


async def test_chroma_down_is_a_warning_banner(healthy_dir: DataDir) -> None:
    async with console(healthy_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        banner = app.query_one(Banner)
        assert "chroma" in banner.problems and banner.has_class("-warning")


async def test_a_healthy_chroma_shows_in_the_header_without_a_banner(
    healthy_dir: DataDir, chroma_url: str
) -> None:
    async with console(healthy_dir, chroma_url=chroma_url).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert not app.query_one(Banner).problems
        assert "Chroma up" in app.query_one(ConsoleHeader).header_text().plain


# -- actions: confirmation, cancel, read-only -------------------------------------------------
def requires_op(name: str) -> None:
    from backend import ops

    if not hasattr(ops, name):
        pytest.skip(f"ops.{name} has not landed on main yet")


def lease_row(data: DataDir, execution_id: str) -> tuple[Any, ...] | None:
    conn = sqlite3.connect(data.state_db)
    try:
        return conn.execute(
            "SELECT owner_id, epoch, expires_at FROM session_execution WHERE id = ?", (execution_id,)
        ).fetchone()
    finally:
        conn.close()


async def test_release_modal_names_owner_epoch_and_time_left_with_cancel_focused(
    incident_dir: DataDir,
) -> None:
    before = lease_row(incident_dir, "exe_0002")
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("2", "l")
        assert isinstance(app.screen, ConfirmScreen)
        plan = app.screen.plan
        body = "\n".join(plan.lines)
        assert scenes.EXEC_B in body and "DEAD" in body and "epoch 1" in body
        assert "expired 12s ago" in body
        assert plan.params == {"lease_id": "exe_0002", "kind": "execution", "expected_epoch": 1}
        assert app.focused is not None and app.focused.id == "cancel"
        await pilot.press("enter")  # Enter on the focused Cancel
        assert not isinstance(app.screen, ConfirmScreen)
        log = table(app, "actions").all_records()
        assert log[0]["outcome"] == "cancelled" and log[0]["action"] == "release"
    assert lease_row(incident_dir, "exe_0002") == before


async def test_escape_cancels_the_drain_modal(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app, _, modal = await drain_modal(pilot, scenes.EXEC_A)
        assert app.screen is modal and isinstance(app.screen, ConfirmScreen)
        assert "Holds 1 lease: s-alpha (execution)" in "\n".join(app.screen.plan.lines)
        await pilot.press("escape")
        assert table(app, "actions").all_records()[0]["outcome"] == "cancelled"


def journal(data: DataDir, kind: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(data.state_db)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute("SELECT * FROM event WHERE kind = ? ORDER BY id", (kind,)).fetchall()
        return [{**dict(r), "data": json.loads(r["data"])} for r in rows]
    finally:
        conn.close()


def scalar(data: DataDir, sql: str, *params: Any) -> Any:
    conn = sqlite3.connect(data.state_db)
    try:
        return conn.execute(sql, params).fetchone()[0]
    finally:
        conn.close()


def _focused(pilot: Pilot[Any], widget_id: str) -> bool:
    return pilot.app.focused is not None and pilot.app.focused.id == widget_id


async def confirm_modal(pilot: Pilot[Any]) -> ConfirmScreen:
    """The confirmation, mounted, with Cancel focused (a key pressed before its mount lands first)."""
    await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), "the confirmation")
    screen = pilot.app.screen
    assert isinstance(screen, ConfirmScreen)
    await until(pilot, lambda: _focused(pilot, "cancel"), "Cancel focused")
    return screen


async def press_confirm(pilot: Pilot[Any]) -> None:
    """Tab from Cancel to the action button and press it, once it has the focus."""
    await pilot.press("tab")
    await until(pilot, lambda: _focused(pilot, "confirm"), "the action button focused")
    await pilot.press("enter")


async def drain_modal(pilot: Pilot[Any], owner_id: str) -> tuple[ConsoleApp, SnapshotTable, ConfirmScreen]:
    """Focus the workers strip, select `owner_id`, press d: the drain confirmation."""
    app = await loaded(pilot)
    workers = table(app, "workers")
    await pilot.press("5")
    await select(pilot, workers, owner_id)
    await pilot.press("d")
    return app, workers, await confirm_modal(pilot)


async def test_releasing_a_dream_lease_expires_it_and_bumps_the_epoch(incident_dir: DataDir) -> None:
    write(
        incident_dir,
        "UPDATE dream_state SET digest_state = 'in_progress', owner_id = ?, epoch = 2, "
        "lease_expires_at = ? WHERE session_id = 's-kilo'",
        scenes.DREAM,
        scenes.NOW - 60_000,
    )
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert table(app, "leases").shown_keys()[0] == "dream:s-kilo"
        await pilot.press("2", "l")
        modal = await confirm_modal(pilot)
        assert modal.plan.params == {"lease_id": "s-kilo", "kind": "dream", "expected_epoch": 2}
        await press_confirm(pilot)  # to the Release button, press it
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "ok", "the release result")
        assert "released dream lease s-kilo" in log.all_records()[0]["message"]
        assert "epoch 2 → 3" in log.all_records()[0]["message"]
        # the panel follows the database: expired now, at the new epoch, until Dream takes over
        leases = table(app, "leases")
        await until(pilot, lambda: leases.cell_text("dream:s-kilo", "epoch") == "3", "the new epoch")
        assert leases.cell_text("dream:s-kilo", "left") == "-0s"
    assert scalar(incident_dir, "SELECT epoch FROM dream_state WHERE session_id = 's-kilo'") == 3
    assert (
        scalar(incident_dir, "SELECT lease_expires_at FROM dream_state WHERE session_id = 's-kilo'")
        == scenes.NOW
    )
    (event,) = journal(incident_dir, "operator.release")
    assert event["target"] == "s-kilo" and event["data"]["old_epoch"] == 2


async def test_release_is_refused_when_the_epoch_moved_since_the_modal_opened(incident_dir: DataDir) -> None:
    write(
        incident_dir,
        "UPDATE summary_job SET status = 'in_progress', owner_id = ?, epoch = 4, "
        "lease_expires_at = ? WHERE session_id = 's-golf'",
        scenes.SUMM,
        scenes.NOW + 5_000,
    )
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases = table(app, "leases")
        await pilot.press("2")
        await select(pilot, leases, "summary_job:s-golf")
        await pilot.press("l")
        modal = await confirm_modal(pilot)
        assert "epoch 4" in "\n".join(modal.plan.lines) and "alive" in "\n".join(modal.plan.lines)
        # the summarizer renews and is re-granted meanwhile: epoch 5
        write(incident_dir, "UPDATE summary_job SET epoch = 5 WHERE session_id = 's-golf'")
        await press_confirm(pilot)
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "refused", "the refusal")
        assert "not 4" in log.all_records()[0]["message"]
    assert scalar(incident_dir, "SELECT epoch FROM summary_job WHERE session_id = 's-golf'") == 5
    assert journal(incident_dir, "operator.release") == []


async def test_draining_a_live_worker_from_the_console(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app, workers, modal = await drain_modal(pilot, scenes.EXEC_A)
        assert modal.plan.targets == [scenes.EXEC_A]
        await press_confirm(pilot)
        await until(
            pilot,
            lambda: workers.cell_text(scenes.EXEC_A, "state") == "draining",
            "the worker to show as draining",
        )
        assert table(app, "actions").all_records()[0]["outcome"] == "ok"
    assert scalar(incident_dir, "SELECT state FROM worker WHERE owner_id = ?", scenes.EXEC_A) == "draining"
    (event,) = journal(incident_dir, "operator.drain")
    assert event["target"] == scenes.EXEC_A


async def test_draining_a_dead_worker_is_refused_by_the_library(incident_dir: DataDir) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app, _, modal = await drain_modal(pilot, scenes.EXEC_B)
        assert "dead" in modal.plan.warning
        await press_confirm(pilot)
        await until(pilot, lambda: table(app, "actions").all_records()[0]["outcome"] == "refused")
        assert "presumed dead" in table(app, "actions").all_records()[0]["message"]
    assert scalar(incident_dir, "SELECT state FROM worker WHERE owner_id = ?", scenes.EXEC_B) == "running"


async def test_the_command_palette_has_an_entry_per_action(incident_dir: DataDir) -> None:
    from textual.command import CommandList

    from tui.commands import COMMANDS

    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        for action, _title, _help in COMMANDS:
            assert hasattr(app, f"action_{action}"), action
        await pilot.press("5")
        workers = table(app, "workers")
        await select(pilot, workers, scenes.EXEC_A)
        await pilot.press("ctrl+p")
        await pilot.press(*"drain selected")

        def drain_highlighted() -> bool:  # the palette gathers its hits in batches
            hits = app.screen.query(CommandList)
            index = hits.first().highlighted if hits else None
            return (
                index is not None
                and hits.first().get_option_at_index(index).hit.text == "Drain selected worker"
            )

        await until(pilot, drain_highlighted, "the drain command highlighted in the palette")
        await pilot.press("enter")
        modal = await confirm_modal(pilot)
        assert modal.plan.action == "drain" and modal.plan.targets == [scenes.EXEC_A]


async def test_read_only_greys_the_actions_out(incident_dir: DataDir) -> None:
    async with console(incident_dir, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        for action in ("replay_selected", "replay_all", "drain", "release"):
            assert app.check_action(action, ()) is None
        shown = {
            description: enabled
            for _key, description, enabled in app.key_bar.state(lambda a: app.check_action(a, ()) is True)
        }
        assert shown["Release"] is False and shown["Replay all"] is False and shown["Drain"] is False
        assert shown["Filter"] is True and shown["Help"] is True
        assert "[$text-disabled]l Release[/]" in str(app.key_bar._shown)
        await pilot.press("2", "l")
        assert not isinstance(app.screen, ConfirmScreen)
        assert "READ-ONLY" in app.query_one(ConsoleHeader).header_text().plain


async def test_read_only_library_refuses_even_if_the_ui_is_bypassed(incident_dir: DataDir) -> None:
    from tui.actions import drain_plan

    async with console(incident_dir, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        worker = next(w for w in table(app, "workers").all_records() if w["owner_id"] == scenes.EXEC_A)
        app.execute_plan(drain_plan(worker, [], clock.now_ms()))
        await until(
            pilot,
            lambda: (
                table(app, "actions").all_records()
                and table(app, "actions").all_records()[0]["outcome"] == "refused"
            ),
            "the refusal",
        )
        entry = table(app, "actions").all_records()[0]
        assert entry["action"] == "drain"
        assert "read-only" in entry["message"]
    assert scalar(incident_dir, "SELECT state FROM worker WHERE owner_id = ?", scenes.EXEC_A) == "running"
    assert journal(incident_dir, "operator.drain") == []


def test_every_panel_declares_a_name_and_columns() -> None:
    for name, cls in PANELS:
        assert cls.PANEL_NAME == name
        assert cls.COLUMNS and cls.__doc__


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_layout_fits_common_terminal_sizes(incident_dir: DataDir, size: tuple[int, int]) -> None:
    async with console(incident_dir).run_test(size=size) as pilot:
        app = await loaded(pilot)
        for name in ("backlog", "leases", "receipts", "drift", "workers", "events"):
            panel = table(app, name)
            assert panel.region.height >= 5, (name, panel.region)
            assert panel.region.width >= 24, (name, panel.region)
        assert app.screen.has_class("-short") == (size[1] < 34)


async def test_read_only_export_goes_where_the_operator_says_outside_the_data_dir(
    incident_dir: DataDir, tmp_path: Path
) -> None:
    from tui.screens.export import ExportScreen

    taken = tmp_path / "taken.csv"
    taken.write_text("keep me")
    async with console(incident_dir, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("3", "e")
        screen = await until(pilot, lambda: isinstance(app.screen, ExportScreen) and app.screen, "the prompt")
        path_input = screen.query_one("#path", Input)
        assert not private.inside(Path(path_input.value), incident_dir.root)  # the suggestion is outside
        for refused, why in (
            (incident_dir.root / "receipts.csv", "inside the data dir"),
            (incident_dir.logs / "receipts.csv", "inside the data dir"),
            (taken, "already exists"),
            (tmp_path / "missing" / "r.csv", "does not exist"),
        ):
            path_input.value = str(refused)
            await pilot.press("enter")
            problem = await until(pilot, lambda: str(screen.query_one("#problem", Label).content), why)
            assert why in problem and app.screen is screen
        path_input.value = str(tmp_path / "receipts.csv")
        await pilot.press("enter")
        await until(pilot, lambda: (tmp_path / "receipts.csv").exists(), "the export")
    text = (tmp_path / "receipts.csv").read_text()
    assert text.startswith("summary_id,session_id,verdict") and "summary_s-golf" in text
    assert taken.read_text() == "keep me"
    assert not list(incident_dir.root.rglob("*.csv"))
