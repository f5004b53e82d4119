"""Tool-source health reaches the store: a real executor with rem's demo MCP server and a server
that cannot start; `rem status` in another process shows the broken one down, the demo's tools run."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.execution import sessions, tool_health
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.execution.tool_runner import ToolRunner
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store import workers
from backend.store.workers import WorkerRole
from tests.helpers import await_until, rem_env, run_rem

pytestmark = pytest.mark.both_stores

MISSING = "/nonexistent/prog"


def use_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: dict[str, Any]) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    monkeypatch.setenv("REM_MCP_CONFIG", str(config))


async def servers(ctx: Context) -> list[dict[str, Any]]:
    return list((await ops.status(ctx))["tools"]["servers"])


async def test_a_server_that_cannot_start_is_down_in_status_and_the_others_tools_run(
    db_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rem.tools.servers")
    use_config(
        tmp_path, monkeypatch, {"demo": server_config(tmp_path / "tools"), "broken": {"command": MISSING}}
    )
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Please note that the standup moved to 10:30.", input_id="in-1")
    executor = Executor(db_ctx, agent=OfflineResponder(delay_ms=0), lease_ms=5_000)
    task = asyncio.create_task(executor.run())
    try:
        await await_until(
            lambda: db.scalar("SELECT count(*) FROM session_message WHERE type = 'assistant'"),
            timeout=90,
            message="the turn's first step",
        )
        await await_until(
            lambda: db.scalar("SELECT count(*) = 0 FROM session_execution"), timeout=90, message="the turn"
        )
        assert await db.scalar("SELECT tool || ' ' || state FROM tool_call") == "demo.notes_add completed"
        listed = await servers(db_ctx)  # recorded in the turn's own flow, before its call ran
        assert [(s["server"], s["up"], s["worker"]) for s in listed] == [
            ("broken", False, executor.owner_id),
            ("demo", True, executor.owner_id),
        ]
        assert listed[0]["error"] == f"cannot start: cannot run '{MISSING}': No such file or directory"
        assert listed[1]["error"] is None and listed[0]["since"] <= clock.now_ms()
        failed = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot start" in r.message]
        assert (
            len(failed) == 1
            and f"tool server broken cannot start: cannot run '{MISSING}'" in failed[0].message
        )
        await _rem_status_shows_it(db_ctx, executor.owner_id)
    finally:
        executor.request_stop()
        await task
    assert await servers(db_ctx) == []  # a stopped executor's servers stopped with it


async def _rem_status_shows_it(ctx: Context, owner_id: str) -> None:
    """`rem status` in another process: the down line (only the broken server's), and the JSON."""
    wide = rem_env(COLUMNS="250")  # one line, unwrapped
    text = await asyncio.to_thread(run_rem, "status", "--data", str(ctx.data.root), env=wide)
    assert text.returncode == 0, text.stderr
    down = [line for line in text.stdout.splitlines() if line.startswith("tool server ")]
    assert len(down) == 1, text.stdout
    assert down[0].startswith("tool server broken down for ") and f"in {owner_id}: " in down[0]
    assert down[0].endswith(f"cannot start: cannot run '{MISSING}': No such file or directory")
    shown = await asyncio.to_thread(run_rem, "status", "--json", "--data", str(ctx.data.root))
    tools = json.loads(shown.stdout)["tools"]
    assert set(tools) == {"awaiting_approval", "unknown_outcome", "running", "counts", "by_tool", "servers"}
    assert [(s["server"], s["up"]) for s in tools["servers"]] == [("broken", False), ("demo", True)]


async def test_a_server_that_comes_up_after_failing_is_recorded_up_and_only_changes_are_written(
    db_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "late-server"  # missing until the test writes it
    use_config(tmp_path, monkeypatch, {"late": {"command": str(program)}})
    writes: list[dict[str, Any]] = []
    record_info = workers.record_info

    async def counted(db: Any, owner_id: str, info: dict[str, Any]) -> None:
        writes.append(info)
        await record_info(db, owner_id, info)

    monkeypatch.setattr(tool_health.workers, "record_info", counted)
    db = await db_ctx.db()
    await workers.register(db, "ex-1", WorkerRole.EXECUTOR, {"agent": "test"})
    runner = ToolRunner(lambda: db, "ex-1", logging.getLogger("test"), lambda: {"agent": "test"})
    try:
        assert await runner.offered() == []
        assert await runner.offered() == []  # failed again at once (the first restart does not wait)
        [down] = await servers(db_ctx)
        assert (down["server"], down["up"], down["worker"]) == ("late", False, "ex-1")
        assert len(writes) == 1  # the second failure changed nothing recorded
        demo = [sys.executable, "-P", "-m", "backend.programs.demo_tools", "--data", str(tmp_path)]
        program.write_text("#!/bin/sh\nexec " + " ".join(demo) + "\n")
        program.chmod(0o755)
        retry_at = (await runner.registry()).health()[0]["retry_at"] or 0
        await await_until(_now_past(retry_at), message="the backoff to end")
        assert len(await runner.offered()) == 3
        [up] = await servers(db_ctx)
        assert (up["server"], up["up"], up["error"]) == ("late", True, None) and up["since"] >= down["since"]
        info = json.loads(await db.scalar("SELECT info FROM worker WHERE owner_id = 'ex-1'"))
        assert info["agent"] == "test" and info["tool_servers"][0]["up"] is True  # the rest of the row kept
        await runner.offered()
        await runner.record_health()
        assert len(writes) == 2  # up and still up: nothing more written
    finally:
        await runner.aclose()


def _now_past(at: int) -> Any:
    async def check() -> bool:
        return clock.now_ms() >= at

    return check


async def test_tools_listed_before_the_executor_runs_are_recorded_once_it_has_registered(
    db_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller may list the tools first (the benchmarks do, to start the servers before the clock):
    no worker row to write to yet, so nothing is written and nothing fails; the run records them."""
    use_config(tmp_path, monkeypatch, {"demo": server_config(tmp_path / "tools")})
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Please note that the standup moved to 10:30.", input_id="in-1")
    executor = Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=5_000)
    assert [t["function"]["name"] for t in await executor.tools.offered()]
    assert await db.scalar("SELECT count(*) FROM worker") == 0
    await executor.run()
    info = json.loads(await db.scalar("SELECT info FROM worker WHERE owner_id = ?", (executor.owner_id,)))
    assert [(s["server"], s["up"]) for s in info[tool_health.INFO_KEY]] == [("demo", True)]
