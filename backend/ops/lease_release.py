"""The operator's release of a lease, whatever its kind, and its journal entry.

The release itself is `backend.store.fencing.release_sync`, the same for an
execution, a summary job and a Dream claim: expire the lease now and bump its
epoch so the old owner's late writes are fenced, refused when the epoch
moved since the operator looked unless forced. What an operator sees of it
is written here, in the same transaction: the `operator.release` event, and
for an execution its owner's liveness and a parked execution's fresh budget.
"""

from __future__ import annotations

import logging

import aiosqlite

from backend.core.errors import Refused
from backend.execution import parking, recovery
from backend.ops.results import LeaseReleased, LeaseSeen
from backend.store import fencing
from backend.store.db import Conn, in_thread
from backend.store.events import EventKind, append_event_sync
from backend.store.workers import LeaseKind, worker_alive

log = logging.getLogger("rem.ops")

lease_kind_sync = fencing.kind_of_sync


async def release_lease(
    conn: aiosqlite.Connection,
    kind: LeaseKind | str,
    lease_id: str,
    *,
    expected_epoch: int | None = None,
    force: bool = False,
    actor: str,
    now: int,
) -> LeaseReleased:
    """`release_lease_sync` inside a transaction opened with `Database.tx()`."""
    return await in_thread(
        conn,
        lambda raw: release_lease_sync(
            raw, LeaseKind(kind), lease_id, expected_epoch=expected_epoch, force=force, actor=actor, now=now
        ),
    )


def release_lease_sync(
    conn: Conn,
    kind: LeaseKind,
    lease_id: str,
    *,
    expected_epoch: int | None,
    force: bool,
    actor: str,
    now: int,
) -> LeaseReleased:
    """Release one lease (fenced on the epoch the operator saw) and journal it, in the caller's tx.

    A parked execution (recovery budget spent) is un-parked with a fresh
    budget: releasing it is the operator's "try again". A turn parked for a
    person's decision on its tool calls is refused: nobody holds it, and only
    the decision moves it on.
    """
    if kind == LeaseKind.EXECUTION:
        refuse_tool_parked_sync(conn, lease_id)
    released = fencing.release_sync(conn, kind, lease_id, expected_epoch=expected_epoch, force=force, now=now)
    seen = LeaseSeen(
        owner_id=released.owner_id,
        epoch=released.old_epoch,
        expires_at=released.expires_at,
        time_left_ms=released.expires_at - now,
    )
    result = LeaseReleased(
        kind=kind,
        id=lease_id,
        owner_id=released.owner_id,
        old_epoch=released.old_epoch,
        new_epoch=released.new_epoch,
        forced=force,
        seen=seen,
    )
    if kind == LeaseKind.EXECUTION:
        seen["phase"] = released.seen["phase"]
        unparked = recovery.unpark_sync(conn, lease_id)
        result["execution_id"] = lease_id
        result["session_id"] = released.session_id
        result["owner_alive"] = owner_alive_sync(conn, released.owner_id, now)
        result["expected_epoch"] = expected_epoch
        result["unparked"] = unparked or released.seen["recovery_error"] is not None
        result["released_at"] = now
    append_event_sync(
        conn,
        kind=EventKind.OPERATOR_RELEASE,
        actor=actor,
        session_id=released.session_id,
        target=lease_id,
        data=dict(result),
        now=now,
    )
    log.info(
        "released %s %s (epoch %s -> %s) by %s", kind, lease_id, released.old_epoch, released.new_epoch, actor
    )
    return result


def refuse_tool_parked_sync(conn: Conn, execution_id: str) -> None:
    """Refuse to release a turn parked for a person (`backend.execution.parking`)."""
    row = conn.execute(
        "SELECT parked FROM session_execution WHERE id = ? AND parked IN (?, ?)",
        (execution_id, *parking.TOOL_HOLDS),
    ).fetchone()
    if row is not None:
        raise Refused(
            f"execution {execution_id} is parked for a person ({row['parked']}): nobody holds it and a "
            "release would run nothing; decide its tool calls: `rem status` lists them, then "
            "`rem approve` / `rem deny` / `rem resolve CALL` (console: Backlog, a / n / o)"
        )


def owner_alive_sync(conn: Conn, owner_id: str, now: int) -> bool:
    """Whether the lease's owner is registered, live, not seen to exit, and heartbeating (`worker_alive`)."""
    owner = conn.execute(
        "SELECT state, heartbeat_at, exited_at FROM worker WHERE owner_id = ?", (owner_id,)
    ).fetchone()
    return bool(owner) and worker_alive(owner["state"], owner["heartbeat_at"], owner["exited_at"], now)
