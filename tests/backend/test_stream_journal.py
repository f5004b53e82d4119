"""Schema v13: the journal is the API's event record. A streamed part and every tool-call state are
journaled in the transaction that writes them, whoever wrote them; a held session's hold lifted is
journaled; `execution.completed` names the turn's reply and the inputs it answered; a server joins
the worker registry; tokens are kept as hashes, and creating and revoking them is chained."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.core.errors import BadInput, NotFound, Refused
from backend.execution import leases, parking, sessions, tool_calls
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.execution.tool_calls import PlannedCall
from backend.runtime.context import Context
from backend.store import workers
from backend.store.db import Database
from backend.store.events import verify_operator_chain_sync
from backend.store.states import ToolCallState
from backend.store.workers import WorkerRole

pytestmark = pytest.mark.both_stores


async def _journal(db: Database, sid: str, *kinds: str) -> list[dict[str, Any]]:
    marks = ", ".join("?" * len(kinds))
    rows = await db.fetchall(
        f"SELECT id, kind, actor, target, data FROM event WHERE session_id = ? AND kind IN ({marks}) ORDER BY id",
        (sid, *kinds),
    )
    return [{**dict(r), "data": json.loads(r["data"])} for r in rows]


async def test_every_part_of_a_turn_is_journaled_and_the_completion_names_reply_and_inputs(
    db_ctx: Context,
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first question about the export", input_id="in-1")
    await sessions.admit(db, "s1", "and a second one", input_id="in-2")
    await Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=2_000).run()
    parts = await db.fetchall(
        "SELECT id, message_id, idx FROM session_part WHERE session_id = 's1' ORDER BY id"
    )
    journaled = await _journal(db, "s1", "message.part")
    assert parts, "the offline agent streams its reply in parts"
    assert sorted(e["target"] for e in journaled) == [p["id"] for p in parts]
    by_id = {p["id"]: p for p in parts}
    for event in journaled:
        part = by_id[event["target"]]
        assert event["data"] == {"message_id": part["message_id"], "idx": part["idx"], "type": "text"}
    done = await _journal(db, "s1", "execution.completed")
    replies = await db.fetchall(
        "SELECT id, data FROM session_message WHERE session_id = 's1' AND type = 'assistant' ORDER BY seq"
    )
    # two queued inputs: two turns, each naming its own reply and the input that reply answers
    assert [e["data"]["message_id"] for e in done] == [r["id"] for r in replies]
    assert [e["data"]["inputs"] for e in done] == [json.loads(r["data"])["answers"] for r in replies]
    assert [e["data"]["inputs"] for e in done] == [["in-1"], ["in-2"]]
    # the operator's event tail leaves the parts out: streamed replies would bury everything else
    tail = (await ops.status(db_ctx))["events"]
    assert tail and "message.part" not in {e["kind"] for e in tail}
    assert {"execution.completed", "input.admitted"} <= {e["kind"] for e in tail}


def _planned(idx: int, state: ToolCallState) -> PlannedCall:
    return PlannedCall(
        idx=idx,
        model_call_id=f"m{idx}",
        tool="outbox.outbox_send",
        arguments=json.dumps({"to": "ops"}),
        effect="effect",
        effect_source="annotation",
        permission="ask",
        state=state,
    )


async def test_each_tool_call_state_and_the_hold_lifted_are_journaled(db_ctx: Context) -> None:
    db = await db_ctx.db()
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES ('s1', ?, ?)", (now, now)
        )
    lease = await leases.claim(db, "s1", "executor-x", length_ms=60_000)
    assert lease is not None
    (cid,) = await db.write_in_thread(
        lambda conn: tool_calls.insert_sync(
            conn, lease, 1, "a1", [_planned(0, ToolCallState.AWAITING_APPROVAL)], clock.now_ms()
        )
    )
    await db.write_in_thread(lambda conn: parking.park_sync(conn, lease, now=clock.now_ms()))
    await ops.approve(db_ctx, cid)
    states = [e["data"] for e in await _journal(db, "s1", "tool_call.state")]
    assert states == [
        {"tool": "outbox.outbox_send", "state": "awaiting_approval", "effect": "effect"},
        {"tool": "outbox.outbox_send", "state": "pending", "effect": "effect"},
    ]
    (resumed,) = await _journal(db, "s1", "session.resumed")
    assert resumed["data"] == {"held_reason": "tool_awaiting_approval"}
    held = await _journal(db, "s1", "session.held")
    assert held and held[-1]["id"] < resumed["id"]


async def test_a_server_joins_the_worker_registry(db_ctx: Context) -> None:
    db = await db_ctx.db()
    owner = workers.new_owner_id(WorkerRole.SERVER)
    await workers.register(db, owner, WorkerRole.SERVER, {"listen": "127.0.0.1:8765"})
    row = await db.fetchone("SELECT role, state FROM worker WHERE owner_id = ?", (owner,))
    assert row is not None and (row["role"], row["state"]) == ("server", "running")


async def test_a_token_is_kept_as_a_hash_and_reaches_only_its_projects(db_ctx: Context) -> None:
    made = await ops.token_create(db_ctx, "web", projects=["support", "sales"], scopes=["write"])
    secret = made["token"]
    db = await db_ctx.db()
    stored = await db.fetchone("SELECT * FROM api_token WHERE name = 'web'")
    assert stored is not None and secret not in json.dumps(dict(stored))
    who = await ops.authenticate(db_ctx, secret)
    assert who is not None and who.name == "web" and who.scopes == frozenset({"write"})
    assert who.reaches("support") and not who.reaches("other")
    assert await ops.authenticate(db_ctx, secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None
    with pytest.raises(Refused, match="exists"):
        await ops.token_create(db_ctx, "web", all_projects=True)
    await ops.token_revoke(db_ctx, "web")
    assert await ops.authenticate(db_ctx, secret) is None
    again = await ops.token_create(db_ctx, "web", all_projects=True)  # a revoked name is free again
    assert (await ops.authenticate(db_ctx, again["token"])).projects is None  # type: ignore[union-attr]
    assert [t["name"] for t in await ops.token_list(db_ctx)] == ["web"]
    assert len(await ops.token_list(db_ctx, revoked=True)) == 2
    journal = await db.fetchall("SELECT kind, data FROM event WHERE kind LIKE 'operator.token_%' ORDER BY id")
    assert [r["kind"] for r in journal] == [
        "operator.token_create",
        "operator.token_revoke",
        "operator.token_create",
    ]
    assert all(secret not in r["data"] and again["token"] not in r["data"] for r in journal)
    chain = await db.read_in_thread(verify_operator_chain_sync)
    assert chain["ok"] and chain["count"] == 3


async def test_token_input_is_refused_in_one_line(db_ctx: Context) -> None:
    with pytest.raises(BadInput, match="not valid"):
        await ops.token_create(db_ctx, "a b", all_projects=True)
    with pytest.raises(BadInput, match="--project"):
        await ops.token_create(db_ctx, "web")
    with pytest.raises(BadInput, match="unknown scope"):
        await ops.token_create(db_ctx, "web", all_projects=True, scopes=["admin"])
    with pytest.raises(NotFound, match="no live token"):
        await ops.token_revoke(db_ctx, "nobody")
    assert await ops.authenticate(db_ctx, "rem_" + "x" * 500) is None
