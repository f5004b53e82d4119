"""Taking over interrupted executions: recovery rows, continuation messages, the attempt budget.

An execution whose lease expired (its owner died or stalled) or was released
by an operator is taken over by any executor. The takeover transaction bumps
the epoch (fencing the old owner), counts the attempt *before* any work,
writes one `session_recovery` row keyed by the execution id (phase `unknown`
when the execution died mid-step, else `ready`), appends the one
continuation message `recovery:<execution_id>` (type `synthetic`; a second
takeover of the same execution reuses it), and closes the stale assistant
row. The new owner moves the recovery to `continue` when it resumes work.
Past the budget the execution is parked with `recovery_error` for the
operator (`rem release` retries it), never retried in a hot loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from backend.core.settings import Settings, settings
from backend.execution import parking, projection, sessions
from backend.execution.leases import ExecutionPhase, Lease, TakeoverReason, lease_ms, takeover_reason_sync
from backend.store import fencing, handoffs, workers
from backend.store.db import Conn, Reader, Row, read_together_sync, skip_locked_sync
from backend.store.events import EventKind, append_event_sync

log = logging.getLogger("rem.recovery")

RECOVERY_BUDGET = Settings.recovery_budget.default  # opencode's budget

# The recovery wake scan, served by opencode's wake index
# session_recovery_wake_pending_error_attempts_created_execution_idx.
RECOVERY_WAKE_SQL = """
SELECT r.execution_id, r.session_id FROM session_recovery AS r
JOIN session_execution AS e ON e.id = r.execution_id
WHERE r.wake_pending = 1 AND r.recovery_error IS NULL
  AND e.expires_at <= :now AND e.recovery_error IS NULL AND (e.parked IS NULL OR e.parked = 'decided')
ORDER BY r.wake_attempts, r.time_created, r.execution_id LIMIT :limit
"""
# First interruptions: expired executions with no recovery row yet (session_execution_expires_idx).
EXPIRED_SQL = """
SELECT e.id AS execution_id, e.session_id FROM session_execution AS e
WHERE e.expires_at <= :now AND e.recovery_error IS NULL AND (e.parked IS NULL OR e.parked = 'decided')
  AND NOT EXISTS (SELECT 1 FROM session_recovery AS r WHERE r.execution_id = e.id)
ORDER BY e.expires_at LIMIT :limit
"""
# Executions whose owner on this host the worker registry records as stopped (its
# supervisor saw it exit, or it shut down without handing back): no need to wait out
# their leases. Another host's stopped owners are left to their expiry (EXPIRED_SQL).
ORPHANED_SQL = """
SELECT e.id AS execution_id, e.session_id FROM worker AS w
JOIN session_execution AS e ON e.owner_id = w.owner_id
WHERE w.state = 'stopped' AND w.host = :host AND w.heartbeat_at > :since AND e.expires_at > :now
  AND e.recovery_error IS NULL AND e.parked IS NULL
