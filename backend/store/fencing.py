"""Every lease rem grants, one way: claim, renew, fenced write, hand back, release.

A lease is a row that names its holder (`owner_id`), a fencing `epoch` that
grows on every grant, and an expiry. Each kind lives in a table of its own
(`TABLES`): a session's execution (`session_execution`, whose epoch is drawn
from `session.lease_epoch`, so it outlives the row), a session's summary job
(`summary_job`) and its Dream claim (`dream_state`), whose epochs are their
rows' own. Whatever the kind:

* a grant (a claim, a takeover) bumps the epoch, so a holder that lost its
  lease never again holds a matching one;
* every write that depends on holding it names `(owner_id, epoch)` in its
  WHERE (`fence_sql`: the one place that clause is written) and treats 0
  rows changed as `LeaseLost`: stop, publish nothing (invariant 3, docs/architecture.md#guarantees-and-invariants).
  Every write transaction is BEGIN IMMEDIATE (SQLite's single writer), so
  nobody takes the lease over between a fenced statement and the rest of its
  transaction: a transaction that starts with one is fenced whole. On
  PostgreSQL a fenced write may be sent unread (`unread=True`): the server
  fails the statement that changed no row (`rem_fenced`), which fails the
  transaction, or its group member's savepoint, as `LeaseLost` before any of
  it commits (`backend.store.db.fenced_write`);
* the holder renews once a third of the lease is used (`Lease.renewal_due`;
  a daemon's `backend.store.lease_keeper.LeaseKeeper` plans it), so two
  renewals can fail before it expires; a fenced write that renews
  (`guard_sync`) counts as one;
* an operator's release (`release_sync`) expires the lease now and bumps its
  epoch, fenced on the grant the operator saw: refused when it was renewed or
  taken over since, unless forced. The operator's journal entry is
  `backend.ops`'s to write, in the same transaction.

Rows of another table may carry a copy of a lease's fence (say, a tool call
started under an execution lease): such a table is a `FencedTable`, written
with `write_row_sync` and the lease's `fence`. A new kind of lease is one
more `LeaseTable` in `TABLES`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from backend.core import clock
from backend.core.errors import LeaseLost, LeaseNotFound, Refused
from backend.core.settings import settings
from backend.store.db import Conn, Database, Row, execute_unread, fenced_write, in_thread, skip_locked_sync
from backend.store.workers import LeaseKind

# A deliberately broken build for proving the drills can fail: fenced writes stop
# checking (owner, epoch). Never set outside tests.
UNSAFE_NO_FENCING = settings.unsafe_disable_fencing and settings.test_mode

# the parameters the fence and the grant statements bind (callers' own names never clash)
OWNER, EPOCH, KEY, EXPIRES = "fence_owner", "fence_epoch", "fence_key", "fence_expires"


def fence_sql(prefix: str = "", *, owner: str = f":{OWNER}", epoch: str = f":{EPOCH}") -> str:
    """The fence: the row still names this owner at this epoch (`prefix`: a table alias and dot)."""
    if UNSAFE_NO_FENCING:
        return "1 = 1"
    return f"{prefix}owner_id = {owner} AND {prefix}epoch = {epoch}"


@dataclass(frozen=True, kw_only=True)
class FencedTable:
    """A table whose rows carry a lease's `(owner_id, epoch)`: a write to one names both."""

    name: str
    key: str  # the column naming one row


@dataclass(frozen=True, kw_only=True)
class LeaseTable(FencedTable):
    """Where one kind of lease lives, and how it is granted."""

    kind: LeaseKind
    expires: str  # the expiry column
    held: str  # SQL: the row holds a grant (an operator may release it)
    session_epoch: bool  # the epoch comes from `session.lease_epoch`, else it is the row's own
    renewed: str | None = None  # a column stamped with each renewal's time
    noun: str  # how a message names one lease, before its key


