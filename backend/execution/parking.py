"""Parking: a turn that can only wait for a person leaves its executor until a decision.

When every call a step left unfinished waits for an operator (an approval, an
effect whose outcome is unknown), the executor parks the execution in one
fenced transaction: `session_execution.parked` names why, the session is held
with the same reason (`tool_awaiting_approval`, `tool_outcome_unknown`: its
waiting inputs stop waking executors), and the executor drops the lease: no
concurrency slot, no renewal, and the takeover scans skip a parked row
(`backend.execution.recovery`), however long the wait and however many
executors die meanwhile.

An operator's decision (`backend.ops.tool_decisions`) un-parks it once no call
of the turn waits any more: `parked` becomes `decided`, the lease expires now
under a new epoch (any zombie holder is fenced), the hold is lifted, and the
next executor takes the execution over through the normal takeover path. That
takeover is not an interruption: it counts no recovery attempt (an operator's
decision never spends the recovery budget) and writes no `recovery:`
continuation message (nothing was cut off: the step that asked was closed
before the park); it is journaled `execution.taken_over` with reason `unparked`.
"""

from __future__ import annotations

from backend.execution.leases import ExecutionPhase, Lease
from backend.execution.sessions import sleep_inputs_sync
from backend.store import fencing
from backend.store.db import Conn
from backend.store.events import EventKind, append_event_sync
from backend.store.states import PARKED_AWAITING_APPROVAL as AWAITING_APPROVAL
from backend.store.states import PARKED_OUTCOME_UNKNOWN as OUTCOME_UNKNOWN
from backend.store.states import (
    TOOL_HOLDS as TOOL_HOLDS,  # the hold reasons parking writes (and only it lifts)
)
from backend.store.states import ToolCallState

# `parked` after a decision: claimable through the takeover path
DECIDED = "decided"

WAITING_SQL = (
    "SELECT id, state FROM tool_call WHERE execution_id = ? AND state IN ('awaiting_approval', 'unknown') "
    "ORDER BY step, idx"
)


def waiting_reason_sync(conn: Conn, execution_id: str) -> tuple[str | None, list[str]]:
    """Why the execution would park now (an unknown outcome first), and the calls that wait."""
    rows = conn.execute(WAITING_SQL, (execution_id,)).fetchall()
    if not rows:
        return None, []
    unknown = any(r["state"] == ToolCallState.UNKNOWN for r in rows)
    return (OUTCOME_UNKNOWN if unknown else AWAITING_APPROVAL), [r["id"] for r in rows]


def park_sync(conn: Conn, lease: Lease, *, now: int) -> str | None:
    """Park the execution if a call of it waits for a person (fenced); the reason, or None.

    Call inside a transaction that began with `guard_sync` on `lease` (it holds
    the execution row, so a decision committing meanwhile is seen here).
    """
    reason, calls = waiting_reason_sync(conn, lease.execution_id)
    if reason is None:
        return None
    fencing.write_sync(
        conn, lease, "parked = :reason, phase = :phase", {"reason": reason, "phase": ExecutionPhase.SAFE}
    )
    hold_sync(conn, lease.session_id, reason, lease.owner_id, now)
    append_event_sync(
        conn,
        kind=EventKind.EXECUTION_PARKED,
        actor=lease.owner_id,
        session_id=lease.session_id,
        target=lease.execution_id,
        now=now,
        data={"reason": reason, "calls": calls, "epoch": lease.epoch},
    )
    return reason


def hold_sync(conn: Conn, session_id: str, reason: str, actor: str, now: int) -> None:
    """Hold the session for a tool decision (a model-error hold already there stays as it is)."""
    held = conn.execute(
        "UPDATE session SET held_at = coalesce(held_at, ?), held_reason = ? "
        "WHERE id = ? AND (held_at IS NULL OR held_reason IN (?, ?))",
        (now, reason, session_id, *TOOL_HOLDS),
    ).rowcount
    sleep_inputs_sync(conn, session_id)
    if held:
        append_event_sync(
            conn,
            kind=EventKind.SESSION_HELD,
            actor=actor,
            session_id=session_id,
            target=session_id,
            now=now,
            data={"error_class": reason, "decide": "rem approve | rem deny | rem resolve"},
        )


def journal_resumed_sync(conn: Conn, session_id: str, reason: str, actor: str, now: int) -> None:
    """Journal a held session's hold lifted (`session.resumed`, the API's streams carry it)."""
    append_event_sync(
        conn,
        kind=EventKind.SESSION_RESUMED,
        actor=actor,
        session_id=session_id,
        target=session_id,
        now=now,
        data={"held_reason": reason},
    )


def lock_execution_sync(conn: Conn, execution_id: str) -> None:
    """Take the execution row's lock (PostgreSQL) before a decision reads or moves its calls, so a
    park committing meanwhile and the decision see each other (SQLite: one writer anyway)."""
    conn.execute("UPDATE session_execution SET parked = parked WHERE id = ?", (execution_id,))


def unpark_sync(conn: Conn, execution_id: str, now: int) -> bool:
    """After a decision: make a parked execution claimable if none of its calls waits any more.

    The lease expires now under a new epoch (fenced on the grant it had), the
    session's tool hold is lifted and its waiting inputs wake. Whether it un-parked.
    """
    if waiting_reason_sync(conn, execution_id)[0] is not None:
        return False
    row = conn.execute(
        "SELECT session_id, owner_id, epoch FROM session_execution WHERE id = ? AND parked IN (?, ?)",
        (execution_id, *TOOL_HOLDS),
    ).fetchone()
    if row is None:
        return False  # not parked: its executor still holds it and sees the decision itself
    epoch = fencing.next_session_epoch_sync(conn, row["session_id"])
    fencing.write_row_sync(
        conn,
        fencing.EXECUTION,
        execution_id,
        fencing.Fence(row["owner_id"], row["epoch"]),
        "parked = :decided, epoch = :new_epoch, expires_at = :now",
        {"decided": DECIDED, "new_epoch": epoch, "now": now},
        lost=f"execution {execution_id} moved while it was being un-parked; look again with `rem status`",
    )
    held = conn.execute(
        "SELECT held_reason FROM session WHERE id = ? AND held_reason IN (?, ?)",
        (row["session_id"], *TOOL_HOLDS),
    ).fetchone()
    if held is not None:
        conn.execute(
            "UPDATE session SET held_at = NULL, held_reason = NULL WHERE id = ?", (row["session_id"],)
        )
        journal_resumed_sync(conn, row["session_id"], held[0], "rem", now)
    conn.execute(
        "UPDATE session_input SET wake_pending = 1 WHERE session_id = ? AND promoted_seq IS NULL",
        (row["session_id"],),
    )
    return True
