"""Execution leases: one `session_execution` row per session, fenced by a growing epoch.

The grant, the renewal, the fenced writes and the release are
`backend.store.fencing`'s, the same for every lease; this module names what
is the execution's own: its length (`REM_EXECUTION_LEASE_MS`), its phases,
and when another worker may take it over. The epoch is drawn from
`session.lease_epoch`, so it grows on every grant (claim, takeover, operator
release) and survives the row's deletion. Every lease-dependent transaction
of a turn starts with `guard_sync`, fenced on `(id, owner_id, epoch)`; on
PostgreSQL the executor sends it unread (`guard_sync(unread=True)`).
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any

from backend.core import clock
from backend.core.settings import settings
from backend.store import fencing, workers
from backend.store.db import Conn, Database, Row, skip_locked_sync
from backend.store.events import EventKind, append_event_sync
from backend.store.fencing import (
    UNSAFE_NO_FENCING,
    guard_sync,
    lock_session_epoch_sync,
    lock_session_sync,
    new_execution_id,
    renew,
)
from backend.store.fencing import ExecutionLease as Lease
from backend.store.fencing import end_sync as end_execution_sync
from backend.store.fencing import next_session_epoch_sync as next_epoch_sync

log = logging.getLogger("rem.leases")

# the execution's names for what `backend.store.fencing` does for every lease
__all__ = [
    "UNSAFE_NO_FENCING",
    "ExecutionPhase",
    "Lease",
    "TakeoverReason",
    "claim",
    "claim_execution_sync",
    "claim_locked_execution_sync",
    "end_execution_sync",
    "guard_sync",
    "hand_back_execution_sync",
    "lease_ms",
    "lock_session_epoch_sync",
    "lock_session_sync",
    "new_execution_id",
    "next_epoch_sync",
    "owner_stopped_sync",
    "renew",
    "renew_every_ms",
    "take_over_execution_sync",
    "takeover_reason_sync",
]


def lease_ms() -> int:
    """The execution lease length: `REM_EXECUTION_LEASE_MS`, default 30 000 (docs/architecture.md#leases-epochs-and-fencing)."""
    return settings.execution_lease_ms


def renew_every_ms(length_ms: int | None = None) -> int:
    """Renew at a third of the lease, so two renewals can fail before it expires."""
    return fencing.renew_every_ms(length_ms or lease_ms())


class ExecutionPhase(StrEnum):
    """Where an execution is (`session_execution.phase`; a recovery row never is `safe`)."""

    READY = "ready"  # claimed, or between steps with nothing in flight
    UNKNOWN = "unknown"  # a step with effects in flight: a takeover cannot know what landed
    SAFE = "safe"  # the step is durably projected
    CONTINUE = "continue"  # taken over: the new owner continues after the continuation message


class TakeoverReason(StrEnum):
    """Why an execution may be taken over now."""

    EXPIRED = "expired"  # its lease ran out
    OWNER_STOPPED = "owner_stopped"  # the worker registry says its owner is gone
    UNPARKED = "unparked"  # an operator's decision ended its wait (`backend.execution.parking`)


def claim_execution_sync(
    conn: Conn, session_id: str, owner_id: str, *, now: int, length_ms: int | None = None
) -> Lease | None:
    """Grant a fresh lease on an idle session (inside the caller's tx); None if one exists."""
    return fencing.claim_execution_sync(
        conn, session_id, owner_id, now=now, length_ms=length_ms or lease_ms()
    )


def claim_locked_execution_sync(
    conn: Conn, session_id: str, owner_id: str, held_epoch: int, *, now: int, length_ms: int | None = None
) -> Lease:
    """`claim_execution_sync` under the session row's lock already held (`fencing.claim_locked_execution_sync`)."""
    return fencing.claim_locked_execution_sync(
        conn, session_id, owner_id, held_epoch, now=now, length_ms=length_ms or lease_ms()
    )


def owner_stopped_sync(conn: Conn, owner_id: str, host: str) -> bool:
    """Whether the registry says the owner process on `host` is gone (it stopped, or its supervisor saw it exit).

    Only a worker on the owner's own host asks (`host` is the asker's): a
    record of another host's process is waited out, or released by an operator.
    """
    return (
        conn.execute(
            "SELECT 1 FROM worker WHERE owner_id = ? AND state = 'stopped' AND host = ?", (owner_id, host)
        ).fetchone()
        is not None
    )


def takeover_reason_sync(conn: Conn, row: Row, now: int) -> TakeoverReason | None:
    """Why the execution may be taken over now by a worker of this host, or None if it may not.

    An owner recorded as stopped cannot renew, so waiting out its lease only
    delays recovery; fencing keeps an early takeover safe even if it were alive.
    That shortcut is the owner's host's alone (its supervisor saw the pid
    exit; a pid means nothing elsewhere): other hosts wait for the expiry.
    """
    if row["recovery_error"] is not None:
        return None
    if row["parked"] is not None and row["parked"] != "decided":
        return None  # it waits for a person (`backend.execution.parking`)
    if row["expires_at"] <= now:
        return TakeoverReason.EXPIRED
    stopped = owner_stopped_sync(conn, row["owner_id"], workers.host_name())
    return TakeoverReason.OWNER_STOPPED if stopped else None


def take_over_execution_sync(
    conn: Conn, execution_id: str, owner_id: str, *, now: int, length_ms: int | None = None
) -> tuple[Lease, dict[str, Any]] | None:
    """Take an expired (or orphaned) execution over inside the caller's tx; returns the lease and old row."""
    old = conn.execute(
        f"SELECT * FROM session_execution WHERE id = ?{skip_locked_sync(conn)}", (execution_id,)
    ).fetchone()
    if old is None or takeover_reason_sync(conn, old, now) is None:
        return None
    lease = fencing.take_over_sync(
        conn, fencing.EXECUTION, old, owner_id, now=now, length_ms=length_ms or lease_ms()
    )
    if lease is None:
        return None
    assert isinstance(lease, Lease)
    return lease, dict(old)


def hand_back_execution_sync(conn: Conn, lease: fencing.Lease, *, actor: str, now: int) -> None:
    """Give a held lease back early (drain): expire it now and fence ourselves with a new epoch."""
    epoch = fencing.hand_back_sync(conn, lease, now=now)
    append_event_sync(
        conn,
        kind=EventKind.EXECUTION_HANDED_BACK,
        actor=actor,
        session_id=lease.session_id,
        target=lease.key,
        data={"epoch_before": lease.epoch, "epoch": epoch},
        now=now,
    )


async def claim(
    db: Database, session_id: str, owner_id: str, *, length_ms: int | None = None
) -> Lease | None:
    """Claim a session's execution lease in its own transaction (journaled)."""
    now = clock.now_ms()

    def claim_journaled_sync(conn: Conn) -> Lease | None:
        lease = claim_execution_sync(conn, session_id, owner_id, now=now, length_ms=length_ms)
        if lease is not None:
            append_event_sync(
                conn,
                kind=EventKind.EXECUTION_CLAIMED,
                actor=owner_id,
                session_id=session_id,
                target=lease.execution_id,
                data={"epoch": lease.epoch},
                now=now,
            )
        return lease

    return await db.write_in_thread(claim_journaled_sync, key=session_id)
