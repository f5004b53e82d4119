"""The console's kill key, driven with keys against real processes: `k` on a worker row names its blast
radius (role, pid, host, owner id, leases, running tool calls, the signal) with Cancel focused, then
SIGKILL, then the ✗, then the journal; `k` on the header's Chroma kills the data dir's own server;
refusals in one line (another host, the console's own process, read-only, the past); and the README's
step 5 end to end: a running send listed in Backlog, its executor killed through `k`, the call
`unknown` after the takeover, `o`, done."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from backend.chroma import server as chroma_server
from backend.core import clock
from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.ops import timeline
from backend.ops.actions import status
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store import workers
from backend.store.history import HistoryStore
from tests.backend.test_ops_actions import IDLE_DAEMON
from tests.helpers import rem_env, spawn_rem, wait_until
from tests.tui import scenes
from tests.tui.test_console import (
    SIZE,
    console,
    journal,
    loaded,
    press_confirm,
    scalar,
    select,
    table,
    until,
    write,
)
from tests.tui.tool_turns import running_call
from tui.app import ConsoleApp
from tui.panels import panel_key
from tui.screens.kill import KillScreen
from tui.screens.resolve import ResolveScreen


def _stop(proc: subprocess.Popen[Any]) -> None:
    """A process the test started, and everything in its group (a tool server), gone."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_tool_servers(tools: Path) -> None:
    """The demo tool servers this test's executors started (a session of their own each): the one
    whose caller was killed goes on with its send, by design, until its delay ends."""
    for proc in psutil.process_iter(["cmdline"]):
        if str(tools) in (proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                proc.kill()


async def _fresh(tmp_path: Path) -> DataDir:
    data = DataDir(tmp_path / "data")
    async with Context(data, start_chroma=False) as ctx:
        await ctx.db()
    return data


@pytest.fixture
async def idle_worker(tmp_path: Path) -> AsyncIterator[tuple[DataDir, subprocess.Popen[str], str]]:
    """A real worker process (role dream, idle) of this host, holding a lease with a send running."""
    data = await _fresh(tmp_path)
    owner = "dream-console-1"
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_DAEMON, str(data.root), owner], text=True, start_new_session=True
    )
    try:
        wait_until(lambda: _worker_row(data, owner) is not None, timeout=60, message="the worker to register")
        async with Context(data, start_chroma=False) as ctx:
            await running_call(ctx, "s-drill", owner=owner)
        yield data, proc, owner
    finally:
        _stop(proc)


def _worker_row(data: DataDir, owner: str) -> tuple[Any, ...] | None:
    conn = sqlite3.connect(data.state_db)
    try:
        return conn.execute("SELECT pid, exited_at FROM worker WHERE owner_id = ?", (owner,)).fetchone()
    finally:
        conn.close()


async def _kill_modal(pilot: Any, panel: str, key: str) -> KillScreen:
    """Focus `panel`, select `key`, press k: the kill's confirmation, with Cancel focused."""
    app = pilot.app
    await pilot.press(str(panel_key(panel)))
    await select(pilot, table(app, panel), key)
    await pilot.press("k")
    await until(pilot, lambda: isinstance(app.screen, KillScreen), "the kill confirmation")
    await until(pilot, lambda: app.focused is not None and app.focused.id == "cancel", "Cancel focused")
    assert isinstance(app.screen, KillScreen)
    return app.screen