ORDER BY e.expires_at LIMIT :limit
"""
# Only workers stopped within one lease can still hold an unexpired lease.
ORPHAN_WINDOW_MS = 10 * 60_000


def recovery_budget() -> int:
    """Takeovers allowed per execution before it is parked: `REM_RECOVERY_BUDGET`, default 10."""
    return settings.recovery_budget


@dataclass(kw_only=True)
class Takeover:
    """What the new owner needs to continue an interrupted execution."""

    lease: Lease
    step: int
    interrupted_phase: ExecutionPhase
    attempt: int
    continuation_id: str
    superseded: list[str]


def recoverable_sync(conn: Conn, now: int, limit: int) -> list[tuple[str, str]]:
    """(execution_id, session_id) of executions awaiting takeover, fewest attempts first."""
    params = {"now": now, "limit": limit, "since": now - ORPHAN_WINDOW_MS, "host": workers.host_name()}
    # the three sent together (PostgreSQL: one round trip, with the caller's BEGIN): every idle pass runs them
    found = read_together_sync(conn, [_recoverable_reader(params)])[0]
    return list(dict.fromkeys((r["execution_id"], r["session_id"]) for r in found))


def _recoverable_reader(params: dict[str, Any]) -> Reader[list[Row]]:
    wake, expired, orphaned = yield [
        (RECOVERY_WAKE_SQL, params),
        (EXPIRED_SQL, params),
        (ORPHANED_SQL, params),
    ]
    return [*wake, *expired, *orphaned]


def take_over_sync(
    conn: Conn,
    execution_id: str,
    owner_id: str,
    *,
    now: int,
    budget: int,
    length_ms: int | None = None,
) -> Takeover | None:
    """Take over one expired execution (inside the caller's tx), or park it past the budget."""
    # locked until commit (PostgreSQL): a rival taker skips it rather than act on this read
    row = conn.execute(
        f"SELECT * FROM session_execution WHERE id = ?{skip_locked_sync(conn)}", (execution_id,)
    ).fetchone()
    reason = None if row is None else takeover_reason_sync(conn, row, now)
    if reason is None:
        return None
    old = dict(row)
    if old["parked"] == parking.DECIDED:
        return _take_over_unparked_sync(conn, old, owner_id, now, length_ms or lease_ms())
    recovery = conn.execute(
        "SELECT wake_attempts FROM session_recovery WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    attempt = (recovery["wake_attempts"] if recovery else 0) + 1
    if recovery is not None and attempt > budget:
        park_sync(conn, old, attempt - 1, owner_id, now)
        return None
    lease = fencing.take_over_sync(
        conn, fencing.EXECUTION, row, owner_id, now=now, length_ms=length_ms or lease_ms()
    )
    if lease is None:
        return None
    assert isinstance(lease, Lease)
    phase = ExecutionPhase.UNKNOWN if old["phase"] == ExecutionPhase.UNKNOWN else ExecutionPhase.READY
    cont = _ensure_continuation_sync(conn, old, lease, phase, now)
    superseded = projection.supersede_open_sync(conn, lease.session_id, cont, now)
    _upsert_recovery_sync(conn, old, cont, phase, now)
    conn.execute("UPDATE session_execution SET phase = 'continue' WHERE id = ?", (execution_id,))
    handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
    takeover = Takeover(
        lease=lease,
        step=int(old["step"]),
        interrupted_phase=phase,
        attempt=attempt,
        continuation_id=cont,
        superseded=superseded,
    )
    _journal_takeover_sync(conn, takeover, old, reason, now)
    return takeover


def _take_over_unparked_sync(
    conn: Conn, old: dict[str, Any], owner_id: str, now: int, length_ms: int
) -> Takeover | None:
    """Take over an execution an operator's decision un-parked (`backend.execution.parking`): no
    attempt counted, no continuation message (nothing was interrupted), the step goes on."""
    lease = fencing.take_over_sync(conn, fencing.EXECUTION, old, owner_id, now=now, length_ms=length_ms)
    if lease is None:
        return None
    assert isinstance(lease, Lease)
    conn.execute(
        "UPDATE session_execution SET parked = NULL, phase = 'continue' WHERE id = ?", (lease.execution_id,)
    )
    takeover = Takeover(
        lease=lease,
        step=int(old["step"]),
        interrupted_phase=ExecutionPhase(old["phase"]),
        attempt=0,
        continuation_id="",
        superseded=[],
    )
    _journal_takeover_sync(conn, takeover, old, TakeoverReason.UNPARKED, now)
    return takeover


def _journal_takeover_sync(
    conn: Conn, takeover: Takeover, old: dict[str, Any], reason: TakeoverReason, now: int
) -> None:
    lease = takeover.lease
    append_event_sync(
        conn,
        kind=EventKind.EXECUTION_TAKEN_OVER,
        actor=lease.owner_id,
        session_id=lease.session_id,
        target=lease.execution_id,
        data={
            "reason": reason,
            "from_owner": old["owner_id"],
            "from_epoch": old["epoch"],
            "epoch": lease.epoch,
            "interrupted_phase": takeover.interrupted_phase,
            "attempt": takeover.attempt,
            "continuation_id": takeover.continuation_id,
            "superseded": takeover.superseded,
        },
        now=now,
    )
    log.info(
        "took over execution %s of session %s (was %s, phase %s, attempt %d)",
        lease.execution_id,
        lease.session_id,
        old["owner_id"],
        takeover.interrupted_phase,
        takeover.attempt,
    )


def _ensure_continuation_sync(
    conn: Conn, old: dict[str, Any], lease: Lease, phase: ExecutionPhase, now: int
) -> str:
    """Append the execution's one continuation message (a later takeover only reopens it)."""
    cont = projection.continuation_id(lease.execution_id)
    reopened = conn.execute(
        "UPDATE session_message SET data = json_set(data, '$.status', 'continue'), time_updated = ? "
        "WHERE id = ?",
        (now, cont),
    ).rowcount
    if reopened:
        return cont
    seq = sessions.reserve_seqs_sync(conn, lease.session_id, 1, now, messages=1)
    text = (
        f"Execution {lease.execution_id} was interrupted (phase {phase}, owner {old['owner_id']}, "
        f"epoch {old['epoch']}); {lease.owner_id} continues it at epoch {lease.epoch}. "
        "Any incomplete reply was superseded and the step is re-run."
    )
    data = {
        "key": cont,
        "execution_id": lease.execution_id,
        "status": "continue",
        "text": text,
        "interrupted_phase": phase,
        "interrupted_owner": old["owner_id"],
        "interrupted_epoch": old["epoch"],
        "interrupted_assistant_id": old["assistant_message_id"],
    }
    sessions.insert_message_sync(conn, cont, lease.session_id, "synthetic", seq, data, now)
    return cont


def _upsert_recovery_sync(
    conn: Conn, old: dict[str, Any], cont: str, phase: ExecutionPhase, now: int
) -> None:
    conn.execute(
        "INSERT INTO session_recovery (execution_id, session_id, assistant_message_id, "
        "continuation_message_id, phase, wake_pending, wake_attempts, time_created) "
        "VALUES (?, ?, ?, ?, ?, 1, 1, ?) ON CONFLICT (execution_id) DO UPDATE SET "
        "phase = excluded.phase, wake_pending = 1, wake_attempts = session_recovery.wake_attempts + 1, "
        "assistant_message_id = coalesce(excluded.assistant_message_id, session_recovery.assistant_message_id)",
        (old["id"], old["session_id"], old["assistant_message_id"], cont, phase, now),
    )


def park_sync(conn: Conn, old: dict[str, Any], attempts: int, actor: str, now: int) -> None:
    """Stop retrying an execution: record why on both rows and on its continuation message."""
    reason = (
        f"parked after {attempts} recovery attempts (budget spent); inspect the session, then "
        f"`rem release {old['id']}` to retry it"
    )
    conn.execute("UPDATE session_execution SET recovery_error = ? WHERE id = ?", (reason, old["id"]))
    conn.execute("UPDATE session_recovery SET recovery_error = ? WHERE execution_id = ?", (reason, old["id"]))
    conn.execute(
        "UPDATE session_message SET data = json_set(data, '$.status', 'error', '$.error', ?), "
        "time_updated = ? WHERE id = ?",
        (reason, now, projection.continuation_id(old["id"])),
    )
    append_event_sync(
        conn,
        kind=EventKind.RECOVERY_PARKED,
        actor=actor,
        session_id=old["session_id"],
        target=old["id"],
        data={"attempts": attempts, "reason": reason},
        now=now,
    )
    log.warning("parked execution %s of session %s: %s", old["id"], old["session_id"], reason)


def mark_continuing_sync(conn: Conn, execution_id: str) -> None:
    """The new owner resumed work: the recovery moves to `continue`."""
    conn.execute("UPDATE session_recovery SET phase = 'continue' WHERE execution_id = ?", (execution_id,))


def finish_sync(conn: Conn, execution_id: str) -> None:
    """The recovered execution ended cleanly: its recovery needs no more wakes."""
    conn.execute(
        "UPDATE session_recovery SET wake_pending = 0, phase = 'continue' WHERE execution_id = ?",
        (execution_id,),
    )


def unpark_sync(conn: Conn, execution_id: str) -> bool:
    """An operator released a parked execution: a fresh recovery budget (its "try again"); whether
    its recovery row was parked."""
    conn.execute("UPDATE session_execution SET recovery_error = NULL WHERE id = ?", (execution_id,))
    return (
        conn.execute(
            "UPDATE session_recovery SET recovery_error = NULL, wake_attempts = 0 "
            "WHERE execution_id = ? AND recovery_error IS NOT NULL",
            (execution_id,),
        ).rowcount
        > 0
    )
