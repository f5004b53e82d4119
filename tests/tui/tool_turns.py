"""A parked turn with tool calls, written through the executor's own functions (console tests)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from backend.core import clock
from backend.execution import leases, parking, tool_calls
from backend.execution.tool_calls import Outcome, PlannedCall
from backend.runtime.context import Context
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState


def send_call(idx: int, state: ToolCallState, permission: str = "ask") -> PlannedCall:
    """The demo server's `outbox_send` as call `idx` of a step, in `state`."""
    return PlannedCall(
        idx=idx,
        model_call_id=f"m{idx}",
        tool="demo.outbox_send",
        arguments=json.dumps({"to": f"ops-{idx}@example.com", "subject": "rollback"}),
        effect="effect",
        effect_source="annotation",
        permission=permission,
        state=state,
    )


UNKNOWN = Outcome(state=ToolCallState.UNKNOWN, result=None, is_error=False, reason="executor killed")


async def parked_turn(
    ctx: Context, sid: str, calls: list[PlannedCall], *, lost: Collection[int] = (), owner: str
) -> list[str]:
    """A turn of a new session `sid` asking for `calls`, parked; the calls at the indexes `lost`
    were started and their executor died mid-call (an unknown outcome). The calls' ids."""
    db = await ctx.db()
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, ?, ?)", (sid, now, now)
        )
    lease = await leases.claim(db, sid, owner, length_ms=60_000)
    assert lease is not None

    def write(conn: Any) -> list[str]:
        guard_sync(conn, lease, now=now)
        ids = tool_calls.insert_sync(conn, lease, 1, f"{lease.execution_id}:1", calls, now)
        started = [cid for i, cid in enumerate(ids) if i in lost]
        tool_calls.start_sync(conn, lease, started, now)  # (inserted pending: started, then lost)
        for cid in started:
            tool_calls.finish_sync(conn, lease, cid, UNKNOWN, now)
        assert parking.park_sync(conn, lease, now=now) is not None
        return ids

    return await db.write_in_thread(write)


async def running_call(ctx: Context, sid: str, *, owner: str, length_ms: int = 60_000) -> str:
    """A turn of a new session `sid` whose executor `owner` holds its lease and has a send running
    (`running` committed, the request out): the call's id."""
    db = await ctx.db()
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, ?, ?)", (sid, now, now)
        )
    lease = await leases.claim(db, sid, owner, length_ms=length_ms)
    assert lease is not None

    def write(conn: Any) -> str:
        guard_sync(conn, lease, now=now)
        (cid,) = tool_calls.insert_sync(
            conn, lease, 1, f"{lease.execution_id}:1", [send_call(0, ToolCallState.PENDING, "allow")], now
        )
        tool_calls.start_sync(conn, lease, [cid], now)
        return cid

    return await db.write_in_thread(write)
