"""Operator actions return their typed result (`backend.ops.results`) and journal exactly it.

The CLI's `--json` prints these dicts as they are and the console reads them
by these keys, so each result must carry every required key of its
TypedDict and nothing the TypedDict does not name; and the operator's
journal entry is written by ops, in the same transaction, with the same data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NotRequired, get_origin, get_type_hints

import pytest

from backend import ops
from backend.core import clock
from backend.execution import leases
from backend.ops.results import DrainReport, LeaseReleased, LeaseSeen, ResumedSession, ResumeReport
from backend.runtime.context import Context
from backend.store.db import Database

pytestmark = pytest.mark.both_stores


def _keys(typed: Any) -> tuple[set[str], set[str]]:
    """A TypedDict's (required, optional) keys, read from its evaluated annotations (`NotRequired`)."""
    hints = get_type_hints(typed, include_extras=True)
    optional = {key for key, hint in hints.items() if get_origin(hint) is NotRequired}
    return set(hints) - optional, optional


def _shaped(result: Mapping[str, Any], typed: Any) -> None:
    required, optional = _keys(typed)
    assert required <= set(result), required - set(result)
    assert set(result) <= required | optional, set(result) - required - optional


async def _journaled(db: Database, kind: str) -> list[dict[str, Any]]:
    rows = await db.fetchall("SELECT data FROM event WHERE kind = ? ORDER BY id", (kind,))
    return [json.loads(row[0]) for row in rows]


async def _session(db: Database, sid: str, *, held: bool = False) -> None:
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated, held_at, held_reason) VALUES (?, ?, ?, ?, ?)",
            (sid, now, now, now if held else None, "auth: the key was refused" if held else None),
        )


async def test_a_release_of_each_kind_returns_and_journals_its_typed_result(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db, "s1")
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, owner_id, epoch, lease_expires_at, time_created, "
            "time_updated) VALUES ('s1', 'in_progress', 'summarizer-x', 4, ?, 1, 1)",
            (now + 60_000,),
        )
    lease = await leases.claim(db, "s1", "executor-x", length_ms=60_000)
    assert lease is not None
    execution = await ops.release(db_ctx, lease.execution_id, expected_epoch=lease.epoch)
    job = await ops.release(db_ctx, "s1", kind="summary_job", expected_epoch=4)
    _shaped(execution, LeaseReleased)
    _shaped(job, LeaseReleased)
    _shaped(execution["seen"], LeaseSeen)
    _shaped(job["seen"], LeaseSeen)
    # an execution's release says more (its owner, the session, a parked budget); a job's does not
    required, optional = _keys(LeaseReleased)
    assert (set(execution), set(job)) == (required | optional, required)
    assert (execution["old_epoch"], execution["new_epoch"], execution["owner_alive"]) == (1, 2, False)
    assert (job["kind"], job["old_epoch"], job["new_epoch"], "phase" in job["seen"]) == (
        "summary_job",
        4,
        5,
        False,
    )
    assert await _journaled(db, "operator.release") == [json.loads(json.dumps(r)) for r in (execution, job)]


async def test_resume_and_drain_return_their_typed_results_and_ops_journals_them(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db, "held-1", held=True)
    resumed = await ops.resume(db_ctx, ["held-1"])
    _shaped(resumed, ResumeReport)
    (item,) = resumed["resumed"]
    _shaped(item, ResumedSession)
    assert (resumed["count"], item["session_id"], item["held_reason"]) == (
        1,
        "held-1",
        "auth: the key was refused",
    )
    assert await _journaled(db, "operator.resume") == [json.loads(json.dumps(item))]
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES ('dream-1', 'dream', 1, 'h', 1, ?, 'running')",
            (clock.now_ms(),),
        )
    drained = await ops.drain(db_ctx, "dream-1")
    _shaped(drained, DrainReport)
    assert drained == {
        "owner_id": "dream-1",
        "role": "dream",
        "previous_state": "running",
        "state": "draining",
    }
    (journaled,) = await _journaled(db, "operator.drain")
    assert (journaled["seen"]["state"], journaled["result"]) == ("running", "draining")
