"""Operator lease release for summary-job and Dream leases, and lease lookup by id.

Execution leases are released by `backend.execution.leases.release_execution` (the
executor's own lease module); the rules are the same for all three kinds:
expire now, bump the epoch so the old owner's late writes are fenced, refuse
when the epoch moved since the operator looked unless forced, journal it.
"""

from __future__ import annotations

from typing import Any

import aiosqlite

from backend.core.errors import LeaseNotFound, Refused
from backend.store.db import Database, execute
from backend.store.events import EventKind, append_event
from backend.store.workers import LeaseKind

# kind -> (table, "lease is held" condition)
JOB_LEASES = {
    LeaseKind.SUMMARY_JOB: ("summary_job", "status = 'in_progress'"),
    LeaseKind.DREAM: ("dream_state", "digest_state = 'in_progress'"),
}


async def lease_kind(db: Database, lease_id: str) -> LeaseKind:
    """Which kind of lease `lease_id` names: an execution id, else a session's job lease."""
    if await db.scalar("SELECT 1 FROM session_execution WHERE id = ?", (lease_id,)):
        return LeaseKind.EXECUTION
    for kind, (table, held) in JOB_LEASES.items():
        if await db.scalar(
            f"SELECT 1 FROM {table} WHERE session_id = ? AND {held} AND lease_expires_at IS NOT NULL",
            (lease_id,),
        ):
            return kind
    raise LeaseNotFound(
        f"no live lease {lease_id!r} (neither an execution id nor a session with a running "
        "summary or Dream job); list leases with `rem status`"
    )


async def release_job_lease(
    conn: aiosqlite.Connection,
    kind: LeaseKind,
    session_id: str,
    *,
    expected_epoch: int | None,
    force: bool,
    actor: str,
    now: int,
) -> dict[str, Any]:
    """Expire a summary-job or Dream lease now and bump its epoch (fenced, journaled)."""
    table, held = JOB_LEASES[kind]
    rows = list(
        await conn.execute_fetchall(
            f"SELECT owner_id, epoch, lease_expires_at FROM {table} "
            f"WHERE session_id = ? AND {held} AND lease_expires_at IS NOT NULL",
            (session_id,),
        )
    )
    if not rows:
        raise LeaseNotFound(f"no live {kind} lease for session {session_id!r}; see `rem status`")
    row = rows[0]
    owner, epoch, expires_at = row["owner_id"], row["epoch"], row["lease_expires_at"]
    seen = {"owner_id": owner, "epoch": epoch, "expires_at": expires_at, "time_left_ms": expires_at - now}
    if expected_epoch is not None and epoch != expected_epoch and not force:
        raise Refused(
            f"{kind} lease of {session_id} is at epoch {epoch}, not {expected_epoch}: it was renewed "
            "or taken over since you looked; re-check `rem status`, or pass --force"
        )
    await execute(
        conn,
        f"UPDATE {table} SET lease_expires_at = ?, epoch = epoch + 1 WHERE session_id = ? AND epoch = ?",
        (now, session_id, epoch),
    )
    result = {
        "kind": kind,
        "id": session_id,
        "owner_id": owner,
        "old_epoch": epoch,
        "new_epoch": epoch + 1,
        "forced": force,
        "seen": seen,
    }
    await append_event(
        conn,
        kind=EventKind.OPERATOR_RELEASE,
        actor=actor,
        session_id=session_id,
        target=session_id,
        data=result,
        now=now,
    )
    return result
