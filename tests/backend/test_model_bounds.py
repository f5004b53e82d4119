"""Model replies are read up to a bound: the stream stops there, the turn ends truncated.

Against the scripted endpoint (tests/fake_openai.py) through the real
`openai` SDK: a stream longer than `max_chars` yields exactly that many
characters and stops reading; an SSE line too long to hold is never held;
a whole completion over the bound is refused unread. The executor applies
`REM_MODEL_REPLY_MAX_CHARS` to any agent, the built-in one or a plug-in.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from backend.execution import sessions
from backend.execution.agent import OfflineResponder, StepRequest
from backend.execution.executor import Executor
from backend.execution.openai_agent import OpenAIAgent
from backend.models.client import ChatReply, LineTooLong, ModelClient, bounded_lines, reply_bytes_limit
from backend.models.errors import ModelError
from backend.ops.transcript import transcript_sync
from backend.runtime.context import Context
from tests.fake_openai import FakeOpenAIServer, Scenario, tokenize

LONG = "".join(f"word{i} " for i in range(20_000))  # 128 000+ characters


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _lines(limit: int, *parts: bytes) -> list[str]:
    return [line async for line in bounded_lines(_chunks(*parts), limit)]


async def test_bounded_lines_split_on_every_line_ending_across_chunks() -> None:
    assert await _lines(100, b"data: a\r", b"\ndata: b\rdata: c\n\nda", b"ta: d") == [
        "data: a",
        "data: b",
        "data: c",
        "",
        "data: d",
    ]
    assert await _lines(100, b"one\r\n", b"two\r") == ["one", "two"]


async def test_bounded_lines_refuse_a_line_longer_than_the_limit_without_holding_more() -> None:
    with pytest.raises(LineTooLong):
        await _lines(1000, b"data: ", *[b"x" * 600] * 10_000)  # 6 MB, refused after 1 KB
    assert await _lines(1000, b"a" * 999 + b"\n") == ["a" * 999]


async def _stream(max_chars: int) -> tuple[str, ChatReply]:
    client = ModelClient()
    reply = ChatReply(model="gpt-4o-mini")
    try:
        text = "".join(
            [
                t
                async for t in client.stream_chat(
                    [{"role": "user", "content": "hi"}], reply=reply, max_chars=max_chars
                )
            ]
        )
    finally:
        await client.aclose()
    return text, reply


async def test_a_stream_is_read_up_to_max_chars_then_ends_truncated(fake_model: FakeOpenAIServer) -> None:
    fake_model.push(Scenario(reply=LONG, chunking="chars", chunk_chars=5000, tokens_per_second=50))
    text, reply = await _stream(10_000)
    assert text == LONG[:10_000]
    assert reply.truncated and reply.finish_reason == "truncated"
    # the client hung up: the server never sent most of the reply
    (record,) = fake_model.requests()
    assert record.outcome != "completed" and record.tokens_sent < len(tokenize(LONG, "chars", 5000)) / 2

    fake_model.push(Scenario(reply="short and whole"))
    text, reply = await _stream(10_000)
    assert text == "short and whole" and not reply.truncated and reply.finish_reason == "stop"


async def test_one_sse_line_too_long_to_hold_ends_the_reply_truncated_unread(
    fake_model: FakeOpenAIServer,
) -> None:
    fake_model.push(Scenario(reply="a first part " + LONG, chunking="chars", chunk_chars=len(LONG)))
    text, reply = await _stream(1000)
    assert reply_bytes_limit(1000) < len(LONG)
    assert text == "" and reply.truncated and reply.finish_reason == "truncated"


async def test_a_whole_completion_over_the_bound_is_refused_unread(fake_model: FakeOpenAIServer) -> None:
    fake_model.push(Scenario(reply=LONG))
    client = ModelClient()
    try:
        with pytest.raises(ModelError) as refused:
            await client.complete(
                [{"role": "user", "content": "hi"}], reply=ChatReply(model="m"), max_chars=1000
            )
        fake_model.push(Scenario(reply="fine"))
        assert (
            await client.complete([{"role": "user", "content": "hi"}], reply=ChatReply(model="m")) == "fine"
        )
    finally:
        await client.aclose()
    assert refused.value.error_class == "bad_output" and "it was not read" in str(refused.value)
    assert len(fake_model.requests()) == 2  # a bad_output is not retried: each request is bounded


class TalkativeAgent(OfflineResponder):
    """A plug-in agent that never stops talking (and ignores any bound of its own)."""

    def __init__(self) -> None:
        super().__init__(delay_ms=0)
        self.parts_asked = 0

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        while True:
            self.parts_asked += 1
            yield "blah " * 100


@pytest.mark.both_stores
async def test_the_executor_ends_any_agents_reply_at_the_bound_with_an_event(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MODEL_REPLY_MAX_CHARS", "12000")
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Say something.", input_id="in-1")
    agent = TalkativeAgent()
    await Executor(db_ctx, once=True, agent=agent).run()
    row = await db.fetchone("SELECT id, data FROM session_message WHERE type = 'assistant'")
    reply = json.loads(row["data"])
    assert reply["status"] == "completed" and reply["truncated"] is True
    assert reply["finish_reason"] == "truncated" and reply["text"] == ("blah " * 100 * 25)[:12_000]
    assert agent.parts_asked == 24  # the stream was closed at the bound, not drained
    parts = await db.fetchall("SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (row["id"],))
    assert "".join(json.loads(p[0])["text"] for p in parts) == reply["text"]
    events = await db.fetchall("SELECT data FROM event WHERE kind = 'execution.truncated'")
    assert [json.loads(e[0]) for e in events] == [
        {
            "step": 1,
            "assistant_id": row["id"],
            "chars": 12_000,
            "limit": 12_000,
            "setting": "REM_MODEL_REPLY_MAX_CHARS",
        }
    ]
    shown = await db.read_in_thread(lambda conn: transcript_sync(conn, "s1"))
    assert shown["messages"][-1]["marker"].startswith("truncated")


async def test_the_openai_agent_turn_is_truncated_at_the_setting(
    ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MODEL_REPLY_MAX_CHARS", "5000")
    fake_model.push(Scenario(reply=LONG, chunking="chars", chunk_chars=3000))
    db = await ctx.db()
    await sessions.admit(db, "s1", "Say everything.", input_id="in-1")
    await Executor(ctx, once=True, agent=OpenAIAgent()).run()
    reply = json.loads(await db.scalar("SELECT data FROM session_message WHERE type = 'assistant'"))
    assert reply["text"] == LONG[:5000] and reply["truncated"] and reply["finish_reason"] == "truncated"
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.truncated'") == 1
