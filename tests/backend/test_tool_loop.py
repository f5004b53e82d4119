"""The agent loop with real tools, in-process: the offline agent calls rem's demo MCP server over stdio.

A note (idempotent, allowed) runs at once and a second step answers with its result; a send (an
effect, `ask` by default) waits for approval with the turn parked and the session held, survives
the executor's end, and runs once after `approve`, taken over without a recovery attempt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.execution import executor as executor_module
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store.db import Database

pytestmark = pytest.mark.both_stores


@pytest.fixture
def tools_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "tools"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"demo": server_config(data, effect_delay_ms=100)}}))
    monkeypatch.setenv("REM_MCP_CONFIG", str(config))
    return data


def _log(data: Path) -> list[dict[str, Any]]:
    path = data / "tools.log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _run(ctx: Context) -> None:
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=5_000).run()


async def _assistants(db: Database, sid: str) -> list[dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT data FROM session_message WHERE session_id = ? AND type = 'assistant' ORDER BY seq", (sid,)
    )
    return [json.loads(r[0]) for r in rows]


async def test_a_note_runs_at_once_and_the_next_step_answers_with_it(
    db_ctx: Context, tools_dir: Path
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Please note that the standup moved to 10:30.", input_id="in-1")
    await _run(db_ctx)
    asked, answered = await _assistants(db, "s1")
    assert asked["status"] == "tool_calls" and answered["status"] == "completed"
    assert answered["answers"] == ["in-1"] and "demo.notes_add returned" in answered["text"]
    call = await db.fetchone("SELECT * FROM tool_call")
    assert call is not None
    assert (call["tool"], call["effect"], call["state"], call["starts"]) == (
        "demo.notes_add",
        "idempotent",
        "completed",
        1,
    )
    starts = [e for e in _log(tools_dir) if e["phase"] == "start"]
    assert [(e["tool"], e["key"]) for e in starts] == [("notes_add", call["idempotency_key"])]
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0


async def test_the_step_answering_with_a_tools_result_is_given_the_memory_the_first_was(
    db_ctx: Context, tools_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second step answers the same prompt: it is given (and records) the first step's memory,
    recalled once for the turn, not recalled again."""
    recalls: list[str] = []
    for name in ("memory_for_step", "lexical_memory_sync"):
        real = getattr(executor_module, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            recalls.append(_name)
            return _real(*args)

        monkeypatch.setattr(executor_module, name, counted)
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Please note that the standup moved to 10:30.", input_id="in-1")
    await _run(db_ctx)
    asked, answered = await _assistants(db, "s1")
    assert asked["status"] == "tool_calls" and answered["status"] == "completed"
    assert "items" in asked["memory"] and answered["memory"] == asked["memory"]
    assert len(recalls) == 1, recalls


async def test_a_send_waits_parked_for_approval_then_runs_once(db_ctx: Context, tools_dir: Path) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Send the weekly report to bob please.", input_id="in-1")
    await _run(db_ctx)
    call = await db.fetchone("SELECT id, state, arguments FROM tool_call")
    assert call is not None and call["state"] == "awaiting_approval"
    assert json.loads(call["arguments"])["to"] == "bob"
    execution = await db.fetchone("SELECT parked FROM session_execution")
    assert execution is not None and execution[0] == "tool_awaiting_approval"
    assert await db.scalar("SELECT held_reason FROM session WHERE id = 's1'") == "tool_awaiting_approval"
    assert _log(tools_dir) == []
    await _run(db_ctx)  # a parked turn is nobody's work: a second executor leaves it be
    assert await db.scalar("SELECT state FROM tool_call") == "awaiting_approval"

    decision = await ops.approve(db_ctx, call["id"])
    assert decision["unparked"] is True
    await _run(db_ctx)
    assert await db.scalar("SELECT state FROM tool_call") == "completed"
    assert [e["tool"] for e in _log(tools_dir) if e["phase"] == "start"] == ["outbox_send"]
    assert len((tools_dir / "outbox.jsonl").read_text().splitlines()) == 1
    replies = [a for a in await _assistants(db, "s1") if a["status"] == "completed"]
    assert len(replies) == 1 and "demo.outbox_send returned" in replies[0]["text"]
    taken = await db.fetchone("SELECT data FROM event WHERE kind = 'execution.taken_over'")
    assert taken is not None and json.loads(taken[0])["reason"] == "unparked"
    assert await db.fetchone("SELECT 1 FROM session_message WHERE type = 'synthetic'") is None
    assert await db.scalar("SELECT held_at FROM session WHERE id = 's1'") is None
