"""A hostile model (tests/hostile_model.py, played by the OpenAI-compatible fake server) against a real
executor, rem's demo MCP server and both stores: lone surrogates in a reply's text, in a tool call's
arguments (in the delta, or escaped inside the arguments' own JSON) and in a function name, its
finish reason and usage. Each input gets exactly one reply, the model is asked once per step (never
again in a loop), the text is stored with U+FFFD and journaled, and a call holding one never runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.execution import sessions
from backend.execution.executor import Executor
from backend.execution.openai_agent import OpenAIAgent
from backend.runtime.context import Context
from tests import hostile_model
from tests.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.both_stores

# session -> (the scenario, the model requests its turn makes, what the first step's reply held)
CASES = {
    "text": (hostile_model.lone_surrogate_text(), 1, 1),
    "extras": (hostile_model.lone_surrogate_extras(), 1, 3),
    "delta": (hostile_model.lone_surrogate_call(), 2, 1),
    "escaped": (hostile_model.escaped_surrogate_call(), 2, 0),
    "name": (hostile_model.lone_surrogate_tool_name(), 2, 1),
}


async def test_lone_surrogates_get_one_reply_each_and_no_loop(
    db_ctx: Context, tools_dir: Path, fake_model: FakeOpenAIServer
) -> None:
    db = await db_ctx.db()
    for case, (scenario, _, _) in CASES.items():
        fake_model.add_route(f"case {case}:", scenario)
        await sessions.admit(db, f"s-{case}", f"case {case}: go", input_id=f"in-{case}")
    await Executor(db_ctx, once=True, agent=OpenAIAgent()).run()

    asked: dict[str, int] = {}
    for request in fake_model.requests():
        asked[request.scenario] = asked.get(request.scenario, 0) + 1
    assert asked == {scenario.name: count for scenario, count, _ in CASES.values()}
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0  # every turn ended cleanly
    replies = await db.fetchall(
        "SELECT session_id, data FROM session_message WHERE type = 'assistant' "
        "AND json_extract(data, '$.status') = 'completed'"
    )
    assert sorted(r[0] for r in replies) == sorted(f"s-{c}" for c in CASES)  # exactly one reply each
    texts = {r[0]: json.loads(r[1])["text"] for r in replies}
    assert texts["s-text"] == "lone\ufffdsurrogate"
    assert texts["s-delta"] == texts["s-escaped"] == hostile_model.ANSWER
    repaired = {
        r[0]: json.loads(r[1])["lone_surrogates"]
        for r in await db.fetchall("SELECT session_id, data FROM event WHERE kind = 'model.output_repaired'")
    }
    assert repaired == {f"s-{c}": n for c, (_, _, n) in CASES.items() if n}

    calls = {r["session_id"]: dict(r) for r in await db.fetchall("SELECT * FROM tool_call")}
    assert set(calls) == {"s-delta", "s-escaped", "s-name"}
    for call in calls.values():  # refused, never run, and the model was told why
        assert call["state"] == "error" and call["starts"] == 0, call
        assert "lone surrogate" in call["result"] and "it was not run" in call["result"], call
    assert calls["s-name"]["tool"] == "demo.notes\ufffdadd"
    assert not (tools_dir / "tools.log.jsonl").exists()  # the tool server never saw a call
    told = [m for r in fake_model.requests() for m in r.messages if m["role"] == "tool"]
    assert len(told) == 3 and all("lone surrogate" in m["content"] for m in told)
