"""The console's tool-call flow, driven with keys: the waiting calls in Backlog (unknown outcomes
first, then approvals, oldest first), approve, deny, and resolve done / retry / fail, each through
a confirmation naming the session, tool, arguments, effect class, owner, epoch and age; then the
database says what the decision did. The calls are written by the executor's own functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.core.datadir import DataDir
from backend.execution.tool_calls import PlannedCall
from backend.runtime.context import Context
from backend.store.states import ToolCallState
from tests.tui import scenes
from tests.tui.test_console import SIZE, confirm_modal, console, loaded, plain, select, table, until, write
from tests.tui.tool_turns import parked_turn, send_call
from tui.screens.detail import DetailScreen
from tui.screens.resolve import ResolveScreen
from tui.widgets.trends import trend_values


def _planned(idx: int, state: ToolCallState) -> PlannedCall:
    # a running call is inserted pending, then started
    return send_call(idx, ToolCallState.PENDING if state == ToolCallState.RUNNING else state)


async def _parked(ctx: Context, sid: str, states: list[ToolCallState]) -> list[str]:
    """A turn of `sid` that asked for calls in `states` (running ones end unknown), parked."""
    calls = [_planned(i, s) for i, s in enumerate(states)]
    lost = [i for i, s in enumerate(states) if s == ToolCallState.RUNNING]
    return await parked_turn(ctx, sid, calls, lost=lost, owner="executor-test-1")


@pytest.fixture
async def waiting(tmp_path: Path) -> tuple[DataDir, list[str], list[str]]:
    """s-ask: two sends awaiting approval; s-lost: three sends in flight when the executor died."""
    data = DataDir(tmp_path / "data")
    ctx = Context(data, start_chroma=False)
    try:
        asks = await _parked(ctx, "s-ask", [ToolCallState.AWAITING_APPROVAL] * 2)
        lost = await _parked(ctx, "s-lost", [ToolCallState.RUNNING] * 3)
    finally:
        await ctx.close()
    return data, asks, lost


async def _rows(data: DataDir) -> dict[str, tuple[Any, ...]]:
    ctx = Context(data, start_chroma=False, read_only=True)
    try:
        db = await ctx.db()
        rows = await db.fetchall("SELECT id, state, approved, retries, result, decided_by FROM tool_call")
        return {r[0]: tuple(r[1:]) for r in rows}
    finally:
        await ctx.close()


async def _decide(pilot: Any, app: Any, call_id: str, key: str) -> Any:
    """Select the call's Backlog row and press `key`: the modal that opens."""
    backlog = table(app, "backlog")
    await pilot.press("1", "home")
    await select(pilot, backlog, f"tool:{call_id}")
    await pilot.press(key)
    if key == "o":
        await until(pilot, lambda: isinstance(app.screen, ResolveScreen), "the resolve modal")
        assert app.focused is not None and app.focused.id == "cancel"
        return app.screen
    return await confirm_modal(pilot)


async def _logged(pilot: Any, app: Any, n: int) -> str:
    log = table(app, "actions")
    await until(
        pilot, lambda: len(log.all_records()) >= n and log.all_records()[0]["outcome"] != "", "the log"
    )
    record = log.all_records()[0]
    assert record["outcome"] == "ok", record
    return str(record["message"])


async def _detail_shows(pilot: Any, app: Any, call_id: str, parts: list[str]) -> None:
    await pilot.press("1", "home")
    await select(pilot, table(app, "backlog"), f"tool:{call_id}")
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
    calls = app.screen.query_one("#tool-calls")
    await until(pilot, lambda: "loading" not in plain(calls), "the session's tool calls")
    for part in parts:
        assert part in plain(calls), (part, plain(calls))
    await pilot.press("escape")


async def test_approve_and_deny_from_backlog_name_the_call_and_move_it(
    waiting: tuple[DataDir, list[str], list[str]],
) -> None:
    data, (first, second), lost = waiting
    async with console(data).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        backlog = table(app, "backlog")
        # unknown outcomes first, then approvals (each oldest first: these were made together)
        keys = [k for k in backlog.shown_keys() if k.startswith("tool:")]
        assert sorted(keys[:3]) == sorted(f"tool:{c}" for c in lost)
        assert sorted(keys[3:]) == sorted(f"tool:{c}" for c in (first, second))
        assert backlog.cell_text(f"tool:{first}", "what") == "approve"
        modal = await _decide(pilot, app, first, "a")
        body = "\n".join(modal.plan.lines)
        for part in (
            "session s-ask",
            "tool demo.outbox_send",
            "effect class effect",
            '"to": "ops-0@example.com"',
            "owner executor-test-1",
            "epoch 1",
            "made ",
            # who runs it: the turn is parked, the other send still waits, no executor is alive
            "Runs once the turn's 1 other waiting call is decided, in the next executor to take the turn "
            "(none alive now)",
        ):
            assert part in body, (part, body)
        await pilot.press("tab", "enter")
        assert "approve" in await _logged(pilot, app, 1)
        modal = await _decide(pilot, app, second, "n")
        assert modal.plan.action == "deny" and modal.plan.targets == [second]
        await pilot.press("tab", "enter")
        assert "the turn resumes" in await _logged(pilot, app, 2)
    rows = await _rows(data)
    assert rows[first][:2] == ("pending", 1) and rows[second][0] == "denied"
    assert rows[first][4] == rows[second][4] is not None  # decided by the console's operator


