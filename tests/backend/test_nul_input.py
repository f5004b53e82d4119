"""An input holding NUL (U+0000) gets exactly one reply, the same on both stores.

PostgreSQL's `text` cannot hold NUL, and a JSON document holding its `\\u0000` escape cannot be
read by `jsonb`, which rem's SQL does on its transcript rows (`json_extract(data, '$.status')`,
the same statement on both engines): on PostgreSQL such a turn failed at every attempt (an agent
reading history, a takeover) until the recovery budget parked it. A NUL from outside (`rem send`,
`rem import`, MCP's `add_memory`, the API: all admit through `sessions.admit` or the importer) is
kept as U+FFFD on both stores, as a NUL from a model already was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.execution import importer, sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context

pytestmark = pytest.mark.both_stores

TEXT = "why does nul\x00 here, tab\t bell\x07 esc\x1b[2J del\x7f break the turn?"
KEPT = TEXT.replace("\x00", "\ufffd")


class HistoryResponder(OfflineResponder):
    """The offline agent, reading earlier messages as a model agent does (`history_messages`)."""

    history_messages = 10


async def _transcript(ctx: Context, session_id: str) -> list[tuple[str, dict[str, object]]]:
    db = await ctx.db()
    rows = await db.fetchall(
        "SELECT type, data FROM session_message WHERE session_id = ? ORDER BY seq", (session_id,)
    )
    return [(row[0], json.loads(row[1])) for row in rows]


async def test_an_input_holding_nul_gets_exactly_one_reply_on_either_store(db_ctx: Context) -> None:
    db = await db_ctx.db()
    admitted = await sessions.admit(db, "s1", TEXT, input_id="in-nul")
    again = await sessions.admit(db, "s1", TEXT, input_id="in-nul")  # idempotent, NUL and all
    assert again["input_id"] == admitted["input_id"] == "in-nul"
    await sessions.admit(db, "s1", "and a plain one after it?", input_id="in-plain")
    executor = Executor(db_ctx, once=True, agent=HistoryResponder(delay_ms=0), concurrency=2)
    assert await executor.run() == 0
    assert executor.turns_completed == 2
    messages = await _transcript(db_ctx, "s1")
    users = [data for kind, data in messages if kind == "user"]
    replies = [data for kind, data in messages if kind == "assistant"]
    assert [(u["input_id"], u["text"]) for u in users] == [
        ("in-nul", KEPT),
        ("in-plain", "and a plain one after it?"),
    ]
    assert [(r["status"], r["answers"]) for r in replies] == [
        ("completed", ["in-nul"]),
        ("completed", ["in-plain"]),
    ]
    assert KEPT[:20] in str(replies[0]["text"])  # the reply quotes the question as stored
    prompt = await db.scalar("SELECT prompt FROM session_input WHERE id = 'in-nul'")
    assert json.loads(prompt)["text"] == KEPT
    trouble = await db.scalar(
        "SELECT count(*) FROM event WHERE kind IN ('execution.failed', 'execution.lease_lost', 'execution.taken_over')"
    )
    assert (trouble, await db.scalar("SELECT count(*) FROM session_recovery")) == (0, 0)


async def test_an_imported_message_holding_nul_is_kept_and_answered_after(
    db_ctx: Context, tmp_path: Path
) -> None:
    lines = tmp_path / "import.jsonl"
    rows = [
        {"session": "s2", "id": "m1", "role": "user", "speaker": "A\x00na", "text": TEXT, "time": 1},
        {"session": "s2", "id": "m2", "role": "assistant", "text": "a reply with nul\x00 too", "time": 2},
    ]
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    db = await db_ctx.db()
    report = await importer.import_file(db, lines)
    assert (report["written"], report["already_imported"]) == (2, 0), report
    again = await importer.import_file(db, lines)  # the same import again (NUL and all): nothing new
    assert (again["written"], again["already_imported"]) == (0, 2), again
    await sessions.admit(db, "s2", "what did we say?", input_id="in-after")
    executor = Executor(db_ctx, once=True, agent=HistoryResponder(delay_ms=0), concurrency=1)
    assert await executor.run() == 0 and executor.turns_completed == 1
    messages = await _transcript(db_ctx, "s2")
    assert [data["text"] for _, data in messages[:2]] == [KEPT, "a reply with nul\ufffd too"]
    assert messages[0][1]["speaker"] == "A\ufffdna"
    assert messages[-1][0] == "assistant" and messages[-1][1]["status"] == "completed"
    assert messages[-1][1]["answers"] == ["in-after"]
