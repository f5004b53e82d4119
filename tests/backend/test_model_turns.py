"""Turns answered by the built-in OpenAI-compatible agent, against a real local HTTP server.

The server is tests/fake_openai.py (Chat Completions over SSE, scripted per
request); the client is the real `openai` SDK inside `OpenAIAgent`; the
executor and state.db are the real ones.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from backend import ops
from backend.core.errors import Refused
from backend.execution import projection, sessions
from backend.execution.executor import Executor
from backend.execution.openai_agent import INTERRUPTED_NOTE, OpenAIAgent
from backend.runtime.context import Context
from backend.store.db import Database
from tests.fake_openai import (
    FakeOpenAIServer,
    Scenario,
    bad_api_key,
    drop,
    malformed,
    rate_limited,
    server_error,
    stall,
    unknown_model,
)
from tests.helpers import await_until

REPLY = "The ledger export stalled because the window closed early."


def _executor(ctx: Context, *, once: bool = True, lease_ms: int | None = None) -> Executor:
    return Executor(ctx, once=once, agent=OpenAIAgent(), lease_ms=lease_ms)


async def _replies(db: Database, sid: str = "s1") -> list[dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT id, data FROM session_message WHERE session_id = ? AND type = 'assistant' ORDER BY seq",
        (sid,),
    )
    return [{"id": r[0], **json.loads(r[1])} for r in rows]


async def _parts(db: Database, message_id: str) -> list[str]:
    rows = await db.fetchall("SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (message_id,))
    return [json.loads(r[0])["text"] for r in rows]


async def _calls(db: Database) -> list[tuple[Any, ...]]:
    return [
        tuple(r) for r in await db.fetchall("SELECT outcome, attempt, status FROM model_call ORDER BY id")
    ]


async def _violations(db: Database) -> list[dict[str, Any]]:
    return await db.read_in_thread(projection.transcript_violations_sync)


async def test_a_streamed_reply_is_stored_whole_with_the_usage_the_server_reported(
    db_ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "REM_MODEL_PRICES", json.dumps({"gpt-4o": {"input": 2.5, "output": 10.0, "cache_read": 1.25}})
    )
    fake_model.set_default(
        Scenario(
            reply=REPLY, prompt_tokens=1200, completion_tokens=90, cached_tokens=200, reasoning_tokens=30
        )
    )
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Why did the nightly ledger export stall?", input_id="q1")
    await _executor(db_ctx).run()
    (reply,) = await _replies(db)
    assert reply["status"] == "completed" and reply["text"] == REPLY and reply["answers"] == ["q1"]
    assert "".join(await _parts(db, reply["id"])) == REPLY
    # the split the session's usage columns use: input excludes the cached 200, output the 30 reasoning
    usage = {"input": 1000, "output": 60, "reasoning": 30, "cache_read": 200, "cache_write": 0}
    assert reply["usage"] == usage and reply["usage_reported"]["prompt_tokens"] == 1200
    cost = (1000 * 2.5 + 60 * 10.0 + 30 * 10.0 + 200 * 1.25) / 1e6  # gpt-4o-mini priced as gpt-4o (prefix)
    assert reply["cost"] == pytest.approx(cost) and reply["model"] == "gpt-4o-mini"
    row = await db.fetchone(
        "SELECT tokens_input, tokens_output, tokens_reasoning, tokens_cache_read, tokens_cache_write, cost, "
        "model FROM session WHERE id = 's1'"
    )
    assert tuple(row) == (1000, 60, 30, 200, 0, pytest.approx(cost), "gpt-4o-mini")
    request = fake_model.requests()[0]
    assert request.body["stream"] and request.body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in request.messages] == ["system", "user"]
    assert await _calls(db) == [("ok", 1, None)]
    assert await _violations(db) == []


async def test_each_turn_sends_the_earlier_conversation(
    db_ctx: Context, fake_model: FakeOpenAIServer
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first question", input_id="q1")
    await sessions.admit(db, "s1", "second question", input_id="q2")
    await _executor(db_ctx).run()
    second = fake_model.requests()[1].messages
    assert [(m["role"], m["content"]) for m in second[1:]] == [
        ("user", "first question"),
        ("assistant", REPLY),
        ("user", "second question"),
    ]
    totals = await db.fetchone("SELECT tokens_output, turn_count FROM session WHERE id = 's1'")
    assert tuple(totals) == (2 * len(REPLY.split()), 2)  # one completion token per streamed word


async def test_a_429_with_retry_after_is_waited_out_and_counted(
    db_ctx: Context, fake_model: FakeOpenAIServer
) -> None:
    fake_model.push(rate_limited(times=2, retry_after=0.3))
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Summarise the incident.", input_id="q1")
    await _executor(db_ctx).run()
    (reply,) = await _replies(db)
    assert reply["status"] == "completed" and reply["text"] == REPLY and reply["attempts"] == 3
    assert await _calls(db) == [("rate_limited", 1, 429), ("rate_limited", 2, 429), ("ok", 3, None)]
    seen = fake_model.requests()
    gaps = [b.received_monotonic - a.received_monotonic for a, b in zip(seen, seen[1:], strict=False)]
    assert all(gap >= 0.3 for gap in gaps), gaps  # Retry-After honoured, not hammered
    waits = await db.fetchall("SELECT retry_after_ms FROM model_call WHERE outcome = 'rate_limited'")
    assert [r[0] for r in waits] == [300, 300]
    errors = await db.fetchall("SELECT data FROM event WHERE kind = 'model.error' ORDER BY id")
    assert [json.loads(r[0])["class"] for r in errors] == ["rate_limited", "rate_limited"]
    assert json.loads((await db.fetchone("SELECT model_error FROM session"))[0])["class"] == "rate_limited"


async def test_5xx_past_the_retry_budget_fails_the_turn_and_the_next_turn_runs(
    db_ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MODEL_RETRIES", "2")
    fake_model.push(server_error(500, times=3), server_error(503, times=1))
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first", input_id="q1")
    await sessions.admit(db, "s1", "second", input_id="q2")
    await _executor(db_ctx).run()
    failed, ok = await _replies(db)
    assert failed["status"] == "error" and failed["answers"] == ["q1"]
    assert failed["error"]["class"] == "server_error" and "gave up after 3 attempts" in failed["text"]
    assert ok["status"] == "completed" and ok["answers"] == ["q2"]  # no hold: the session goes on
    assert [c[0] for c in await _calls(db)] == ["server_error"] * 4 + ["ok"]
    assert await db.scalar("SELECT held_at FROM session") is None
    assert await _violations(db) == []


async def test_a_refused_connection_is_retried_then_the_turn_fails(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("REM_MODEL_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens on port 9
    monkeypatch.setenv("REM_MODEL_RETRIES", "1")
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "anyone there?", input_id="q1")
    await _executor(db_ctx).run()
    (reply,) = await _replies(db)
    assert reply["status"] == "error" and reply["error"]["class"] == "connection"
    assert "Connect" in reply["text"] and "gave up after 2 attempts" in reply["text"]
    assert [c[:2] for c in await _calls(db)] == [("connection", 1), ("connection", 2)]
    failed = json.loads((await db.fetchone("SELECT data FROM event WHERE kind = 'execution.failed'"))[0])
    assert failed["class"] == "connection"


@pytest.mark.parametrize(
    ("scenario", "error_class", "named"),
    [(bad_api_key(), "auth", "invalid_api_key"), (unknown_model(), "not_found", "model_not_found")],
)
async def test_a_bad_key_or_model_ends_the_turn_and_holds_the_session_until_resumed(
    db_ctx: Context, fake_model: FakeOpenAIServer, scenario: Scenario, error_class: str, named: str
) -> None:
    fake_model.push(scenario)
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "What broke?", input_id="q1")
    await sessions.admit(db, "s1", "And why?", input_id="q2")
    await _executor(db_ctx).run()
    (reply,) = await _replies(db)
    assert reply["status"] == "error" and reply["error"]["class"] == error_class
    assert named in reply["text"] and "rem resume s1" in reply["text"]
    assert len(fake_model.requests()) == 1  # never retried
    held = await db.fetchone("SELECT held_at, held_reason FROM session")
    assert held["held_at"] and held["held_reason"].startswith(error_class)
    assert await db.scalar("SELECT wake_pending FROM session_input WHERE id = 'q2'") == 0
    await sessions.admit(db, "s1", "Still there?", input_id="q3")  # admitted asleep while held
    assert await db.scalar("SELECT wake_pending FROM session_input WHERE id = 'q3'") == 0
    await _executor(db_ctx).run()
    assert len(fake_model.requests()) == 1 and len(await _replies(db)) == 1  # no hot loop
    status = await ops.status(db_ctx)
    assert [h["session_id"] for h in status["backlog"]["held"]] == ["s1"]
    assert status["backlog"]["held"][0]["error_class"] == error_class

    result = await ops.resume(db_ctx, ["s1"])
    assert result["resumed"][0]["reasked"] == ["q1.retry1"] and result["resumed"][0]["inputs_woken"] == 2
    await _executor(db_ctx).run()
    replies = await _replies(db)
    assert [r["status"] for r in replies] == ["error", "completed", "completed", "completed"]
    assert [r["answers"] for r in replies[1:]] == [["q2"], ["q3"], ["q1.retry1"]]
    event = json.loads((await db.fetchone("SELECT data FROM event WHERE kind = 'operator.resume'"))[0])
    assert event["held_reason"].startswith(error_class)
    with pytest.raises(Refused, match="not held"):
        await ops.resume(db_ctx, ["s1"])
    assert await _violations(db) == []


@pytest.mark.parametrize(
    ("scenario", "error_class"),
    [
        (drop(after=3, reply=REPLY), "stream_dropped"),
        (drop(after=3, mode="rst", reply=REPLY), "stream_dropped"),
        (malformed(after=3, reply=REPLY), "stream_malformed"),
        (stall(after=3, reply=REPLY), "stream_stalled"),
    ],
    ids=["drop-fin", "drop-rst", "malformed", "stall"],
)
async def test_a_stream_broken_mid_reply_is_reasked_with_the_partial_text_marked_interrupted(
    db_ctx: Context,
    fake_model: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    scenario: Scenario,
    error_class: str,
) -> None:
    monkeypatch.setenv("REM_MODEL_READ_TIMEOUT_MS", "500")
    fake_model.push(scenario)
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Why did the export stall?", input_id="q1")
    await _executor(db_ctx).run()
    broken, fresh = await _replies(db)
    partial = "The ledger export"  # the three tokens sent before the fault
    assert broken["status"] == "interrupted" and broken["error"]["class"] == error_class
    assert broken["text"] == partial and "".join(await _parts(db, broken["id"])) == partial
    assert fresh["status"] == "completed" and fresh["text"] == REPLY and fresh["reask"] == error_class
    assert (
        broken["answers"] == fresh["answers"] == ["q1"]
    )  # answered once: the interrupted row is not a reply
    reasked = fake_model.requests()[1].messages
    assert reasked[-2] == {"role": "assistant", "content": partial}
    assert reasked[-1]["content"] == INTERRUPTED_NOTE.format(reason=error_class.replace("_", " "))
    assert [c[0] for c in await _calls(db)] == [error_class, "ok"]
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.interrupted'") == 1
    assert await _violations(db) == []


async def test_a_stream_that_keeps_breaking_ends_as_an_error_reply(
    db_ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_MODEL_RETRIES", "1")
    fake_model.push(drop(after=2, times=2))
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "try me", input_id="q1")
    await _executor(db_ctx).run()
    assert [r["status"] for r in await _replies(db)] == ["interrupted", "error"]
    assert await _violations(db) == []


async def test_a_stream_longer_than_the_lease_keeps_it_and_writes_a_few_parts_a_second(
    db_ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_STREAM_FLUSH_MS", "100")
    words = " ".join(f"w{i}" for i in range(120))
    fake_model.set_default(Scenario(reply=words, tokens_per_second=60))  # ~2 s of streaming
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "stream a long one", input_id="q1")
    executor = _executor(db_ctx, lease_ms=900)  # renewed every 300 ms
    await executor.run()
    (reply,) = await _replies(db)
    assert reply["status"] == "completed" and reply["text"] == words and reply["epoch"] == 1
    parts = await _parts(db, reply["id"])
    assert "".join(parts) == words
    # 120 deltas over ~2 s, coalesced: a handful of parts a second, not one per token
    assert 8 <= len(parts) <= 40, len(parts)
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.taken_over'") == 0
    lag = sorted(executor.stream_stats.lag_s)
    assert len(lag) == 120 and lag[len(lag) // 2] < 0.5


async def test_a_stalled_stream_still_flushes_what_arrived(
    db_ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_STREAM_FLUSH_MS", "100")
    fake_model.set_default(Scenario(reply=REPLY, stall_after=2, stall_seconds=30))
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "stall after two", input_id="q1")
    task = asyncio.create_task(_executor(db_ctx).run())
    try:
        # the two deltas are durable while the model is silent: the flush timer does not wait for a third
        text = await await_until(
            lambda: db.scalar("SELECT group_concat(json_extract(data, '$.text'), '') FROM session_part"),
            timeout=10,
            message="the parts before the stall",
        )
        assert text == "The ledger"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_api_key_is_sent_but_never_stored_or_logged(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-test-DO-NOT-LEAK-1234567890"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    with FakeOpenAIServer(Scenario(reply=REPLY), api_key="sk-the-right-one") as server:
        monkeypatch.setenv("REM_MODEL_BASE_URL", server.base_url)
        monkeypatch.setenv("REM_MODEL", "gpt-4o-mini")
        monkeypatch.setenv("REM_MODEL_API_KEY_FILE", str(key_file))
        db = await db_ctx.db()
        await sessions.admit(db, "s1", "hello", input_id="q1")
        await _executor(db_ctx).run()
        assert server.requests()[0].api_key == key
    (reply,) = await _replies(db)
    assert reply["error"]["class"] == "auth"
    await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    assert key.encode() not in db_ctx.data.state_db.read_bytes()
    assert key not in caplog.text
    key_file.chmod(0o644)
    with pytest.raises(Exception, match="chmod 600"):
        OpenAIAgent()


async def test_a_key_echoed_with_its_end_starred_leaves_no_run_of_it_anywhere(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-proj-Zq81vLmR4tYw0Ne7HcXb2Ks9"
    echoed = key[:-4] + "****"  # what some endpoints print back: all but the last 4 characters
    with FakeOpenAIServer(Scenario(reply=REPLY)) as server:
        server.push(bad_api_key(error_message=f"Incorrect API key provided: {echoed}. Check it."))
        monkeypatch.setenv("REM_MODEL_BASE_URL", server.base_url)
        monkeypatch.setenv("REM_MODEL", "gpt-4o-mini")
        monkeypatch.setenv("REM_MODEL_API_KEY", key)
        db = await db_ctx.db()
        await sessions.admit(db, "s1", "hello", input_id="q1")
        await _executor(db_ctx).run()
        assert server.requests()[0].api_key == key
    (reply,) = await _replies(db)
    held = await db.scalar("SELECT held_reason FROM session")
    assert reply["error"]["class"] == "auth" and "Incorrect API key provided: ***" in reply["text"]
    assert held.startswith("auth") and "***" in held
    await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    stored = db_ctx.data.state_db.read_bytes()
    for run in {key[i : i + 8] for i in range(len(key) - 7)}:  # event rows, reply, held_reason
        assert run.encode() not in stored and run not in caplog.text, run


async def test_rem_check_verifies_the_totals_against_the_replies_usage(
    db_ctx: Context, fake_model: FakeOpenAIServer
) -> None:
    fake_model.set_default(Scenario(reply=REPLY, prompt_tokens=500, cached_tokens=100))
    db = await db_ctx.db()
    for i in range(3):
        await sessions.admit(db, "s1", f"question {i}", input_id=f"q{i}")
    await _executor(db_ctx).run()
    report = await ops.check(db_ctx, verify_chroma=False)
    assert report["ok"] and "usage" in report["checked"]
    assert await db.scalar("SELECT tokens_input FROM session") == 3 * 400
    async with db.tx() as conn:  # a reply's usage counted twice: what the same-transaction rule prevents
        await conn.execute("UPDATE session SET tokens_input = tokens_input + 400")
    report = await ops.check(db_ctx, verify_chroma=False)
    (finding,) = [v for v in report["violations"] if v["invariant"] == "usage"]
    assert finding["rows"][0]["session_id"] == "s1" and finding["rows"][0]["tokens_input"] == 1600


def test_every_error_class_has_exactly_one_outcome() -> None:
    # retried, re-asked, held for an operator, or failed at once: never two of these, never none
    from backend.models.errors import INTERRUPTED, NEEDS_OPERATOR, RETRYABLE, ModelErrorClass

    fail_at_once = {ModelErrorClass.BAD_REQUEST, ModelErrorClass.BAD_OUTPUT}
    groups = [RETRYABLE, INTERRUPTED, NEEDS_OPERATOR, fail_at_once]
    assert sum(len(g) for g in groups) == len(ModelErrorClass)
    assert set().union(*groups) == set(ModelErrorClass)