EXECUTION = LeaseTable(
    kind=LeaseKind.EXECUTION,
    name="session_execution",
    key="id",
    expires="expires_at",
    held="1 = 1",  # the row exists only while an execution is in progress or awaits takeover
    session_epoch=True,
    renewed="time_renewed",
    noun="execution",
)
SUMMARY_JOB = LeaseTable(
    kind=LeaseKind.SUMMARY_JOB,
    name="summary_job",
    key="session_id",
    expires="lease_expires_at",
    held="status = 'in_progress' AND lease_expires_at IS NOT NULL",
    session_epoch=False,
    noun="summary_job lease of",
)
DREAM = LeaseTable(
    kind=LeaseKind.DREAM,
    name="dream_state",
    key="session_id",
    expires="lease_expires_at",
    held="digest_state = 'in_progress' AND lease_expires_at IS NOT NULL",
    session_epoch=False,
    noun="dream lease of",
)
TABLES: dict[LeaseKind, LeaseTable] = {table.kind: table for table in (EXECUTION, SUMMARY_JOB, DREAM)}


@dataclass(frozen=True)
class Fence:
    """What a fenced write names: the holder and the epoch of its grant."""

    owner_id: str
    epoch: int

    def params(self) -> dict[str, Any]:
        return {OWNER: self.owner_id, EPOCH: self.epoch}


@dataclass(kw_only=True)
class Lease:
    """A grant its holder keeps: the fence every write of the work names, and when it runs out."""

    table: LeaseTable
    key: str  # its row: an execution id, or a session id
    session_id: str
    owner_id: str
    epoch: int
    expires_at: int
    length_ms: int
    # set when a renewal found the lease gone: stop, publish nothing
    lost: bool = False

    @property
    def kind(self) -> LeaseKind:
        return self.table.kind

    @property
    def fence(self) -> Fence:
        return Fence(self.owner_id, self.epoch)

    def renewal_due_at(self) -> int:
        """When a third of the lease is used since its last renewal."""
        return self.expires_at - self.length_ms + renew_every_ms(self.length_ms)

    def renewal_due(self, now: int) -> bool:
        return now >= self.renewal_due_at()

    def lost_message(self) -> str:
        return f"{self.table.noun} {self.key} is no longer held by {self.owner_id} at epoch {self.epoch}"


@dataclass(kw_only=True)
class ExecutionLease(Lease):
    """A session's execution lease (its key is the execution id)."""

    table: LeaseTable = EXECUTION

    @property
    def execution_id(self) -> str:
        return self.key


def renew_every_ms(length_ms: int) -> int:
    """Renew at a third of the lease, so two renewals can fail before it expires."""
    return length_ms // 3


# -- grants ------------------------------------------------------------------------


def claim_row_sync(
    conn: Conn,
    table: LeaseTable,
    key: str,
    owner_id: str,
    *,
    now: int,
    length_ms: int,
    when: str = "1 = 1",
    sets: str = "",
    params: Mapping[str, Any] | None = None,
    returning: str = "",
) -> tuple[Lease, Row] | None:
    """Grant the lease on row `key` of a row-epoch table if `when` holds (inside the caller's tx).

    One statement: the epoch bump, the grant and the caller's own `sets` (SQL,
    with `params`); returns the lease and the row's `returning` columns, or
    None when `when` did not hold (held by another, not eligible, moved).
    """
    assert not table.session_epoch, f"{table.name} draws its epochs from the session"
    extra = f", {sets}" if sets else ""
    sql = (
        f"UPDATE {table.name} SET owner_id = :{OWNER}, epoch = epoch + 1, {table.expires} = :{EXPIRES}{extra} "
        f"WHERE {table.key} = :{KEY} AND ({when}) RETURNING epoch{', ' + returning if returning else ''}"
    )
    bound = {**(params or {}), OWNER: owner_id, EXPIRES: now + length_ms, KEY: key}
    row = conn.execute(sql, bound).fetchone()
    if row is None:
        return None
    lease = Lease(
        table=table,
        key=key,
        session_id=key,
        owner_id=owner_id,
        epoch=int(row["epoch"]),
        expires_at=now + length_ms,
        length_ms=length_ms,
    )
    return lease, row


async def claim_row(
    conn: aiosqlite.Connection, table: LeaseTable, key: str, owner_id: str, **how: Any
) -> tuple[Lease, Row] | None:
    """`claim_row_sync` inside a transaction opened with `Database.tx()`."""
    return await in_thread(conn, lambda raw: claim_row_sync(raw, table, key, owner_id, **how))


