"""The post-mortem timeline: the README's drill (SIGKILL an executor, release its lease) replayed with --at.

`rem up` runs for real and records its status history; an executor is
SIGKILLed mid-turn and, once it shows dead, its lease is released with
`rem release`. Then the data dir is copied (as after an incident) and the
console opens on the copy, read-only, at a moment between the kill and the
release: the panels show the dead owner's lease counting down, the header
and the timeline bar say this is the past, and the actions are disabled.
Stepping forward reaches the release, which the panels show as an action.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from backend.cli.console import recorded_time
from backend.core import clock
from backend.core.datadir import DataDir
from backend.execution.tool_calls import PlannedCall
from backend.ops import timeline, timeline_tools, tool_decisions
from backend.ops.actions import status
from backend.runtime.context import Context
from backend.store.history import HistoryStore
from backend.store.states import ToolCallState
from tests.helpers import data_fingerprint, rem_env, run_rem, spawn_rem, wait_until
from tests.tui.test_console import SIZE, console, table, until
from tests.tui.tool_turns import parked_turn
from tui.app import ConsoleApp
from tui.widgets.leases import left_ms, owner_alive

pytestmark = pytest.mark.slow


def _executor_pid(root: Path) -> int | None:
    try:
        kids = json.loads((root / "up.json").read_text())["children"]
    except (OSError, ValueError, KeyError):
        return None
    pids = [c["pid"] for c in kids if c["role"] == "executor"]
    return pids[0] if pids else None


def _history(root: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    path = root / "history.db"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def _state(root: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"{(root / 'state.db').as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the drill once against a real `rem up`; return a copy of its data dir and its moments."""
    base = tmp_path_factory.mktemp("timeline")
    root = base / "data"
    env = rem_env(REM_AGENT_DELAY_MS="3000", REM_HISTORY_INTERVAL_MS="500")  # a turn takes ~15 s
    up = spawn_rem(
        "up", "--data", str(root), "--executors", "1", "--summarizers", "0", "--dreams", "0",
        "--no-reap", env=env, log=base / "up.log",
    )  # fmt: skip
    try:
        wait_until(lambda: _executor_pid(root), timeout=60, message="the executor to start")
        assert run_rem("send", "s1", "a long question about leases", "--data", str(root)).returncode == 0
        (execution_id, owner) = wait_until(
            lambda: (_state(root, "SELECT id, owner_id FROM session_execution") or [None])[0],
            timeout=30,
            message="the executor to hold the lease",
        )
        os.kill(_executor_pid(root) or 0, signal.SIGKILL)
        killed_at = wait_until(
            lambda: _history(
                root,
                "SELECT time FROM snapshot WHERE alerts LIKE '%RemLeaseDeadOwner%' ORDER BY time LIMIT 1",
            ),
            timeout=40,
            message="a recorded snapshot with the dead owner's lease",
        )[0][0]
        released = run_rem("release", execution_id, "--data", str(root), "--json")
        assert released.returncode == 0, released.stderr
        wait_until(
            lambda: _history(root, "SELECT 1 FROM snapshot WHERE reason = 'operator.release'"),
            timeout=20,
            message="the snapshot recorded at the release",
        )
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(90)
    copy = base / "copy"
    shutil.copytree(root, copy)  # the post-mortem happens on a copy taken after the incident
    return {"copy": DataDir(copy), "dead_at": killed_at, "execution_id": execution_id, "owner": owner}


def _lease(app: ConsoleApp, execution_id: str) -> dict[str, Any] | None:
    for record in table(app, "leases").all_records():
        if record.get("id") == execution_id:
            return record
    return None


def _recorded(app: ConsoleApp) -> dict[str, Any]:
    assert app.moment is not None
    return dict(app.moment["recorded"])


