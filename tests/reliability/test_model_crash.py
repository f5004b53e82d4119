"""Real executor processes on a real (scripted) model endpoint, SIGKILLed mid-stream.

Each scripted behaviour of the endpoint (a slow stream, a stall, a dropped
connection, 429 with Retry-After, 500s, a malformed chunk, 401) runs
through `rem daemon --role executor` with `REM_AGENT=openai`; the executor
is SIGKILLed while a reply streams, a second executor takes the turn over
through the normal recovery path and re-asks the model with the partial
reply marked interrupted. Afterwards: exactly one completed reply per
promoted input, `rem check` clean, and the session's token totals equal the
usage the server reported for the reply that was kept.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fake_openai import (
    FakeOpenAIServer,
    Scenario,
    bad_api_key,
    drop,
    malformed,
    prompt_token_count,
    rate_limited,
    server_error,
    stall,
    tokenize,
)
from tests.helpers import rem_env, rem_json, run_rem, spawn_rem, wait_until

LEASE_MS = 1500
REPLY = " ".join(
    "The nightly ledger export stalled because PgBouncer recycled its pool while the export "
    "window was open, so every retry queued behind the same dead connection until the window closed".split()
)
CACHED = 4


def _env(server: FakeOpenAIServer, **extra: str) -> dict[str, str]:
    return rem_env(
        REM_AGENT="openai",
        REM_MODEL="gpt-4o-mini",
        REM_MODEL_BASE_URL=server.base_url,
        REM_MODEL_READ_TIMEOUT_MS="1000",
        REM_EXECUTION_LEASE_MS=str(LEASE_MS),
        REM_STREAM_FLUSH_MS="50",
        REM_CHROMA_AUTOSTART="0",
        REM_LOG="1",
        **extra,
    )


def _rows(data: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(data / "state.db", timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _replies(data: Path) -> list[dict[str, Any]]:
    rows = _rows(data, "SELECT id, data FROM session_message WHERE type = 'assistant' ORDER BY seq")
    return [{"id": r[0], **json.loads(r[1])} for r in rows]


def _parts(data: Path, message_id: str) -> str:
    rows = _rows(data, "SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (message_id,))
    return "".join(json.loads(r[0])["text"] for r in rows)


def _streaming_with_parts(data: Path) -> bool:
    return bool(
        _rows(
            data,
            "SELECT 1 FROM session_message AS m JOIN session_part AS p ON p.message_id = m.id "
            "WHERE m.type = 'assistant' AND json_extract(m.data, '$.status') = 'streaming' LIMIT 1",
        )
    )


def _settled(data: Path) -> bool:
    return bool(
        _rows(
            data,
            "SELECT (SELECT count(*) FROM session_execution) = 0 AND (SELECT count(*) FROM session_input "
            "WHERE promoted_seq IS NULL AND wake_pending = 1) = 0 AND EXISTS (SELECT 1 FROM session_message "
            "WHERE type = 'assistant' AND json_extract(data, '$.status') IN ('completed', 'error'))",
        )[0][0]
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _check_clean(data: Path) -> None:
    # no summarizer runs here: summaries still pending are in flight, not violations
    report = rem_json("check", "--data", str(data), env=rem_env(REM_CHROMA_AUTOSTART="0"))
    assert report["ok"] and report["counts"]["violations"] == 0, report


SCRIPTS = {
    "slow-stream": [],
    "stall": [stall(after=6, reply=REPLY)],  # silent until the client goes (it is killed meanwhile)
    "dropped-connection": [drop(after=4, reply=REPLY)],
    "rate-limited": [rate_limited(times=2, retry_after=0.4)],
    "server-errors": [server_error(500, times=2), server_error(502, times=1)],
    "malformed-chunk": [malformed(after=4, reply=REPLY)],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_sigkill_mid_stream_recovers_with_one_completed_reply_and_the_reported_usage(
    tmp_path: Path, script: str
) -> None:
    data = tmp_path / "d"
    slow = Scenario(reply=REPLY, tokens_per_second=25, cached_tokens=CACHED)
    with FakeOpenAIServer(slow) as server:
        env = _env(server)
        assert (
            run_rem(
                "send",
                "s1",
                "Why did the nightly ledger export stall?",
                "--id",
                "q1",
                "--data",
                str(data),
                env=env,
            ).returncode
            == 0
        )
        server.push(*SCRIPTS[script])
        first = spawn_rem(
            "daemon", "--role", "executor", "--data", str(data), env=env, log=tmp_path / "first.log"
        )
        second = None
        try:
            # kill while a reply streams and part of it is durable (for "stall": during the silence)
            wait_until(lambda: _streaming_with_parts(data), timeout=60, message="a reply streaming")
            killed_at = len(server.requests())
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            server.wait_for(killed_at - 1, "finished", timeout=15)
            second = spawn_rem(
                "daemon", "--role", "executor", "--data", str(data), env=env, log=tmp_path / "second.log"
            )
            wait_until(lambda: _settled(data), timeout=60, message="the turn recovered and completed")
        finally:
            for proc in (first, second):
                if proc is not None:
                    _stop(proc)
        requests = server.requests()

    replies = _replies(data)
    completed = [r for r in replies if r["status"] == "completed"]
    assert len(completed) == 1 and completed[0]["answers"] == ["q1"] and completed[0]["text"] == REPLY
    cut = [r for r in replies if r["status"] == "superseded"]
    assert len(cut) == 1 and cut[0]["text"] == _parts(data, cut[0]["id"]) != ""
    assert REPLY.startswith(cut[0]["text"])
    # the continuation re-asked with the durable partial reply, marked interrupted
    last = requests[-1]
    assert last.messages[-2] == {"role": "assistant", "content": cut[0]["text"]}
    assert "cut off (executor stopped)" in last.messages[-1]["content"]
    assert completed[0]["reask"] == "executor_stopped"
    assert len(_rows(data, "SELECT 1 FROM session_message WHERE type = 'synthetic'")) == 1
    # the totals are what the server reported for the reply that was kept (the killed
    # request never reported usage: its stream ended before its usage chunk)
    prompt, completion = prompt_token_count(last.body), len(tokenize(REPLY))
    totals = _rows(data, "SELECT tokens_input, tokens_output, tokens_cache_read FROM session")[0]
    assert tuple(totals) == (prompt - CACHED, completion, CACHED)
    outcomes = [r[0] for r in _rows(data, "SELECT outcome FROM model_call ORDER BY id")]
    # every failed attempt was journaled before the kill; the killed request never finished
    assert outcomes[-1] == "ok" and outcomes.count("ok") == 1
    _check_clean(data)


def test_a_bad_key_holds_the_session_until_an_operator_resumes_it(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with FakeOpenAIServer(Scenario(reply=REPLY)) as server:
        env = _env(server)
        for i, text in enumerate(("What broke?", "And when?"), start=1):
            assert run_rem("send", "s1", text, "--id", f"q{i}", "--data", str(data), env=env).returncode == 0
        server.push(bad_api_key())
        executor = spawn_rem(
            "daemon", "--role", "executor", "--data", str(data), env=env, log=tmp_path / "x.log"
        )
        try:
            wait_until(lambda: _rows(data, "SELECT held_at FROM session")[0][0], timeout=60, message="held")
            status = rem_json("status", "--data", str(data), env=env)
            (held,) = status["backlog"]["held"]
            assert held["session_id"] == "s1" and held["error_class"] == "auth" and held["waiting"] == 1
            assert status["model"]["state"] == "down" and status["model"]["errors_by_class"] == {"auth": 1}
            (reply,) = _replies(data)
            assert reply["status"] == "error" and "invalid_api_key" in reply["text"]
            assert len(server.requests()) == 1  # not retried, not looping
            resumed = run_rem("resume", "s1", "--data", str(data), env=env)
            assert resumed.returncode == 0 and "asked again as q1.retry1" in resumed.stderr
            wait_until(
                lambda: len([r for r in _replies(data) if r["status"] == "completed"]) == 2,
                timeout=60,
                message="the waiting input and the re-asked one answered",
            )
        finally:
            _stop(executor)
    answered = [r["answers"] for r in _replies(data) if r["status"] == "completed"]
    assert sorted(answered) == [["q1.retry1"], ["q2"]]
    model = rem_json("status", "--data", str(data), env=env)["model"]
    # answering again, but the 401 is still in the health window: degraded, no longer down
    assert model["state"] == "degraded" and model["last_error"]["error_class"] == "auth"
    assert (model["requests"], model["errors"]) == (3, 1)
    _check_clean(data)