async def test_resolve_done_retry_and_fail_from_backlog(
    waiting: tuple[DataDir, list[str], list[str]],
) -> None:
    data, _asks, (done, retry, fail) = waiting
    async with console(data).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert table(app, "backlog").cell_text(f"tool:{done}", "what") == "unknown"
        for n, (call_id, button, text) in enumerate(
            ((done, "done", "sent, receipt 8812"), (retry, "retry", ""), (fail, "fail", "bounced")), start=1
        ):
            if call_id == fail:  # the detail of a call lists its session's calls: states, keys, results
                await _detail_shows(pilot, app, fail, [done, "completed", "sent, receipt 8812", retry])
            modal = await _decide(pilot, app, call_id, "o")
            assert "session s-lost" in "\n".join(modal.plan.lines) and modal.plan.warning
            if text:
                await pilot.click("#text")
                await pilot.press(*text)
            await pilot.click(f"#{button}")
            message = await _logged(pilot, app, n)
            assert f"{button} {call_id}" in message, message
    rows = await _rows(data)
    assert rows[done][0] == "completed" and rows[done][3] == "sent, receipt 8812"
    assert rows[retry][0] == "pending" and rows[retry][2] == 1
    assert rows[fail][0] == "error" and "bounced" in rows[fail][3]


async def test_a_parked_turns_lease_shows_held_and_is_not_released(
    waiting: tuple[DataDir, list[str], list[str]],
) -> None:
    """Parked for a person, a turn is held by nobody: no countdown, no expired lease, and `l`
    explains where the decision is made instead of confirming a release that would run nothing."""
    data, _asks, _lost = waiting
    async with console(data).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        leases = table(app, "leases")
        keys = leases.shown_keys()
        assert len(keys) == 2 and all(leases.cell_text(k, "left") == "held" for k in keys)
        assert leases.expired_count(2**62) == 0  # however long it waits
        assert app.latest is not None and trend_values(app.latest, 2**62)["expired_leases"] == 0
        await pilot.press("2", "home", "l")
        await pilot.pause()
        assert len(app.screen_stack) == 1  # no confirmation
        notes = [str(n.message) for n in app._notifications]
        assert any("parked for a person" in n and "Backlog" in n for n in notes), notes


async def test_a_tool_source_down_in_a_live_executor_shows_in_the_header_inert(healthy_dir: DataDir) -> None:
    """Beside the model's health: the sources live executors recorded down, their names and errors as
    text (markup and control characters shown as they are), up as soon as an executor records it."""
    async with console(healthy_dir, poll_s=60).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert "tools DOWN" not in app.header.header_text().plain  # none recorded: nothing said
        servers = [
            {"server": "demo", "up": True, "error": None, "since": scenes.NOW - 60_000},
            {
                "server": "tick[/]ets\x1b[2J",
                "up": False,
                "error": "[b]exited with code 3: boom",
                "since": scenes.NOW - 5_000,
            },
        ]
        info = json.dumps({"tool_servers": servers})
        write(healthy_dir, "UPDATE worker SET info = ? WHERE owner_id = ?", info, scenes.EXEC_A)
        await until(
            pilot, lambda: "tools DOWN" in app.header.header_text().plain, "the source down in the header"
        )
        shown = app.header.header_text().plain  # after the model's health, before the schema
        assert "● tools DOWN: tick[/]ets\\x1b[2J ([b]exited with code 3)  schema v" in shown
        servers[1]["up"] = True
        write(
            healthy_dir,
            "UPDATE worker SET info = ? WHERE owner_id = ?",
            json.dumps({"tool_servers": servers}),
            scenes.EXEC_A,
        )
        await until(pilot, lambda: "tools DOWN" not in app.header.header_text().plain, "the source up again")