async def test_the_drill_replays_with_at_on_a_read_only_copy(drill: dict[str, Any]) -> None:
    copy, execution_id = drill["copy"], drill["execution_id"]
    # `rem console --at` takes the time as an operator types it
    at_text = (
        dt.datetime.fromtimestamp(drill["dead_at"] / 1000).astimezone().isoformat(timespec="milliseconds")
    )
    at = recorded_time(copy, at_text)
    assert at == drill["dead_at"]
    before = data_fingerprint(copy.root)
    async with console(copy, read_only=True, watch=False, at=at).run_test(size=SIZE) as pilot:
        app = await until(pilot, lambda: app_if_moment(pilot.app), "the recorded moment to show")
        recorded = _recorded(app)
        assert recorded["time"] == drill["dead_at"] and "RemLeaseDeadOwner" in recorded["alerts"]
        # unmistakably the past: the header badge, the timeline bar, the actions greyed out
        assert app.header.header_text().plain.startswith(" ◀ PAST ")  # first, never clipped
        assert "NOT LIVE" in app.header.header_text().plain
        assert app.timeline_bar.has_class("-shown") and "THE PAST" in app.timeline_bar.text
        for action in ("release", "drain", "replay_selected", "replay_all"):
            assert app.check_action(action, ()) is None
        lease = _lease(app, execution_id)
        assert lease is not None, table(app, "leases").all_records()
        now = recorded["time"]
        assert not owner_alive(lease, now) and left_ms(lease, now) > 0  # dead owner, not expired yet
        owner_cell = table(app, "leases").cell_text(f"execution:{execution_id}", "owner")
        assert owner_cell.startswith("✗")
        # stepping forward: the same lease counts down between recorded moments
        left_before = left_ms(lease, now)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: _recorded(app)["time"] > now, "the next recorded snapshot")
        later = _recorded(app)
        if later["reason"] != "operator.release":
            lease_later = _lease(app, execution_id)
            assert lease_later is not None and left_ms(lease_later, later["time"]) < left_before
        # pressing an action key in the past does nothing
        await pilot.press("2", "l")
        await pilot.pause()
        assert len(app.screen_stack) == 1
        # incident starts, forward, reach the release (an operator action starts one): the panels
        # show the action. Another incident may start between the kill and the release (seen with
        # three test workers on two cores, never alone): each jump moves forward to the next one.
        passed: list[dict[str, Any]] = []
        while _recorded(app)["reason"] != "operator.release":
            assert len(passed) < 5, passed
            passed.append(_recorded(app))
            await pilot.press("right_curly_bracket")
            await until(pilot, lambda: _recorded(app)["time"] > passed[-1]["time"], "the next incident start")
            assert _recorded(app)["incident"], _recorded(app)
        actions = table(app, "actions").all_records()
        assert any(r.get("action") == "release" and execution_id in str(r.get("target")) for r in actions), (
            actions
        )
        last = app.moment["recorded"]["last_event_id"]
        events = [e for e in app.moment["events"] if e["id"] <= last]
        assert any(e["kind"] == "operator.release" and e["target"] == execution_id for e in events)
        # back to live: the badge goes, the actions come back (read-only still greys them)
        await pilot.press("t")
        await until(pilot, lambda: app.moment is None, "live again")
        assert "NOT LIVE" not in app.header.header_text().plain
        assert not app.timeline_bar.has_class("-shown")
    assert data_fingerprint(copy.root) == before  # the read-only console changed nothing in the copy


def app_if_moment(app: Any) -> ConsoleApp | None:
    return app if isinstance(app, ConsoleApp) and app.moment is not None else None


async def test_t_enters_the_timeline_and_brackets_step(drill: dict[str, Any]) -> None:
    copy = drill["copy"]
    async with console(copy, read_only=True, watch=False).run_test(size=SIZE) as pilot:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        await until(pilot, lambda: app.applied is not None, "the live snapshot")
        await pilot.press("t")
        await until(pilot, lambda: app.moment is not None, "the newest recorded snapshot")
        newest = _recorded(app)
        assert newest["index"] == newest["count"] and newest["reason"] == "stop"
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: _recorded(app)["index"] == newest["count"] - 1, "one step back")
        await pilot.press("left_curly_bracket")
        await until(pilot, lambda: _recorded(app)["incident"], "an incident start")
        assert _recorded(app)["time"] < newest["time"]
        await pilot.press("t")
        await until(pilot, lambda: app.moment is None, "live again")


def test_at_without_a_history_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "data"
    assert run_rem("init", "--data", str(root)).returncode == 0
    proc = run_rem("console", "--at", "-15m", "--data", str(root))
    assert proc.returncode == 1
    assert proc.stderr.startswith("rem: error: no status history at") and "`rem up` records it" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad = run_rem("console", "--at", "teatime", "--data", str(root))
    assert bad.returncode == 2 and "is not a time" in bad.stderr


# -- tool calls on the timeline ---------------------------------------------------------------

OWNER = "executor-tl-1"
HOSTILE = (
    "[bold red]boss[/] \u202eevil \x1b[2J" + "x" * 20_000
)  # markup, a bidi override, an escape, too long


def _call(idx: int, permission: str, to: str) -> PlannedCall:
    return PlannedCall(
        idx=idx,
        model_call_id=f"m{idx}",
        tool="demo.outbox_send",
        arguments=json.dumps({"to": to, "subject": "rollback"}, ensure_ascii=False),  # as a model may send it
        effect="effect",
        effect_source="annotation",
        permission=permission,
        state=ToolCallState.AWAITING_APPROVAL if permission == "ask" else ToolCallState.PENDING,
    )


