"""Memory in the agent's context: recalled for each step, recorded with it, reused by a recovered step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.core import clock, faults
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.execution.openai_agent import MEMORY_HEADER, OpenAIAgent
from backend.runtime.context import Context
from tests.backend.test_recall import settle, write_jsonl
from tests.fake_openai import FakeOpenAIServer

LEASE = 2_000


async def _assistants(ctx: Context, sid: str) -> list[dict[str, Any]]:
    db = await ctx.db()
    rows = await db.fetchall(
        "SELECT id, data FROM session_message WHERE session_id = ? AND type = 'assistant' ORDER BY seq",
        (sid,),
    )
    return [{"id": r[0], **json.loads(r[1])} for r in rows]


async def _ready(ctx: Context, tmp_path: Path) -> None:
    await ops.import_file(ctx, write_jsonl(tmp_path / "chats.jsonl"))
    await settle(ctx)


async def test_a_step_is_given_its_projects_memory_and_records_it(ctx: Context, tmp_path: Path) -> None:
    await _ready(ctx, tmp_path)
    db = await ctx.db()
    await sessions.admit(db, "new", "How is the dog doing on the beach?", input_id="q1", project="ops")
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
    [reply] = await _assistants(ctx, "new")
    memory = reply["memory"]
    assert memory["project"] == "ops" and memory["items"], memory
    assert memory["items"][0]["id"] == "p-1" and memory["items"][0]["speaker"] == "Maya"
    assert all(i["session_id"] != "home" for i in memory["items"])  # another project's memory stays out
    assert sum(len(i["text"]) for i in memory["items"]) <= 2000
    assert 'From memory (Maya in session pets): "My dog Biscuit loves running' in reply["text"]
    shown = await ops.show_session(ctx, "new")
    assert shown["messages"][-1]["data"]["memory"] == memory  # what an operator sees
    transcript = await ops.show(ctx, "new")  # `rem show`
    assert transcript["session"]["project"] == "ops"
    assert transcript["messages"][-1]["memory"] == memory


async def test_the_sessions_own_recent_turns_are_left_out(ctx: Context, tmp_path: Path) -> None:
    await _ready(ctx, tmp_path)
    db = await ctx.db()
    await sessions.admit(db, "pets", "Tell me again about the beach.", input_id="q1")
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
    reply = (await _assistants(ctx, "pets"))[-1]  # the imported reply p-2 comes first
    assert reply["memory"]["items"]
    assert all(i["session_id"] != "pets" or i["kind"] != "turn" for i in reply["memory"]["items"])


async def test_a_recovered_step_reuses_the_memory_it_was_given(
    ctx: Context, tmp_path: Path, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _ready(ctx, tmp_path)
    db = await ctx.db()
    await sessions.admit(db, "new", "What did Ravi bake?", input_id="q1", project="ops")
    monkeypatch.setenv("REM_FAULTS", "executor.mid_stream=raise")
    faults.reset()
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=60), lease_ms=LEASE).run()
    [interrupted] = await _assistants(ctx, "new")
    assert interrupted["status"] == "streaming" and interrupted["memory"]["items"][0]["id"] == "f-1"
    monkeypatch.delenv("REM_FAULTS")
    faults.reset()
    # memory changes meanwhile: a fresh recall would now give another answer first
    extra = [
        {
            "project": "ops",
            "session": "bakery",
            "id": "b-1",
            "role": "user",
            "speaker": "Ravi",
            "text": "Ravi baked a cake, sourdough bread and rye rolls; Ravi bakes every day.",
            "time": 5,
        }
    ]
    await ops.import_file(ctx, write_jsonl(tmp_path / "more.jsonl", extra))
    await settle(ctx)
    fresh = await ops.recall(ctx, "What did Ravi bake?", project="ops", k=5)
    assert fresh["items"][0]["id"] != interrupted["memory"]["items"][0]["id"] or len(fresh["items"]) != len(
        interrupted["memory"]["items"]
    )
    frozen_clock.advance(LEASE)
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
    old, recovered = await _assistants(ctx, "new")
    assert old["status"] == "superseded" and recovered["status"] == "completed"
    assert recovered["memory"] == {**interrupted["memory"], "reused": True}
    assert "I baked sourdough bread" in recovered["text"]


async def test_the_model_agent_is_sent_the_recalled_memory_with_its_provenance(
    ctx: Context, tmp_path: Path, fake_model: FakeOpenAIServer
) -> None:
    await _ready(ctx, tmp_path)
    db = await ctx.db()
    await sessions.admit(db, "new", "How is the dog doing on the beach?", input_id="q1", project="ops")
    await Executor(ctx, once=True, agent=OpenAIAgent(), lease_ms=LEASE).run()
    [reply] = await _assistants(ctx, "new")
    items = reply["memory"]["items"]
    assert items and items[0]["id"] == "p-1"
    sent = fake_model.requests()[0].messages
    assert [m["role"] for m in sent] == ["system", "system", "user"]
    lines = sent[1]["content"].splitlines()
    assert lines[0] == MEMORY_HEADER and len(lines) == 1 + len(items)  # every recalled item, in order
    assert lines[1] == f"- [turn, Maya, session pets] {items[0]['text']}"
    assert "My dog Biscuit loves running" in lines[1]


class InternalError(Exception):
    """Named as chromadb names the error of a search made before a new collection's index is written."""


