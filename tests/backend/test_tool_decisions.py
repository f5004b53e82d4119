"""The operator's decisions on tool calls (`backend.ops.approve|deny|resolve`): each re-checks the
state it acts on, moves the call, journals it in the chained audit journal, and un-parks the turn
once nothing else of it waits; the un-parked turn is taken over without spending the recovery
budget and without a continuation message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.core.errors import NotFound, ReadOnly, Refused
from backend.execution import leases, parking, recovery, tool_calls
from backend.execution.tool_calls import Outcome, PlannedCall
from backend.runtime.context import Context
from backend.store import workers
from backend.store.db import Database
from backend.store.events import verify_operator_chain_sync
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState
from backend.store.workers import WorkerRole

pytestmark = pytest.mark.both_stores


def _planned(idx: int, state: ToolCallState, effect: str = "effect") -> PlannedCall:
    return PlannedCall(
        idx=idx,
        model_call_id=f"m{idx}",
        tool="outbox.outbox_send",
        arguments=json.dumps({"to": "ops", "n": idx}),
        effect=effect,
        effect_source="annotation",
        permission="ask" if state == ToolCallState.AWAITING_APPROVAL else "allow",
        state=state,
    )


async def _parked_turn(db: Database, states: list[ToolCallState]) -> tuple[leases.Lease, list[str]]:
    """A session whose execution asked for calls in `states` (running ones become unknown), parked."""
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s1', ?, ?)", (now, now)
        )
    lease = await leases.claim(db, "s1", "executor-x", length_ms=60_000)
    assert lease is not None
    planned = [_planned(i, s) for i, s in enumerate(states)]

    def write(conn: Any) -> list[str]:
        guard_sync(conn, lease, now=now)
        ids = tool_calls.insert_sync(conn, lease, 1, f"{lease.execution_id}:1", planned, now)
        running = [cid for cid, s in zip(ids, states, strict=True) if s == ToolCallState.RUNNING]
        tool_calls.start_sync(conn, lease, [], now)
        for cid in running:
            tool_calls.finish_sync(
                conn,
                lease,
                cid,
                Outcome(state=ToolCallState.UNKNOWN, result=None, is_error=False, reason="x"),
                now,
            )
        assert parking.park_sync(conn, lease, now=now) is not None
        return ids

    ids = await db.write_in_thread(write)
    return lease, ids


async def _execution(db: Database, eid: str) -> dict[str, Any]:
    row = await db.fetchone("SELECT * FROM session_execution WHERE id = ?", (eid,))
    assert row is not None
    return dict(row)


async def _held(db: Database) -> Any:
    row = await db.fetchone("SELECT held_reason FROM session WHERE id = 's1'")
    assert row is not None
    return row[0]


async def test_approve_then_deny_unparks_only_when_nothing_waits(db_ctx: Context) -> None:
    db = await db_ctx.db()
    lease, (first, second) = await _parked_turn(db, [ToolCallState.AWAITING_APPROVAL] * 2)
    assert (await _execution(db, lease.execution_id))["parked"] == parking.AWAITING_APPROVAL
    assert await _held(db) == parking.AWAITING_APPROVAL

    approved = await ops.approve(db_ctx, first)
    assert (approved["previous_state"], approved["state"], approved["unparked"]) == (
        "awaiting_approval",
        "pending",
        False,
    )
    assert approved["arguments"] == {"to": "ops", "n": 0} and approved["tool"] == "outbox.outbox_send"
    assert (await _execution(db, lease.execution_id))["parked"] == parking.AWAITING_APPROVAL

    with pytest.raises(Refused, match=f"is awaiting_approval, not unknown.*`rem approve {second}`"):
        await ops.resolve(db_ctx, second, "done")
    denied = await ops.deny(db_ctx, second, "not today")
    assert (denied["state"], denied["unparked"]) == ("denied", True)
    execution = await _execution(db, lease.execution_id)
    assert execution["parked"] == parking.DECIDED and execution["epoch"] == lease.epoch + 1
    assert await _held(db) is None
    row = await db.fetchone(
        "SELECT result, is_error, reason, decided_by FROM tool_call WHERE id = ?", (second,)
    )
    assert row is not None and "not today" in row[0] and row[1] == 1 and row[2] == "not today"
    assert row[3] == db_ctx.operator

    # the journal holds both decisions, chained, with the call and its digest
    events = await db.fetchall(
        "SELECT kind, target, data FROM event WHERE kind LIKE 'operator.%' ORDER BY id"
    )
    assert [(e[0], e[1]) for e in events] == [
        ("operator.approve", first),
        ("operator.refused", second),  # the resolve of a call awaiting approval
        ("operator.deny", second),
    ]
    assert json.loads(events[2][2])["arguments_sha256"]
    assert (await db.read_in_thread(verify_operator_chain_sync))["broken"] is None

    # the un-parked turn is taken over without an attempt counted or a continuation message
    def take(conn: Any) -> recovery.Takeover | None:
        return recovery.take_over_sync(
            conn, lease.execution_id, "executor-y", now=clock.now_ms(), budget=1, length_ms=60_000
        )

    assert [r[0] for r in await db.fetchall(recovery.EXPIRED_SQL, {"now": clock.now_ms(), "limit": 5})] == [
        lease.execution_id
    ]
    takeover = await db.write_in_thread(take)
    assert takeover is not None and takeover.attempt == 0 and takeover.lease.epoch == lease.epoch + 2
    assert (await _execution(db, lease.execution_id))["parked"] is None
    assert await db.fetchone("SELECT 1 FROM session_message WHERE type = 'synthetic'") is None


async def test_resolve_each_choice_and_the_refusals(db_ctx: Context) -> None:
    db = await db_ctx.db()
    lease, ids = await _parked_turn(db, [ToolCallState.RUNNING] * 3)
    assert await _held(db) == parking.OUTCOME_UNKNOWN
    # a parked execution is skipped by every takeover scan, expired or not
    assert await db.fetchall(recovery.EXPIRED_SQL, {"now": clock.now_ms() + 10**9, "limit": 5}) == []

    # `rem resume` lifts model-error holds only: a tool hold ends by a decision
    with pytest.raises(Refused, match="held for a tool call .tool_outcome_unknown."):
        await ops.resume(db_ctx, ["s1"])
    assert (await ops.resume(db_ctx, all_held=True))["resumed"] == []
    # the refusal names the decision the call does wait for
    with pytest.raises(Refused, match=f"is unknown, not awaiting_approval.*`rem resolve {ids[0]} --done"):
        await ops.approve(db_ctx, ids[0])
    with pytest.raises(NotFound, match="no tool call 'call_nope'"):
        await ops.resolve(db_ctx, "call_nope", "done")
    done = await ops.resolve(db_ctx, ids[0], "done", "sent, receipt 8812")
    retry = await ops.resolve(db_ctx, ids[1], "retry")
    failed = await ops.resolve(db_ctx, ids[2], "fail", "the mail server says no")
    assert [d["state"] for d in (done, retry, failed)] == ["completed", "pending", "error"]
    assert [d["unparked"] for d in (done, retry, failed)] == [False, False, True]
    with pytest.raises(Refused, match="is completed, not unknown"):
        await ops.resolve(db_ctx, ids[0], "retry")
    rows = {
        r[0]: r[1:]
        for r in await db.fetchall(
            "SELECT id, state, result, is_error, retries, idempotency_key FROM tool_call"
        )
    }
    assert rows[ids[0]][:3] == ("completed", "sent, receipt 8812", 0)
    assert rows[ids[1]][0] == "pending" and rows[ids[1]][3] == 1
    assert rows[ids[1]][4] == tool_calls.idempotency_key("s1", lease.execution_id, 1, 1)
    assert rows[ids[2]][0] == "error" and "the mail server says no" in rows[ids[2]][1]
    refused = await db.fetchall("SELECT data FROM event WHERE kind = 'operator.refused'")
    assert len(refused) == 4  # the resume, approve, resolve of an unknown id, resolve of a decided call
    assert (await db.read_in_thread(verify_operator_chain_sync))["broken"] is None


async def test_decisions_refuse_under_read_only(db_ctx: Context) -> None:
    db = await db_ctx.db()
    _lease, ids = await _parked_turn(db, [ToolCallState.AWAITING_APPROVAL])
    reader = Context(db_ctx.data, read_only=True, start_chroma=False, db_url=db_ctx.db_url)
    try:
        with pytest.raises(ReadOnly, match="read-only"):
            await ops.approve(reader, ids[0])
        with pytest.raises(ReadOnly):
            await ops.resolve(reader, ids[0], "fail")
    finally:
        await reader.close()
    row = await db.fetchone("SELECT state FROM tool_call WHERE id = ?", (ids[0],))
    assert row is not None and row[0] == "awaiting_approval"


async def test_a_parked_turn_is_no_expired_lease_and_a_release_of_it_is_refused(db_ctx: Context) -> None:
    """A turn parked for a person is held and renewed by nobody: its row's expiry passes, but
    nothing is late (no expired lease to alert on, no countdown), and a release would run
    nothing; the decision un-parks it, and then it is an expired lease for the next executor."""
    db = await db_ctx.db()
    lease, [call] = await _parked_turn(db, [ToolCallState.AWAITING_APPROVAL])

    def long_past(conn: Any) -> None:
        conn.execute("UPDATE session_execution SET expires_at = 1 WHERE id = ?", (lease.execution_id,))

    await db.write_in_thread(long_past)
    snap = await ops.status(db_ctx)
    [record] = snap["leases"]
    assert (record["parked"], record["expired"]) == (parking.AWAITING_APPROVAL, False)
    assert snap["counts"]["expired_leases"] == 0
    with pytest.raises(Refused, match="is parked for a person .tool_awaiting_approval.*rem approve"):
        await ops.release(db_ctx, lease.execution_id, force=True)
    assert await db.scalar("SELECT epoch FROM session_execution") == lease.epoch  # nothing moved

    await ops.approve(db_ctx, call)
    snap = await ops.status(db_ctx)
    [record] = snap["leases"]
    assert (record["parked"], record["expired"], snap["counts"]["expired_leases"]) == (None, True, 1)


async def test_the_calls_waiting_are_the_status_lists_kept_to_the_projects_asked(db_ctx: Context) -> None:
    db = await db_ctx.db()
    _lease, (asked, lost) = await _parked_turn(db, [ToolCallState.AWAITING_APPROVAL, ToolCallState.RUNNING])
    # a live executor beside them, with its tool sources recorded: not a waiting call
    await workers.register(db, "executor-live", WorkerRole.EXECUTOR, {"tool_servers": []})
    waiting = await ops.tool_calls_waiting(db_ctx)
    assert [c["call_id"] for c in waiting["awaiting_approval"]] == [asked]
    assert [c["call_id"] for c in waiting["unknown_outcome"]] == [lost]
    status = (await ops.status(db_ctx))["tools"]
    assert _timeless(waiting["awaiting_approval"]) == _timeless(status["awaiting_approval"])
    assert _timeless(waiting["unknown_outcome"]) == _timeless(status["unknown_outcome"])

    # s1 is in project `default`: kept for it, left out for any other (and for none)
    mine = await ops.tool_calls_waiting(db_ctx, projects=["default", "ops"])
    assert _timeless(mine["awaiting_approval"] + mine["unknown_outcome"]) == _timeless(
        waiting["awaiting_approval"] + waiting["unknown_outcome"]
    )
    for projects in (["ops"], []):
        assert await ops.tool_calls_waiting(db_ctx, projects=projects) == {
            "awaiting_approval": [],
            "unknown_outcome": [],
        }


def _timeless(calls: list[Any]) -> list[dict[str, Any]]:
    """Calls as listed, but for their age (which moves with the clock)."""
    return [{k: v for k, v in call.items() if k != "age_ms"} for call in calls]
