"""`rem check`'s tools family (invariant 10) over calls written by the executor's own functions,
then damaged: a result on a running row, a finished row without one, two rows for one step index,
a result under no lease or an epoch never granted, an effect started twice without a retry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.execution import leases, tool_calls
from backend.execution.tool_calls import Outcome, PlannedCall
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState

pytestmark = pytest.mark.both_stores

DONE = Outcome(state=ToolCallState.COMPLETED, result="ok", is_error=False)
LOST = Outcome(state=ToolCallState.UNKNOWN, result=None, is_error=False, reason="executor died")


def _planned(idx: int, effect: str) -> PlannedCall:
    return PlannedCall(
        idx=idx,
        model_call_id=f"m{idx}",
        tool="demo.outbox_send" if effect == "effect" else "demo.notes_search",
        arguments=json.dumps({"n": idx}),
        effect=effect,
        effect_source="annotation",
        permission="allow",
        state=ToolCallState.PENDING,
    )


async def _turn(db: Database, outcomes: list[tuple[str, Outcome]]) -> tuple[leases.Lease, list[str]]:
    """A session whose turn ran one call per (effect, outcome), through the executor's writes."""
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s1', ?, ?)", (now, now)
        )
    lease = await leases.claim(db, "s1", "executor-x", length_ms=60_000)
    assert lease is not None

    def write(conn: Any) -> list[str]:
        guard_sync(conn, lease, now=now)
        planned = [_planned(i, effect) for i, (effect, _) in enumerate(outcomes)]
        ids = tool_calls.insert_sync(conn, lease, 1, f"{lease.execution_id}:1", planned, now)
        tool_calls.start_sync(conn, lease, ids, now)
        for cid, (_, outcome) in zip(ids, outcomes, strict=True):
            tool_calls.finish_sync(conn, lease, cid, outcome, now)
        return ids

    return lease, await db.write_in_thread(write)


def _found(result: dict[str, Any], what: str) -> list[str]:
    return [
        r.get("call_id") or r.get("calls")
        for f in result["violations"] + result["unsettled"]
        if f["what"] == what
        for r in f["rows"]
    ]


async def test_calls_the_executor_finished_pass_settled_and_damage_is_named(db_ctx: Context) -> None:
    db = await db_ctx.db()
    _lease, (read, sent, other) = await _turn(db, [("read", DONE), ("effect", DONE), ("read", DONE)])
    clean = await ops.check(db_ctx)
    assert "tool calls" in clean["checked"] and not [
        f for f in clean["violations"] if f["invariant"] == "10"
    ], clean["violations"]

    async with db.tx() as conn:
        await conn.execute("UPDATE tool_call SET state = 'running' WHERE id = ?", (read,))  # result kept
        await conn.execute("UPDATE tool_call SET result = NULL WHERE id = ?", (other,))
        await conn.execute("UPDATE tool_call SET epoch = epoch + 5 WHERE id = ?", (sent,))
    damaged = await ops.check(db_ctx)
    assert _found(damaged, "tool calls not finished that hold a result") == [read]
    assert _found(damaged, "finished tool calls without a result") == [other]
    assert _found(damaged, "tool call results not fenced by a lease their execution held") == [sent]
    assert _found(damaged, "tool calls in flight") == [read]


async def test_an_effect_started_twice_needs_the_operators_journaled_retry(db_ctx: Context) -> None:
    db = await db_ctx.db()
    _lease, (sent,) = await _turn(db, [("effect", LOST)])
    waiting = await ops.check(db_ctx)
    assert _found(waiting, "tool calls waiting for an operator") == [sent]
    # a second start the journal does not explain: the row's own retries counter is not enough
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE tool_call SET starts = 2, retries = 1, state = 'completed', result = 'sent' WHERE id = ?",
            (sent,),
        )
    twice = await ops.check(db_ctx)
    assert _found(twice, "effect tool calls started more often than the journal's retries allow") == [sent]
    # the operator's retry, journaled by the real decision, allows exactly one more start
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE tool_call SET starts = 1, retries = 0, state = 'unknown', result = NULL WHERE id = ?",
            (sent,),
        )
    await ops.resolve(db_ctx, sent, "retry")
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE tool_call SET starts = 2, state = 'completed', result = 'sent' WHERE id = ?", (sent,)
        )
    retried = await ops.check(db_ctx)
    assert not _found(retried, "effect tool calls started more often than the journal's retries allow")
    async with db.tx() as conn:
        await conn.execute("UPDATE tool_call SET starts = 3 WHERE id = ?", (sent,))
    thrice = await ops.check(db_ctx)
    assert _found(thrice, "effect tool calls started more often than the journal's retries allow") == [sent]


async def test_two_rows_for_one_step_index_are_named(db_ctx: Context) -> None:
    db = await db_ctx.db()
    _lease, (first,) = await _turn(db, [("read", DONE)])
    async with db.tx() as conn:  # the unique index lost (a damaged or hand-edited store)
        await conn.execute("DROP INDEX tool_call_execution_step_idx_idx")
        await conn.execute(
            "INSERT INTO tool_call (id, session_id, execution_id, message_id, step, idx, model_call_id, tool, "
            "arguments, effect, effect_source, permission, state, idempotency_key, owner_id, epoch, result, "
            "time_created, time_updated) SELECT 'call_twin', session_id, execution_id, message_id, step, idx, "
            "model_call_id, tool, arguments, effect, effect_source, permission, state, idempotency_key, "
            "owner_id, epoch, result, time_created, time_updated FROM tool_call WHERE id = ?",
            (first,),
        )
    result = await ops.check(db_ctx)
    (row,) = [
        r for f in result["violations"] if f["what"] == "two tool calls for one step index" for r in f["rows"]
    ]
    assert sorted(str(row["calls"]).split(",")) == sorted([first, "call_twin"]) and row["rows"] == 2