@pytest.mark.parametrize(
    "message",
    [
        "Error executing plan: Error creating hnsw segment reader: Nothing found on disk",
        "Error executing plan: Internal error: Error finding id",  # the same window (CI, 2026-12-07)
    ],
)
async def test_a_search_before_chromas_index_is_written_degrades_recall_and_the_turn_goes_on(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    """Chroma answers a search made moments after a new collection's first writes with an
    InternalError ("Nothing found on disk", or "Error finding id"): recall reports the dense side
    degraded and answers from the rest, and a step's memory never fails the user's turn."""
    await _ready(ctx, tmp_path)
    store = ctx.turn_store("ops")
    await store.count()  # connected: its collection object is the one to break

    def not_ready(*args: Any, **kwargs: Any) -> Any:
        raise InternalError(message)

    monkeypatch.setattr(type(store._collection), "query", not_ready)
    result = await ops.recall(ctx, "dog on the beach", project="ops")
    assert any(d.startswith("dense:") and "index is still being written" in d for d in result["degraded"]), (
        result
    )
    assert result["items"], result  # answered lexically

    db = await ctx.db()
    await sessions.admit(db, "new", "How is the dog doing on the beach?", input_id="q1", project="ops")
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
    [reply] = await _assistants(ctx, "new")
    assert reply["status"] == "completed" and reply["answers"] == ["q1"]


async def test_an_unknown_error_in_recall_is_recorded_with_the_step_not_made_the_agents_failure(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend.memory import recall as memory_recall

    await _ready(ctx, tmp_path)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise InternalError("something Chroma said that rem does not know")

    monkeypatch.setattr(memory_recall, "recall", broken)
    db = await ctx.db()
    await sessions.admit(db, "new", "How is the dog doing on the beach?", input_id="q1", project="ops")
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
    [reply] = await _assistants(ctx, "new")
    assert reply["status"] == "completed" and reply["answers"] == ["q1"]
    assert reply["memory"] == {
        "items": [],
        "error": "InternalError: something Chroma said that rem does not know",
    }


async def test_a_steps_memory_costs_no_write_transaction_of_its_own(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recalled ahead for the inputs the step promotes, the memory is written by the transaction
    that opens the step: a turn with memory takes as many write transactions as one without."""
    await _ready(ctx, tmp_path)
    db = await ctx.db()
    writes: list[object] = []
    original = db.write_in_thread

    async def counted(fn: Any, **lane: Any) -> Any:
        writes.append(fn)
        return await original(fn, **lane)

    monkeypatch.setattr(db, "write_in_thread", counted)

    async def turn_writes(session_id: str) -> int:
        writes.clear()
        await sessions.admit(db, session_id, "How is the dog doing on the beach?", project="ops")
        await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE).run()
        return len(writes)

    monkeypatch.setenv("REM_MEMORY_CONTEXT_ITEMS", "0")
    without = await turn_writes("plain")
    [plain] = await _assistants(ctx, "plain")
    assert "memory" not in plain
    monkeypatch.delenv("REM_MEMORY_CONTEXT_ITEMS")
    with_memory = await turn_writes("remembers")
    [reply] = await _assistants(ctx, "remembers")
    assert reply["memory"]["items"][0]["id"] == "p-1"
    assert with_memory == without, (with_memory, without)