async def _record(ctx: Context, history: HistoryStore, reason: str) -> int:
    """Record a snapshot as `rem up`'s recorder does, once the clock has moved past the last write."""
    start = clock.now_ms()
    wait_until(lambda: clock.now_ms() > start, timeout=5, message="the clock to move")
    shown = await status(ctx)
    await timeline.record(ctx, history, reason, shown)
    return int(shown["generated_at"])


@pytest.fixture
async def decided(tmp_path: Path) -> dict[str, Any]:
    """Two sends awaiting approval and one whose outcome is unknown, recorded; then an operator
    approves one, denies the other and resolves the unknown one as done, recorded again."""
    data = DataDir(tmp_path / "data")
    ctx = Context(data, start_chroma=False)
    await ctx.db()  # the data dir, created
    history = HistoryStore.open(data.root)
    try:
        asks = await parked_turn(
            ctx, "s-ask", [_call(0, "ask", "ops@example.com"), _call(1, "ask", HOSTILE)], owner=OWNER
        )
        (lost,) = await parked_turn(
            ctx, "s-lost", [_call(0, "allow", "cfo@example.com")], lost=[0], owner=OWNER
        )
        before = await _record(ctx, history, "interval")
        await tool_decisions.approve(ctx, asks[0])
        await tool_decisions.deny(ctx, asks[1], reason="not to \x1b[31mthat\x1b[0m address")
        await tool_decisions.resolve(ctx, lost, "done", text="sent once, seen in the outbox")
        after = await _record(ctx, history, "operator.resolve")
    finally:
        history.close()
        await ctx.close()
    return {
        "data": data,
        "asks": asks,
        "lost": lost,
        "before": before,
        "after": after,
        "operator": ctx.operator,
    }


def _lines(app: ConsoleApp, call_id: str) -> dict[str, dict[str, Any]]:
    """The Events panel's lines of one call, by kind."""
    return {r["kind"]: r for r in table(app, "events").all_records() if r.get("call_id") == call_id}


async def test_the_timeline_shows_tool_calls_as_tool_calls(decided: dict[str, Any]) -> None:
    asks, lost, operator = decided["asks"], decided["lost"], decided["operator"]
    async with console(decided["data"], read_only=True, watch=False, at=decided["before"]).run_test(
        size=SIZE
    ) as pilot:
        app = await until(pilot, lambda: app_if_moment(pilot.app), "the recorded moment to show")
        events = table(app, "events")
        assert "3 tool calls" in str(events.border_title)
        # before the moment: asked, started, outcome unknown; after it (dimmed): who decided what
        unknown = _lines(app, lost)
        assert set(unknown) == {"tool.requested", "tool.running", "tool.unknown", "tool.resolved"}, unknown
        assert [unknown[k].get("after", False) for k in ("tool.running", "tool.unknown")] == [False, False]
        resolved = unknown["tool.resolved"]
        assert resolved["after"] and resolved["actor"] == operator
        assert resolved["detail"].startswith("done") and "sent once" in resolved["detail"]
        assert unknown["tool.unknown"]["actor"] == "executor-tl-1"
        text = events.cell_text(f"tool:{resolved['key']}", "data")
        assert text.startswith(f"demo.outbox_send effect call={lost} done") and "cfo@example.com" in text
        approved, denied = _lines(app, asks[0]), _lines(app, asks[1])
        assert not approved["tool.awaiting_approval"].get("after") and approved["tool.approved"]["after"]
        assert denied["tool.denied"]["actor"] == operator and "tool.running" not in denied
        # a decision is drawn once, as the call's line, not again as a bare journal row
        assert not [
            r for r in events.all_records() if r["kind"].startswith("operator.") and r.get("target") in asks
        ]
        # the hostile arguments: markup shown as text, escapes as escapes, the size bounded
        hostile = events.cell_text(f"tool:{denied['tool.denied']['key']}", "data")
        assert "[bold red]boss[/]" in hostile and "\\u202eevil" in hostile and "\u202e" not in hostile
        assert (
            "\\x1b[31mthat" in hostile
            and "\x1b" not in hostile
            and len(hostile) < timeline_tools.ARGUMENTS_SHOWN + 250
        )
        # one step forward: the decisions are the past now
        await pilot.press("right_square_bracket")
        await until(
            pilot, lambda: _recorded(app)["time"] == decided["after"], "the moment after the decisions"
        )
        assert not _lines(app, lost)["tool.resolved"].get("after")
