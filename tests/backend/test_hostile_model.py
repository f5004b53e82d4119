"""A hostile model (tests/hostile_model.py, played by the OpenAI-compatible fake server) against a real
executor, rem's demo MCP server and both stores: lone surrogates in a reply's text, in a tool call's
arguments (in the delta, or escaped inside the arguments' own JSON) and in a function name, its
finish reason and usage; NUL in a reply and in a function name made of terminal escapes. Each input
gets exactly one reply, the model is asked once per step (never again in a loop), the text is stored
with U+FFFD and journaled, a call holding one never runs, and `rem metrics` shows no name the model
made up raw: a malformed one is counted as `(unknown)`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from backend import ops
from backend.execution import sessions
from backend.execution.executor import Executor
from backend.execution.openai_agent import OpenAIAgent
from backend.ops.prometheus import exposition
from backend.runtime.context import Context
from tests import hostile_model
from tests.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.both_stores

# session -> (the scenario, the model requests its turn makes, the characters its first step's reply
# held that no store can hold)
CASES = {
    "text": (hostile_model.lone_surrogate_text(), 1, 1),
    "extras": (hostile_model.lone_surrogate_extras(), 1, 3),
    "delta": (hostile_model.lone_surrogate_call(), 2, 1),
    "escaped": (hostile_model.escaped_surrogate_call(), 2, 0),
    "name": (hostile_model.lone_surrogate_tool_name(), 2, 1),
    "nul": (hostile_model.nul_text(), 1, 1),
    "terminal": (hostile_model.terminal_tool_name(), 2, 1),
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
    assert texts["s-nul"] == "nul\ufffdbyte \x1b[2J\u202e"  # stored as it came but the NUL (shown inert)
    assert texts["s-delta"] == texts["s-escaped"] == hostile_model.ANSWER
    repaired = {
        r[0]: json.loads(r[1])["replaced"]
        for r in await db.fetchall("SELECT session_id, data FROM event WHERE kind = 'model.output_repaired'")
    }
    assert repaired == {f"s-{c}": n for c, (_, _, n) in CASES.items() if n}

    calls = {r["session_id"]: dict(r) for r in await db.fetchall("SELECT * FROM tool_call")}
    assert set(calls) == {"s-delta", "s-escaped", "s-name", "s-terminal"}
    for call in calls.values():  # refused, never run, and the model was told why
        assert call["state"] == "error" and call["starts"] == 0, call
        assert "lone surrogate" in call["result"] and "it was not run" in call["result"], call
    assert calls["s-name"]["tool"] == "demo.notes\ufffdadd"
    assert not (tools_dir / "tools.log.jsonl").exists()  # the tool server never saw a call
    told = [m for r in fake_model.requests() for m in r.messages if m["role"] == "tool"]
    assert len(told) == 4 and all("lone surrogate" in m["content"] for m in told)
    await _metrics_show_no_invented_name(db_ctx)


async def _metrics_show_no_invented_name(ctx: Context) -> None:
    """The scrape: the names made of escapes are one `(unknown)` series, and nothing raw reached it."""
    scrape = exposition(await ops.status(ctx)).decode()
    assert not any(c in scrape for c in ("\x1b", "\u202e", "\x00", "\ufffd")), scrape
    calls = {
        (s.labels["tool"], s.labels["outcome"]): s.value
        for family in parse_openmetrics(scrape)
        if family.name == "rem_tool_calls"
        for s in family.samples
        if s.name == "rem_tool_calls_total"
    }
    assert calls == {("(unknown)", "error"): 2, ("demo.notes_add", "error"): 2}
