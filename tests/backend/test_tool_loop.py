"""The agent loop with real tools, in-process: the offline agent calls rem's demo MCP server over stdio.

A note (idempotent, allowed) runs at once and a second step answers with its result; a send (an
effect, `ask` by default) waits for approval with the turn parked and the session held, survives
the executor's end, and runs once after `approve`, taken over without a recovery attempt.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.execution import executor as executor_module
from backend.execution import leases, sessions, tool_calls
from backend.execution.agent import OfflineResponder, StepRequest
from backend.execution.executor import Executor
from backend.execution.steps import TurnState, tool_rounds_sync
from backend.execution.tool_calls import PlannedCall
from backend.models.tool_deltas import ModelToolCall
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.states import ToolCallState

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


class RoundsAgent:
    """Asks for one `notes_search` a step for `rounds` steps, then answers; keeps what each step was shown."""

    name = "test-rounds-agent"

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.shown: list[list[dict[str, Any]]] = []
        self.prompts: list[list[str]] = []

    def system_prompt(self) -> str:
        return "test"

    def snapshot(self) -> dict[str, Any]:
        return {"agent": self.name}

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        self.shown.append(request.tool_rounds)
        self.prompts.append(request.prompts)
        if len(request.tool_rounds) < self.rounds:
            query = json.dumps({"query": f"standup {len(request.tool_rounds)}"})
            request.tool_calls = [ModelToolCall(index=0, id="c", name="demo__notes_search", arguments=query)]
            yield "looking"
            return
        yield "done"


async def test_each_step_is_shown_every_round_so_far_read_once(db_ctx: Context, tools_dir: Path) -> None:
    """A step reads only the rounds after the settled ones it kept: what each step is shown is
    still every round so far, exactly as a full read gives them."""
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "look it up", input_id="in-1")
    agent = RoundsAgent(4)
    await Executor(db_ctx, once=True, agent=agent, lease_ms=5_000).run()
    execution_id = await db.scalar("SELECT DISTINCT execution_id FROM tool_call")
    full = await db.read_in_thread(lambda conn: tool_calls.rounds_sync(conn, execution_id))
    assert [len(shown) for shown in agent.shown] == [0, 1, 2, 3, 4]
    assert agent.prompts == [["look it up"]] * 5  # each tool round answers the turn's prompt again
    answers = await db.fetchall(
        "SELECT json_extract(data, '$.answers') FROM session_message WHERE type = 'assistant' ORDER BY seq"
    )
    assert [json.loads(a[0]) for a in answers] == [["in-1"]] * 5
    assert all(shown == full[: len(shown)] for shown in agent.shown)
    assert [json.loads(r["calls"][0]["arguments"])["query"] for r in full] == [
        f"standup {n}" for n in range(4)
    ]


async def test_a_round_not_settled_when_read_is_read_again(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "look it up", input_id="in-1")
    lease = await leases.claim(db, "s1", "test-owner", length_ms=60_000)
    assert lease is not None
    for step, state in ((1, ToolCallState.COMPLETED), (2, ToolCallState.PENDING)):
        planned = PlannedCall(
            idx=0, model_call_id="c", tool="demo.notes_search", arguments="{}", effect="read",
            effect_source="annotation", permission="allow", state=state,
        )  # fmt: skip
        await db.write_in_thread(
            lambda conn, step=step, planned=planned: tool_calls.insert_sync(
                conn, lease, step, f"{lease.execution_id}:{step}", [planned], 1
            )
        )
    turn = TurnState(lease)
    first = await db.read_in_thread(lambda conn: tool_rounds_sync(conn, turn))
    assert [r["calls"][0]["state"] for r in first] == ["completed", "pending"]
    assert [r["step"] for r in turn.settled_rounds] == [1]
    await db.write_in_thread(
        lambda conn: conn.execute(
            "UPDATE tool_call SET state = 'completed', result = 'found it' WHERE step = 2"
        )
    )
    again = await db.read_in_thread(lambda conn: tool_rounds_sync(conn, turn))
    assert [(r["step"], r["calls"][0]["state"], r["calls"][0]["for_model"]) for r in again][1] == (
        2,
        "completed",
        "found it",
    )
    assert again[0] is first[0] and [r["step"] for r in turn.settled_rounds] == [1, 2]
