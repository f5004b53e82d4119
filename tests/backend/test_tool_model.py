"""The OpenAI-compatible agent with tools, against the scripted server streaming `tool_calls` deltas
and rem's demo MCP server over stdio: the tools offered as NAME__TOOL, parallel calls assembled by
index and run, each result sent back under the model's call id, hostile calls (bad JSON, an
unknown tool, arguments over the bound) answered with a tool error and never run, and
REM_MAX_STEPS ending a turn that keeps asking for tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.execution import sessions
from backend.execution.executor import Executor
from backend.execution.openai_agent import OpenAIAgent
from backend.runtime.context import Context
from tests.fake_openai import FakeOpenAIServer, Scenario

FINAL = "All three are done."


def _call(name: str, arguments: Any, call_id: str) -> dict[str, str]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"name": name, "arguments": text, "id": call_id}


async def test_parallel_streamed_calls_run_and_their_results_go_back(
    db_ctx: Context, tools_dir: Path, fake_model: FakeOpenAIServer
) -> None:
    fake_model.push(
        Scenario(
            reply="Let me do that.",
            tool_calls=[
                _call("demo__notes_add", {"text": "standup at 10:30"}, "m-add"),
                _call("demo__notes_search", {"query": "standup"}, "m-find"),
                _call("demo__notes_add", "{not json", "m-bad"),
                _call("nowhere__nothing", {}, "m-none"),
                _call("demo__notes_add", {"text": "x" * 2000}, "m-big"),
            ],
        ),
        Scenario(reply=FINAL),
    )
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Note the standup time and look it up.", input_id="in-1")
    await Executor(db_ctx, once=True, agent=OpenAIAgent()).run()

    first, second = [r.body for r in fake_model.requests()][-2:]
    assert {t["function"]["name"] for t in first["tools"]} >= {"demo__notes_add", "demo__outbox_send"}
    rows = {r["model_call_id"]: dict(r) for r in await db.fetchall("SELECT * FROM tool_call ORDER BY idx")}
    assert rows["m-add"]["state"] == "completed" and rows["m-add"]["tool"] == "demo.notes_add"
    assert rows["m-find"]["state"] == "completed" and rows["m-find"]["effect"] == "read"
    assert rows["m-bad"]["state"] == "error" and "not valid JSON" in rows["m-bad"]["result"]
    assert rows["m-none"]["state"] == "error" and rows["m-none"]["starts"] == 0
    assert rows["m-big"]["state"] == "error" and "REM_TOOL_ARGUMENTS_MAX_BYTES" in rows["m-big"]["result"]
    started = [json.loads(line)["tool"] for line in (tools_dir / "tools.log.jsonl").read_text().splitlines()]
    assert (
        sorted(set(started)) == ["notes_add", "notes_search"] and started.count("notes_add") == 2
    )  # start+finish

    # the second request carries the assistant's calls and one tool message per call, by id
    messages = second["messages"]
    asked = next(m for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
    assert [c["id"] for c in asked["tool_calls"]] == ["m-add", "m-find", "m-bad", "m-none", "m-big"]
    answers = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert set(answers) == set(rows) and "added" in answers["m-add"]
    assert answers["m-bad"] == rows["m-bad"]["result"]
    reply = await db.fetchone(
        "SELECT data FROM session_message WHERE type = 'assistant' AND json_extract(data, '$.status') = 'completed'"
    )
    assert reply is not None and json.loads(reply[0])["text"] == FINAL


async def test_max_steps_ends_a_turn_that_keeps_asking(
    db_ctx: Context, tools_dir: Path, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MAX_STEPS", "2")
    fake_model.set_default(
        Scenario(reply="Again.", tool_calls=[_call("demo__notes_search", {"query": "x"}, "m-1")])
    )
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Look forever.", input_id="in-1")
    await Executor(db_ctx, once=True, agent=OpenAIAgent()).run()
    assert await db.scalar("SELECT count(*) FROM tool_call") == 1
    rows = await db.fetchall(
        "SELECT data FROM session_message WHERE type = 'assistant' AND json_extract(data, '$.status') = 'completed'"
    )
    assert len(rows) == 1 and "REM_MAX_STEPS (2 model steps)" in json.loads(rows[0][0])["text"]
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.max_steps'") == 1
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
