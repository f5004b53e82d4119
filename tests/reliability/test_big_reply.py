"""A 50 MB model reply against real daemons: every process stays within a memory bound.

The scripted endpoint (tests/fake_openai.py) answers the executor's stream
and the summarizer's first request with a 50 MB reply. Each daemon runs once
(`rem daemon --role X --once`) as a real process, and its peak resident set
(`ru_maxrss` from `wait4`, the kernel's own high-water mark) must stay under
`RSS_BOUND_MB` (300 MB). Before the bounds, the executor stored the reply whole and
Dream's embedder asked numpy for gigabytes (22 GB, then the OOM killer).

* the executor stops reading at `REM_MODEL_REPLY_MAX_CHARS` (1 000 000): the
  turn completes, marked truncated, with an `execution.truncated` event;
* the summarizer refuses a reply over `REM_SUMMARY_REPLY_MAX_CHARS` unread
  (`summary.failed`, bad_output), then summarizes on its retry;
* Dream reads at most `REM_TURN_READ_MAX_CHARS` of the 1 000 000-character
  turn, embeds at most `REM_EMBED_MAX_TOKENS` tokens of it, and completes the
  revision the summarizer published, which covers the whole turn.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backend.core.settings import Settings
from backend.store.revision import compute_revision
from tests.fake_openai import FakeOpenAIServer, Scenario
from tests.helpers import REM, rem_env, run_rem, wait_until

REPLY_BYTES = 50 * 1024 * 1024
# the peak resident set any one daemon may reach: each peaked at 196-207 MB here (185-192 MB
# with a 200-byte reply instead: the Python runtime, the SDKs, WordLlama's table); one that
# held the 50 MB reply would be far above it, and Dream embedding it whole reached 22 GB
RSS_BOUND_MB = 300
SUMMARY = {
    "title": "A very long answer",
    "category": "general",
    "keywords": ["long"],
    "summary": "It was long.",
}


# A small parent that runs the daemon and reports its peak RSS from wait4. Measured from the
# test process itself, ru_maxrss would count the test's own pages: a forked child's maximum
# starts at its parent's resident set, and this test holds the 50 MB reply.
PEAK_RSS = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:], stderr=subprocess.STDOUT)\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(usage.ru_maxrss, file=sys.stderr)\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def _measured(args: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    """Run `rem ARGS` to its end: (exit code, peak RSS in MB of that process)."""
    with log.open("wb") as out:
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, REM, *args],
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
            timeout=300,
        )
    peak_kib = int(proc.stderr.decode().strip().splitlines()[-1])
    return proc.returncode, peak_kib / 1024


def _rows(data: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{data / 'state.db'}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _events(data: Path, kind: str) -> list[dict[str, Any]]:
    return [
        json.loads(r[0]) for r in _rows(data, "SELECT data FROM event WHERE kind = ? ORDER BY id", (kind,))
    ]


def test_a_50_mb_reply_is_bounded_in_the_executor_summarizer_and_dream(
    tmp_path: Path, chroma_url: str, collection: str
) -> None:
    words = "all work and no play makes the reply a very long one "
    big = words * (REPLY_BYTES // len(words))
    data = tmp_path / "data"
    with FakeOpenAIServer(Scenario(reply=json.dumps(SUMMARY))) as server:
        server.push(
            Scenario(reply=big, chunking="chars", chunk_chars=65_536, path="/v1/chat/completions", times=2)
        )
        env = rem_env(
            REM_AGENT="openai",
            REM_SYNTHESIZER="openai",
            REM_MODEL="gpt-4o-mini",
            REM_MODEL_BASE_URL=server.base_url,
            REM_CHROMA_URL=chroma_url,
            REM_CHROMA_COLLECTION=collection,
        )
        assert run_rem("send", "big", "Tell me everything.", "--data", str(data), env=env).returncode == 0
        peaks = {}
        code, peaks["executor"] = _measured(
            ["daemon", "--role", "executor", "--once", "--data", str(data)], env, tmp_path / "executor.log"
        )
        assert code == 0, (tmp_path / "executor.log").read_text()[-2000:]
        (reply,) = [
            json.loads(r[0]) for r in _rows(data, "SELECT data FROM session_message WHERE type = 'assistant'")
        ]
        limit = Settings.model_reply_max_chars.default
        assert reply["status"] == "completed" and reply["truncated"] is True
        assert reply["finish_reason"] == "truncated" and reply["text"] == big[:limit]
        parts = _rows(data, "SELECT data FROM session_part ORDER BY idx")
        assert "".join(json.loads(p[0])["text"] for p in parts) == big[:limit]
        (truncated,) = _events(data, "execution.truncated")
        assert truncated["chars"] == limit and truncated["setting"] == "REM_MODEL_REPLY_MAX_CHARS"

        # the summarizer: its first request gets the 50 MB reply (refused unread), its retry the summary
        code, peaks["summarizer"] = _measured(
            ["daemon", "--role", "summarizer", "--once", "--data", str(data)],
            env,
            tmp_path / "summarizer.log",
        )
        assert code == 0, (tmp_path / "summarizer.log").read_text()[-2000:]
        (failed,) = _events(data, "summary.failed")
        assert failed["class"] == "bad_output" and "it was not read" in failed["error"]
        (retry_at,) = _rows(data, "SELECT lease_expires_at FROM summary_job WHERE session_id = 'big'")
        wait_until(lambda: time.time() * 1000 > retry_at[0], timeout=30, message="the summary's retry time")
        code, peak = _measured(
            ["daemon", "--role", "summarizer", "--once", "--data", str(data)],
            env,
            tmp_path / "summarizer2.log",
        )
        assert code == 0 and _events(data, "summary.completed"), (tmp_path / "summarizer2.log").read_text()[
            -2000:
        ]
        peaks["summarizer"] = max(peaks["summarizer"], peak)

    code, peaks["dream"] = _measured(
        ["daemon", "--role", "dream", "--once", "--data", str(data)], env, tmp_path / "dream.log"
    )
    assert code == 0, (tmp_path / "dream.log").read_text()[-2000:]
    prompt = json.loads(_rows(data, "SELECT data FROM session_message WHERE type = 'user'")[0][0])
    turns = [
        {"id": r["id"], "role": r["type"], "text": json.loads(r["data"])["text"], "time": r["time_created"]}
        for r in _rows(data, "SELECT id, type, data, time_created FROM session_message")
    ]
    assert prompt["text"] == "Tell me everything." and len(turns) == 2
    (state,) = _rows(data, "SELECT input_revision, completed_revision, indexed_revision FROM dream_state")
    # the revision covers the whole 1 000 000-character turn, though Dream read it in pieces
    assert state["input_revision"] == compute_revision(turns)
    assert state["completed_revision"] == state["input_revision"] == state["indexed_revision"]
    assert _rows(data, "SELECT count(*) FROM memory_turn WHERE vector_digest = digest")[0][0] == 2
    print("peak RSS (MB):", {role: round(mb) for role, mb in peaks.items()})
    assert all(mb < RSS_BOUND_MB for mb in peaks.values()), peaks
