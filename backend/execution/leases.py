"""Execution leases: one `session_execution` row per session, fenced by a growing epoch.

The epoch is drawn from `session.lease_epoch`, so it grows on every grant
(claim, takeover, operator release) and survives the row's deletion: an
owner that lost its lease can never hold a matching epoch again. Every
lease-dependent transaction starts with `guard_sync`, an UPDATE whose WHERE names
`(id, owner_id, epoch)`; 0 rows changed raises `LeaseLost` and the
transaction rolls back. Because every write transaction is BEGIN IMMEDIATE
(SQLite's single writer), nobody can take the lease over between the guard
and the rest of that transaction, so the whole transaction is fenced. On
PostgreSQL the executor's turn transactions send the guard unread
(`guard_sync(unread=True)`, `db.fenced_write(unread=True)`): the server fails the
statement that changed no row, which fails the transaction (or its group
member's savepoint) as `LeaseLost`, before anything of it commits.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiosqlite

from backend.core import clock
from backend.core.errors import LeaseLost, LeaseNotFound, Refused
from backend.core.settings import settings
from backend.store import workers
from backend.store.db import Conn, Database, Row, execute_unread, fenced_write, in_thread, skip_locked_sync
from backend.store.events import EventKind, append_event_sync
from backend.store.workers import LeaseKind, WorkerState

log = logging.getLogger("rem.leases")


def lease_ms() -> int:
    """The execution lease length: `REM_EXECUTION_LEASE_MS`, default 30 000 (docs/architecture.md#leases-epochs-and-fencing)."""
    return settings.execution_lease_ms


def renew_every_ms(length_ms: int | None = None) -> int:
    """Renew at a third of the lease, so two renewals can fail before it expires."""
    return (length_ms or lease_ms()) // 3


def new_execution_id() -> str:
    """A fresh, time-ordered execution id."""
    return f"exe_{clock.now_ms():013x}{uuid.uuid4().hex[:12]}"


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


@dataclass(kw_only=True)
class Lease:
    """What an owner holds: the fence every write of the execution names."""

    execution_id: str
    session_id: str
    owner_id: str
    epoch: int
    expires_at: int
    length_ms: int
    # set by the renewer when a renewal found the lease gone: stop, publish nothing
    lost: bool = False


def next_epoch_sync(conn: Conn, session_id: str) -> int:
    """Bump and return the session's lease epoch (inside the granting transaction)."""
    row = conn.execute(
        "UPDATE session SET lease_epoch = lease_epoch + 1 WHERE id = ? RETURNING lease_epoch", (session_id,)
    ).fetchone()
    if row is None:
        raise LeaseNotFound(f"no session {session_id!r}")
    return int(row["lease_epoch"])


def claim_execution_sync(
    conn: Conn, session_id: str, owner_id: str, *, now: int, length_ms: int | None = None
) -> Lease | None:
    """Grant a fresh lease on an idle session (inside the caller's tx); None if one exists.

    The session row is locked first (PostgreSQL: a rival claiming it now is
    skipped, not waited for), so the read below sees every committed lease.
    """
    if not lock_session_sync(conn, session_id):
        return None
    if conn.execute("SELECT 1 FROM session_execution WHERE session_id = ?", (session_id,)).fetchone():
        return None
    return _grant_sync(conn, session_id, owner_id, next_epoch_sync(conn, session_id), now, length_ms)


def claim_locked_execution_sync(
    conn: Conn, session_id: str, owner_id: str, held_epoch: int, *, now: int, length_ms: int | None = None
) -> Lease:
    """`claim_execution_sync` for a caller whose transaction already holds the session row's lock,
    read the session's `lease_epoch` with it (`lock_session_epoch_sync`) and saw no execution
    row under it: every write goes unread (PostgreSQL: the claim costs no round trip of its own)."""
    epoch = held_epoch + 1
    # under the row lock nobody else moves the epoch; the condition is belt and braces
    fenced_write(
        conn,
        "UPDATE session SET lease_epoch = ? WHERE id = ? AND lease_epoch = ?",
        (epoch, session_id, held_epoch),
        f"session {session_id}'s lease epoch moved under this claim's lock",
        unread=True,
    )
    return _grant_sync(conn, session_id, owner_id, epoch, now, length_ms)


def _grant_sync(
    conn: Conn, session_id: str, owner_id: str, epoch: int, now: int, length_ms: int | None
) -> Lease:
    length = length_ms or lease_ms()
    lease = Lease(
        execution_id=new_execution_id(),
        session_id=session_id,
        owner_id=owner_id,
        epoch=epoch,
        expires_at=now + length,
        length_ms=length,
    )
    # unread: the session row is locked and had no execution, so nothing but a broken
    # store can fail it, and that fails the transaction where it is sent
    execute_unread(
        conn,
        "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, step, time_created, "
        "time_renewed, expires_at) VALUES (?, ?, ?, ?, 'ready', 0, ?, ?, ?)",
        (lease.execution_id, session_id, owner_id, epoch, now, now, lease.expires_at),
    )
    return lease


def lock_session_sync(conn: Conn, session_id: str) -> bool:
    """Lock the session row for this claim; False if a rival holds it (PostgreSQL) or it does not exist.

    A missing session still raises LeaseNotFound at the epoch bump, as before.
    """
    locked = conn.execute(
        f"SELECT 1 FROM session WHERE id = ?{skip_locked_sync(conn)}", (session_id,)
    ).fetchone()
    if locked is None:
        return conn.execute("SELECT 1 FROM session WHERE id = ?", (session_id,)).fetchone() is None
    return True


def lock_session_epoch_sync(conn: Conn, session_id: str) -> int | None:
    """Lock the session row for a claim and read its lease epoch; None if a rival holds it
    (PostgreSQL: skipped, not waited for) or the session does not exist."""
    row = conn.execute(
        f"SELECT lease_epoch FROM session WHERE id = ?{skip_locked_sync(conn)}", (session_id,)
    ).fetchone()
    return None if row is None else int(row["lease_epoch"])


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
    length = length_ms or lease_ms()
    epoch = next_epoch_sync(conn, old["session_id"])
    # the caller's BEGIN IMMEDIATE holds the write lock since the read; the epoch check is belt and braces
    changed = conn.execute(
        "UPDATE session_execution SET owner_id = ?, epoch = ?, expires_at = ?, time_renewed = ? "
        "WHERE id = ? AND epoch = ?",
        (owner_id, epoch, now + length, now, execution_id, old["epoch"]),
    ).rowcount
    if not changed:
        return None
    lease = Lease(
        execution_id=execution_id,
        session_id=old["session_id"],
        owner_id=owner_id,
        epoch=epoch,
        expires_at=now + length,
        length_ms=length,
    )
    return lease, dict(old)


def _lost_message(lease: Lease) -> str:
    return f"execution {lease.execution_id} is no longer held by {lease.owner_id} at epoch {lease.epoch}"


def _lost(lease: Lease) -> LeaseLost:
    return LeaseLost(_lost_message(lease))


# A deliberately broken build for proving the drills can fail: fenced writes stop
# checking (owner, epoch). Never set outside tests.
UNSAFE_NO_FENCING = settings.unsafe_disable_fencing and settings.test_mode
FENCE = "id = :id" if UNSAFE_NO_FENCING else "id = :id AND owner_id = :owner AND epoch = :epoch"


def guard_sync(conn: Conn, lease: Lease, *, now: int, unread: bool = False, **changes: Any) -> None:
    """Renew the lease and apply `changes` to its row, or raise LeaseLost (0 rows changed).

    `unread`: on PostgreSQL the guard is sent with the transaction's next
    statement instead of on a round trip of its own, and a lost lease fails
    the transaction where it is sent (`db.fenced_write(unread=True)`); for a transaction
    that a lost lease ends whole anyway (the executor's turn transactions).
    """
    sets = "".join(f", {column} = :{column}" for column in changes)
    sql = f"UPDATE session_execution SET expires_at = :expires, time_renewed = :now{sets} WHERE {FENCE}"
    params = {
        **changes,
        "expires": now + lease.length_ms,
        "now": now,
        "id": lease.execution_id,
        "owner": lease.owner_id,
        "epoch": lease.epoch,
    }
    fenced_write(conn, sql, params, _lost_message(lease), unread=unread)
    lease.expires_at = now + lease.length_ms


def end_execution_sync(conn: Conn, lease: Lease, *, unread: bool = False) -> None:
    """The clean end: delete the row (fenced); the epoch lives on in `session.lease_epoch`.

    `unread` as for `guard_sync`.
    """
    sql = f"DELETE FROM session_execution WHERE {FENCE}"
    params = {"id": lease.execution_id, "owner": lease.owner_id, "epoch": lease.epoch}
    fenced_write(conn, sql, params, _lost_message(lease), unread=unread)


def hand_back_execution_sync(conn: Conn, lease: Lease, *, actor: str, now: int) -> None:
    """Give a held lease back early (drain): expire it now and fence ourselves with a new epoch."""
    epoch = next_epoch_sync(conn, lease.session_id)
    if not conn.execute(
        "UPDATE session_execution SET epoch = ?, expires_at = ? WHERE id = ? AND owner_id = ? AND epoch = ?",
        (epoch, now, lease.execution_id, lease.owner_id, lease.epoch),
    ).rowcount:
        raise _lost(lease)
    append_event_sync(
        conn,
        kind=EventKind.EXECUTION_HANDED_BACK,
        actor=actor,
        session_id=lease.session_id,
        target=lease.execution_id,
        data={"epoch_before": lease.epoch, "epoch": epoch},
        now=now,
    )


async def renew(db: Database, leases: list[Lease]) -> list[Lease]:
    """Renew several leases in one transaction; returns the ones that were lost."""
    now = clock.now_ms()

    def renew_all_sync(conn: Conn) -> list[Lease]:
        lost = []
        for lease in leases:
            try:
                guard_sync(conn, lease, now=now)
            except LeaseLost:
                lost.append(lease)
        return lost

    return await db.write_in_thread(renew_all_sync)


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

    return await db.write_in_thread(claim_journaled_sync)


async def release_execution(
    conn: aiosqlite.Connection,
    execution_id: str,
    *,
    expected_epoch: int | None = None,
    force: bool = False,
    actor: str,
    now: int,
) -> dict[str, Any]:
    """Expire an execution lease now and bump its epoch so any executor takes it over at once.

    Runs inside the caller's `db.tx()`. The old owner is fenced (its epoch no
    longer matches). Refused when the lease was re-granted since the operator
    saw `expected_epoch`, unless `force`. A parked execution (recovery budget
    spent) is un-parked with a fresh budget: releasing it is the operator's
    "try again".
    """
    return await in_thread(conn, release_execution_sync, execution_id, expected_epoch, force, actor, now)


def release_execution_sync(
    conn: Conn, execution_id: str, expected_epoch: int | None, force: bool, actor: str, now: int
) -> dict[str, Any]:
    """The body of `release_execution`, on the connection's thread."""
    row = conn.execute("SELECT * FROM session_execution WHERE id = ?", (execution_id,)).fetchone()
    if row is None:
        raise LeaseNotFound(
            f"no execution lease {execution_id!r}: it may have completed; "
            "see `rem status` for the current leases"
        )
    if expected_epoch is not None and row["epoch"] != expected_epoch and not force:
        raise Refused(
            f"execution {execution_id} is at epoch {row['epoch']}, not the epoch {expected_epoch} "
            "you saw: it was taken over or released since; look again, or pass --force"
        )
    epoch = next_epoch_sync(conn, row["session_id"])
    conn.execute(
        "UPDATE session_execution SET epoch = ?, expires_at = ?, recovery_error = NULL WHERE id = ?",
        (epoch, now, execution_id),
    )
    unparked = (
        conn.execute(
            "UPDATE session_recovery SET recovery_error = NULL, wake_attempts = 0 "
            "WHERE execution_id = ? AND recovery_error IS NOT NULL",
            (execution_id,),
        ).rowcount
        > 0
    )
    owner = conn.execute(
        "SELECT state, heartbeat_at FROM worker WHERE owner_id = ?", (row["owner_id"],)
    ).fetchone()
    alive = (
        bool(owner)
        and owner["state"] != WorkerState.STOPPED
        and workers.heartbeat_alive(owner["heartbeat_at"], now)
    )
    seen = {
        "owner_id": row["owner_id"],
        "epoch": row["epoch"],
        "phase": row["phase"],
        "expires_at": row["expires_at"],
        "time_left_ms": row["expires_at"] - now,
    }
    result = {
        "kind": LeaseKind.EXECUTION,
        "id": execution_id,
        "execution_id": execution_id,
        "session_id": row["session_id"],
        "owner_id": row["owner_id"],
        "owner_alive": alive,
        "old_epoch": row["epoch"],
        "new_epoch": epoch,
        "expected_epoch": expected_epoch,
        "forced": force,
        "seen": seen,
        "unparked": unparked or row["recovery_error"] is not None,
        "released_at": now,
    }
    append_event_sync(
        conn,
        kind=EventKind.OPERATOR_RELEASE,
        actor=actor,
        session_id=row["session_id"],
        target=execution_id,
        data=result,
        now=now,
    )
    log.info("released execution %s (epoch %s -> %s) by %s", execution_id, row["epoch"], epoch, actor)
    return result