async def test_k_on_a_worker_names_its_blast_radius_then_kills_it_shows_the_death_and_journals(
    idle_worker: tuple[DataDir, subprocess.Popen[str], str],
) -> None:
    data, proc, owner = idle_worker
    async with console(data).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await until(pilot, lambda: owner in table(app, "workers").shown_keys(), "the worker listed")
        modal = await _kill_modal(pilot, "workers", owner)
        parts = dict(modal.plan.sections)
        assert parts["process"][:2] == [
            f"role dream · pid {proc.pid} · host {workers.host_name()} (this host)",
            f"owner id {owner}",
        ]
        assert parts["holds 1 lease"][0].startswith("exec s-drill · epoch 1 · expires in")
        assert parts["runs 1 tool call"][0].startswith("demo.outbox_send of s-drill · effect · running")
        assert (
            parts["signal"][0]
            == f"SIGKILL to pid {proc.pid}: no clean-up, no hand-back; it dies as in a crash."
        )
        assert "becomes `unknown`" in modal.plan.warning  # the effect in flight
        assert proc.poll() is None  # nothing yet
        await press_confirm(pilot)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        workers_panel = table(app, "workers")
        await until(
            pilot, lambda: workers_panel.cell_text(owner, "state") == "✗ dead", "the worker shown dead"
        )
        leases = table(app, "leases")
        lease_key = next(k for k in leases.shown_keys() if k.startswith("execution:"))
        assert leases.cell_text(lease_key, "owner").startswith("✗")
        log = table(app, "actions").all_records()[0]
        assert (log["action"], log["outcome"]) == ("kill", "ok")
        assert (
            f"SIGKILL dream pid {proc.pid}" in log["message"]
            and "1 lease, 1 tool call running" in log["message"]
        )
    (event,) = journal(data, "operator.kill")
    assert (
        event["target"] == owner and event["data"]["pid"] == proc.pid and event["data"]["signal"] == "SIGKILL"
    )
    assert event["data"]["running_calls"][0]["tool"] == "demo.outbox_send"
    assert scalar(data, "SELECT exited_at IS NOT NULL FROM worker WHERE owner_id = ?", owner) == 1


async def test_k_on_the_headers_chroma_kills_the_data_dirs_own_server(tmp_path: Path) -> None:
    data = await _fresh(tmp_path)
    server = chroma_server.resolve(data, start=True)
    assert server.process is not None
    try:
        async with console(data).run_test(size=SIZE) as pilot:
            app = await loaded(pilot)
            await until(
                pilot, lambda: app.applied is not None and app.applied["chroma"]["healthy"], "Chroma up"
            )
            await pilot.press("0")
            assert (
                "Chroma up" in app.header.header_text().plain
                and "k kills it" in app.header.header_text().plain
            )
            await pilot.press("k")
            await until(pilot, lambda: isinstance(app.screen, KillScreen), "the kill confirmation")
            modal = app.screen
            assert isinstance(modal, KillScreen) and modal.plan.targets == ["chroma"]
            assert f"pid {server.process.pid}" in dict(modal.plan.sections)["process"][0]
            await press_confirm(pilot)
            assert server.process.wait(timeout=10) == -signal.SIGKILL
            await until(pilot, lambda: table(app, "actions").all_records()[0]["outcome"] == "ok", "the kill")
    finally:
        server.stop()
    (event,) = journal(data, "operator.kill")
    assert event["target"] == "chroma" and event["data"]["pid"] == server.process.pid


async def _refused(pilot: Any, app: ConsoleApp, words: str) -> None:
    """No confirmation; the action log says it was refused, and why, in one line."""
    await pilot.pause()
    assert not isinstance(app.screen, KillScreen)
    log = table(app, "actions")

    def newest() -> dict[str, Any]:
        records = log.all_records()
        return records[0] if records else {}

    await until(pilot, lambda: words in newest().get("message", ""), f"the refusal saying {words!r}")
    assert newest()["outcome"] == "refused" and "\n" not in newest()["message"]