def next_session_epoch_sync(conn: Conn, session_id: str) -> int:
    """Bump and return the session's lease epoch (inside the granting transaction)."""
    row = conn.execute(
        "UPDATE session SET lease_epoch = lease_epoch + 1 WHERE id = ? RETURNING lease_epoch", (session_id,)
    ).fetchone()
    if row is None:
        raise LeaseNotFound(f"no session {session_id!r}")
    return int(row["lease_epoch"])


def lock_session_sync(conn: Conn, session_id: str) -> bool:
    """Lock the session row for a claim; False if a rival holds it (PostgreSQL) or it does not exist.

    A missing session still raises LeaseNotFound at the epoch bump.
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


def new_execution_id() -> str:
    """A fresh, time-ordered execution id."""
    return f"exe_{clock.now_ms():013x}{uuid.uuid4().hex[:12]}"


def claim_execution_sync(
    conn: Conn, session_id: str, owner_id: str, *, now: int, length_ms: int
) -> ExecutionLease | None:
    """Grant a fresh execution lease on an idle session (inside the caller's tx); None if one exists.

    The session row is locked first (PostgreSQL: a rival claiming it now is
    skipped, not waited for), so the read below sees every committed lease.
    """
    if not lock_session_sync(conn, session_id):
        return None
    if conn.execute("SELECT 1 FROM session_execution WHERE session_id = ?", (session_id,)).fetchone():
        return None
    return _grant_execution_sync(
        conn, session_id, owner_id, next_session_epoch_sync(conn, session_id), now, length_ms
    )


def claim_locked_execution_sync(
    conn: Conn, session_id: str, owner_id: str, held_epoch: int, *, now: int, length_ms: int
) -> ExecutionLease:
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
    return _grant_execution_sync(conn, session_id, owner_id, epoch, now, length_ms)


def _grant_execution_sync(
    conn: Conn, session_id: str, owner_id: str, epoch: int, now: int, length_ms: int
) -> ExecutionLease:
    lease = ExecutionLease(
        key=new_execution_id(),
        session_id=session_id,
        owner_id=owner_id,
        epoch=epoch,
        expires_at=now + length_ms,
        length_ms=length_ms,
    )
    # unread: the session row is locked and had no execution, so nothing but a broken
    # store can fail it, and that fails the transaction where it is sent
    execute_unread(
        conn,
        "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, step, time_created, "
        "time_renewed, expires_at) VALUES (?, ?, ?, ?, 'ready', 0, ?, ?, ?)",
        (lease.key, session_id, owner_id, epoch, now, now, lease.expires_at),
    )
    return lease


def take_over_sync(
    conn: Conn, table: LeaseTable, seen: Row, owner_id: str, *, now: int, length_ms: int
) -> Lease | None:
    """Grant `owner_id` the lease of row `seen` (read, and on PostgreSQL locked, in this tx) under a new epoch.

    None when the row moved since it was read (under the caller's lock it
    cannot: the epoch condition is belt and braces).
    """
    session_id = seen["session_id"]
    epoch = next_session_epoch_sync(conn, session_id) if table.session_epoch else int(seen["epoch"]) + 1
    renewed = f", {table.renewed} = :now" if table.renewed else ""
    changed = conn.execute(
        f"UPDATE {table.name} SET owner_id = :owner, epoch = :epoch, {table.expires} = :expires{renewed} "
        f"WHERE {table.key} = :key AND epoch = :seen",
        {
            "owner": owner_id,
            "epoch": epoch,
            "expires": now + length_ms,
            "now": now,
            "key": seen[table.key],
            "seen": seen["epoch"],
        },
    ).rowcount
    if not changed:
        return None
    kind = ExecutionLease if table is EXECUTION else Lease
    return kind(
        table=table,
        key=seen[table.key],
        session_id=session_id,
        owner_id=owner_id,
        epoch=epoch,
        expires_at=now + length_ms,
        length_ms=length_ms,
    )


# -- renewal and fenced writes -------------------------------------------------------


def write_row_sync(
    conn: Conn,
    table: FencedTable,
    key: str,
    fence: Fence,
    sets: str,
    params: Mapping[str, Any] | None = None,
    *,
    lost: str,
    unread: bool = False,
) -> None:
    """`UPDATE table SET sets` on row `key` if it still carries `fence`, else raise `LeaseLost(lost)`.

    `unread` (PostgreSQL): sent with the transaction's next statement, failing
    it when the row moved; only where a lost lease ends the whole
    transaction anyway (see `backend.store.db.fenced_write`).
    """
    sql = f"UPDATE {table.name} SET {sets} WHERE {table.key} = :{KEY} AND {fence_sql()}"
    fenced_write(conn, sql, {**(params or {}), KEY: key, **fence.params()}, lost, unread=unread)


def write_sync(
    conn: Conn,
    lease: Lease,
    sets: str,
    params: Mapping[str, Any] | None = None,
    *,
    lost: str | None = None,
    unread: bool = False,
) -> None:
    """A fenced write to the lease's own row (`write_row_sync`), without renewing it."""
    message = lost or lease.lost_message()
    write_row_sync(conn, lease.table, lease.key, lease.fence, sets, params, lost=message, unread=unread)


def write_if_held_sync(conn: Conn, lease: Lease, sets: str, params: Mapping[str, Any] | None = None) -> bool:
    """`write_sync` for a write that is simply skipped once the lease is lost: whether it was written."""
    sql = f"UPDATE {lease.table.name} SET {sets} WHERE {lease.table.key} = :{KEY} AND {fence_sql()}"
    return bool(conn.execute(sql, {**(params or {}), KEY: lease.key, **lease.fence.params()}).rowcount)


def read_held_sync(conn: Conn, lease: Lease, columns: str) -> Row | None:
    """`columns` of the lease's row while it still carries the lease's fence, else None (lost)."""
    return conn.execute(
        f"SELECT {columns} FROM {lease.table.name} WHERE {lease.table.key} = :{KEY} AND {fence_sql()}",
        {KEY: lease.key, **lease.fence.params()},
    ).fetchone()


def guard_sync(conn: Conn, lease: Lease, *, now: int, unread: bool = False, **changes: Any) -> None:
    """Renew the lease and apply `changes` (column=value) to its row, or raise LeaseLost.

    The first statement of a transaction that must be fenced whole: after it,
    nobody can take the lease over until the transaction ends.
    """
    table = lease.table
    sets = f"{table.expires} = :fence_renewed_until" + (
        f", {table.renewed} = :fence_now" if table.renewed else ""
    )
    sets += "".join(f", {column} = :set_{column}" for column in changes)
    params = {"fence_renewed_until": now + lease.length_ms, "fence_now": now}
    params.update({f"set_{column}": value for column, value in changes.items()})
    write_sync(conn, lease, sets, params, unread=unread)
    lease.expires_at = now + lease.length_ms


def end_sync(conn: Conn, lease: Lease, *, unread: bool = False) -> None:
    """The clean end of a lease whose row lives only while it is held: delete the row (fenced).

    An execution's epoch lives on in `session.lease_epoch`.
    """
    sql = f"DELETE FROM {lease.table.name} WHERE {lease.table.key} = :{KEY} AND {fence_sql()}"
    fenced_write(conn, sql, {KEY: lease.key, **lease.fence.params()}, lease.lost_message(), unread=unread)


def renew_sync(conn: Conn, leases: Iterable[Lease], now: int) -> list[Lease]:
    """Renew every lease in the caller's transaction; returns the lost ones (marked `lost`)."""
    lost = []
    for lease in leases:
        try:
            guard_sync(conn, lease, now=now)
        except LeaseLost:
            lease.lost = True
            lost.append(lease)
    return lost


async def renew(db: Database, leases: Sequence[Lease]) -> list[Lease]:
    """Renew several leases in one transaction; returns the ones that were lost."""
    now = clock.now_ms()
    return await db.write_in_thread(lambda conn: renew_sync(conn, leases, now))


async def write(
    conn: aiosqlite.Connection, lease: Lease, sets: str, params: Mapping[str, Any], **how: Any
) -> None:
    """`write_sync` inside a transaction opened with `Database.tx()`."""
    await in_thread(conn, lambda raw: write_sync(raw, lease, sets, params, **how))


async def write_if_held(
    conn: aiosqlite.Connection, lease: Lease, sets: str, params: Mapping[str, Any]
) -> bool:
    """`write_if_held_sync` inside a transaction opened with `Database.tx()`."""
    return await in_thread(conn, lambda raw: write_if_held_sync(raw, lease, sets, params))


async def read_held(conn: aiosqlite.Connection, lease: Lease, columns: str) -> Row | None:
    """`read_held_sync` inside a transaction opened with `Database.tx()`."""
    return await in_thread(conn, lambda raw: read_held_sync(raw, lease, columns))


async def guard(conn: aiosqlite.Connection, lease: Lease, *, now: int) -> None:
    """`guard_sync` (renew, or raise LeaseLost) inside a transaction opened with `Database.tx()`."""
    await in_thread(conn, lambda raw: guard_sync(raw, lease, now=now))


# -- giving a lease back -----------------------------------------------------------


def _next_epoch_sync(conn: Conn, table: LeaseTable, session_id: str, epoch: int) -> int:
    return next_session_epoch_sync(conn, session_id) if table.session_epoch else epoch + 1


def hand_back_sync(conn: Conn, lease: Lease, *, now: int) -> int:
    """The holder gives its lease back early (a drain): expire it now and fence itself out with a
    new epoch, or raise LeaseLost; returns the new epoch. Any worker takes it over at once."""
    epoch = _next_epoch_sync(conn, lease.table, lease.session_id, lease.epoch)
    write_sync(
        conn, lease, f"epoch = :new_epoch, {lease.table.expires} = :now", {"new_epoch": epoch, "now": now}
    )
    lease.lost = True
    return epoch


@dataclass(frozen=True, kw_only=True)
class Released:
    """What an operator's release did: the grant it saw (its whole row) and the epoch it moved to."""

    table: LeaseTable
    key: str
    seen: dict[str, Any]
    new_epoch: int

    @property
    def old_epoch(self) -> int:
        return int(self.seen["epoch"])

    @property
    def owner_id(self) -> str:
        return str(self.seen["owner_id"])

    @property
    def session_id(self) -> str:
        return str(self.seen["session_id"])

    @property
    def expires_at(self) -> int:
        return int(self.seen[self.table.expires])


def kind_of_sync(conn: Conn, key: str) -> LeaseKind:
    """Which kind of live lease `key` names: an execution id, else a session's job lease."""
    for table in TABLES.values():
        if conn.execute(
            f"SELECT 1 FROM {table.name} WHERE {table.key} = ? AND {table.held}", (key,)
        ).fetchone():
            return table.kind
    raise LeaseNotFound(
        f"no live lease {key!r} (neither an execution id nor a session with a running "
        "summary or Dream job); list leases with `rem status`"
    )


def release_sync(
    conn: Conn, kind: LeaseKind, key: str, *, expected_epoch: int | None, force: bool, now: int
) -> Released:
    """An operator's release: expire the lease now under a new epoch, fencing out its holder.

    Refused when its epoch is not `expected_epoch` (renewed or taken over
    since the operator looked) unless `force`; the write is fenced on the
    grant this transaction read, whatever the operator expected.
    """
    table = TABLES[kind]
    row = conn.execute(
        f"SELECT * FROM {table.name} WHERE {table.key} = ? AND {table.held}", (key,)
    ).fetchone()
    if row is None:
        raise LeaseNotFound(_not_found(table, key))
    seen = dict(row)
    if expected_epoch is not None and seen["epoch"] != expected_epoch and not force:
        raise Refused(_moved(table, key, seen["epoch"], expected_epoch))
    epoch = _next_epoch_sync(conn, table, seen["session_id"], seen["epoch"])
    write_row_sync(
        conn,
        table,
        key,
        Fence(seen["owner_id"], seen["epoch"]),
        f"epoch = :new_epoch, {table.expires} = :now",
        {"new_epoch": epoch, "now": now},
        lost=f"{table.noun} {key} moved while it was being released; look again with `rem status`",
    )
    return Released(table=table, key=key, seen=seen, new_epoch=epoch)


def _not_found(table: LeaseTable, key: str) -> str:
    if table is EXECUTION:
        return f"no execution lease {key!r}: it may have completed; see `rem status` for the current leases"
    return f"no live {table.kind} lease for session {key!r}; see `rem status`"


def _moved(table: LeaseTable, key: str, epoch: int, expected: int) -> str:
    if table is EXECUTION:
        return (
            f"execution {key} is at epoch {epoch}, not the epoch {expected} you saw: it was taken over or "
            "released since; look again, or pass --force"
        )
    return (
        f"{table.kind} lease of {key} is at epoch {epoch}, not {expected}: it was renewed or taken over "
        "since you looked; re-check `rem status`, or pass --force"
    )