async def test_k_is_refused_for_another_host_the_consoles_own_process_and_in_read_only(
    incident_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_HOST", "this-host")  # the scene's workers run on ops-1
    here = workers.host_name()
    write(
        incident_dir,
        "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
        "VALUES ('executor-me', 'executor', ?, ?, ?, ?, 'running')",
        os.getpid(),
        here,
        scenes.NOW - 1_000,
        scenes.NOW,
    )
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("5")
        await select(pilot, table(app, "workers"), scenes.EXEC_A)
        await pilot.press("k")
        await _refused(
            pilot, app, "runs on host ops-1, not this one (this-host); rem never signals another machine"
        )
        await select(pilot, table(app, "workers"), "executor-me")
        await pilot.press("k")
        await _refused(pilot, app, f"pid {os.getpid()} is this console's own process")
        await pilot.press("2", "home", "k")  # a lease names its owner: executor B, on ops-1
        await _refused(pilot, app, f"{scenes.EXEC_B} runs on host ops-1")
    async with console(incident_dir, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        assert app.key_enabled("kill") is False  # greyed out in the key bar
        await pilot.press("5")
        await select(pilot, table(app, "workers"), "executor-me")
        await pilot.press("k")
        await _refused(pilot, app, "this console is read-only")
    assert journal(incident_dir, "operator.kill") == []


async def test_k_is_refused_in_the_timelines_past(
    idle_worker: tuple[DataDir, subprocess.Popen[str], str],
) -> None:
    data, proc, owner = idle_worker
    history = HistoryStore.open(data.root)
    try:
        async with Context(data, start_chroma=False) as ctx:
            shown = await status(ctx)
            await timeline.record(ctx, history, "interval", shown)
    finally:
        history.close()
    at = int(shown["generated_at"])
    wait_until(lambda: clock.now_ms() > at, timeout=5, message="the clock to move past the moment")
    async with console(data, watch=False, at=at).run_test(size=SIZE) as pilot:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        await until(
            pilot, lambda: app.moment is not None and app.applied is app.moment, "the recorded moment"
        )
        assert app.key_enabled("kill") is False
        await pilot.press("5")
        await select(pilot, table(app, "workers"), owner)
        await pilot.press("k")
        await _refused(pilot, app, "the console shows the past; t goes back to live")
    assert proc.poll() is None and journal(data, "operator.kill") == []


# -- the README's step 5: approve (here: allowed), watch the call run, k, see unknown, o ----------
SEND = "Send the weekly report to bob."


def _executor_env(tmp_path: Path) -> dict[str, str]:
    """Executors with rem's demo tool server, its send allowed and long (a minute: the kill cuts it)."""
    config = tmp_path / "mcp.json"
    server = server_config(tmp_path / "tools", effect_delay_ms=60_000)
    rem = {"tools": {"demo.outbox_send": {"permission": "allow", "timeout_ms": 120_000}}}
    config.write_text(json.dumps({"mcpServers": {"demo": server}, "rem": rem}))
    return rem_env(
        REM_MCP_CONFIG=str(config),
        REM_EXECUTION_LEASE_MS="1500",
        REM_AGENT_DELAY_MS="0",
        REM_CHROMA_AUTOSTART="0",
    )


async def test_a_running_call_killed_through_k_turns_unknown_and_o_resolves_it_done(tmp_path: Path) -> None:
    data = await _fresh(tmp_path)
    env = _executor_env(tmp_path)
    first = spawn_rem(
        "daemon", "--role", "executor", "--data", str(data.root), env=env, log=tmp_path / "a.log"
    )
    rescuer: subprocess.Popen[bytes] | None = None
    try:
        async with Context(data, start_chroma=False) as ctx:
            await sessions.admit(await ctx.db(), "s-send", SEND, input_id="in-send")
        async with console(data).run_test(size=SIZE) as pilot:
            app = await loaded(pilot)
            backlog = table(app, "backlog")

            def running_key() -> str | None:
                keys = [k for k in backlog.shown_keys() if backlog.cell_text(k, "what") == "running"]
                return keys[0] if keys else None

            key = await until(pilot, running_key, "the send listed as running", timeout=90)
            record = next(r for r in backlog.all_records() if f"tool:{r['call_id']}" == key)
            assert f"-{first.pid}-" in record["owner_id"] and record["tool"] == "demo.outbox_send"
            assert f"exec:{first.pid}" in backlog.cell_text(key, "detail")  # the executor running it
            modal = await _kill_modal(pilot, "backlog", key)
            assert f"pid {first.pid}" in dict(modal.plan.sections)["process"][0]
            await press_confirm(pilot)
            assert first.wait(timeout=10) == -signal.SIGKILL
            # the next executor takes the turn once its lease expires: the send's outcome is unknown
            rescuer = spawn_rem(
                "daemon", "--role", "executor", "--data", str(data.root), env=env, log=tmp_path / "b.log"
            )
            await until(
                pilot, lambda: backlog.cell_text(key, "what") == "unknown", "the call unknown", timeout=90
            )
            await pilot.press("home")
            await select(pilot, backlog, key)
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, ResolveScreen), "the resolve modal")
            await pilot.click("#text")
            await pilot.press(*"sent once")
            await pilot.click("#done")
            await until(pilot, lambda: key not in backlog.shown_keys(), "the call decided")
        wait_until(
            lambda: scalar(data, "SELECT count(*) FROM session_execution") == 0,
            timeout=90,
            message="the turn done",
        )
    finally:
        _stop(first)
        if rescuer is not None:
            _stop(rescuer)
        _stop_tool_servers(tmp_path / "tools")
    call_id = key.removeprefix("tool:")
    assert scalar(data, "SELECT state FROM tool_call WHERE id = ?", call_id) == "completed"
    assert scalar(data, "SELECT result FROM tool_call WHERE id = ?", call_id) == "sent once"
    assert [e["target"] for e in journal(data, "operator.kill")] == [record["owner_id"]]
