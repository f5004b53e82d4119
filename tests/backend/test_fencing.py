"""Every lease kind through the one fencing module (`backend.store.fencing`), on both stores.

Each test runs for the execution lease, the summary job and the Dream claim:
a claim is exclusive, renewal runs a third into the lease, a write after a
lost lease changes nothing (invariant 3, docs/architecture.md#guarantees-and-invariants), an operator's release is
fenced on the epoch seen and refused once the lease was granted anew unless
forced. And no module but the fencing module writes the fence clause.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from backend.core import clock
from backend.core.errors import LeaseLost, LeaseNotFound, Refused
from backend.runtime.context import Context
from backend.store import fencing
from backend.store.db import Conn, Database
from backend.store.fencing import Lease, LeaseTable
from backend.store.lease_keeper import LeaseKeeper

pytestmark = pytest.mark.both_stores

LENGTH = 9_000
SID = "s1"
# what a grant sets besides the fence: the row is then shown (and releasable) as held
HELD_SETS = {fencing.SUMMARY_JOB: "status = 'in_progress'", fencing.DREAM: "digest_state = 'in_progress'"}


@pytest.fixture(params=list(fencing.TABLES.values()), ids=lambda table: str(table.kind))
def table(request: pytest.FixtureRequest) -> LeaseTable:
    return request.param  # type: ignore[no-any-return]


async def _store(db_ctx: Context) -> Database:
    db = await db_ctx.db()
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, ?, ?)", (SID, now, now)
        )
        await conn.execute(
            "INSERT INTO summary_job (session_id, time_created, time_updated) VALUES (?, ?, ?)",
            (SID, now, now),
        )
        await conn.execute("INSERT INTO dream_state (session_id, time_updated) VALUES (?, ?)", (SID, now))
    return db


def _claim_sync(conn: Conn, table: LeaseTable, owner: str) -> Lease | None:
    """A fresh grant of the session's lease of this kind, or None while another holds it."""
    now = clock.now_ms()
    if table is fencing.EXECUTION:
        return fencing.claim_execution_sync(conn, SID, owner, now=now, length_ms=LENGTH)
    free = f"{table.expires} IS NULL OR {table.expires} <= :now"
    claimed = fencing.claim_row_sync(
        conn,
        table,
        SID,
        owner,
        now=now,
        length_ms=LENGTH,
        when=free,
        sets=HELD_SETS[table],
        params={"now": now},
    )
    return None if claimed is None else claimed[0]


def _take_over_sync(conn: Conn, table: LeaseTable, lost: Lease, owner: str) -> Lease | None:
    """After `lost` expired: another owner's grant of the same lease (a new epoch)."""
    if table is not fencing.EXECUTION:
        return _claim_sync(conn, table, owner)
    row = conn.execute("SELECT * FROM session_execution WHERE id = ?", (lost.key,)).fetchone()
    return fencing.take_over_sync(conn, table, row, owner, now=clock.now_ms(), length_ms=LENGTH)


async def _row(db: Database, lease: Lease) -> dict[str, Any]:
    row = await db.fetchone(f"SELECT * FROM {lease.table.name} WHERE {lease.table.key} = ?", (lease.key,))
    assert row is not None
    return dict(row)


async def _claimed(db: Database, table: LeaseTable, owner: str = "owner-a") -> Lease:
    lease = await db.write_in_thread(lambda conn: _claim_sync(conn, table, owner))
    assert lease is not None and lease.kind == table.kind and lease.owner_id == owner
    return lease


async def _lost_to_b(db: Database, table: LeaseTable, frozen: clock.FrozenClock) -> tuple[Lease, Lease]:
    a = await _claimed(db, table)
    frozen.advance(LENGTH)  # a stalled past its lease
    b = await db.write_in_thread(lambda conn: _take_over_sync(conn, table, a, "owner-b"))
    assert b is not None and b.key == a.key and b.epoch > a.epoch
    return a, b


async def test_a_claim_is_exclusive_and_every_grant_bumps_the_epoch(
    db_ctx: Context, table: LeaseTable, frozen_clock: clock.FrozenClock
) -> None:
    db = await _store(db_ctx)
    a = await _claimed(db, table)
    assert await db.write_in_thread(lambda conn: _claim_sync(conn, table, "owner-b")) is None
    row = await _row(db, a)
    assert (row["owner_id"], row["epoch"], row[table.expires]) == (
        "owner-a",
        a.epoch,
        frozen_clock.now + LENGTH,
    )
    assert await db.read_in_thread(lambda conn: fencing.kind_of_sync(conn, a.key)) == table.kind
    frozen_clock.advance(LENGTH)  # a stalled past its lease: anyone may take it over
    b = await db.write_in_thread(lambda conn: _take_over_sync(conn, table, a, "owner-b"))
    assert b is not None and b.epoch == a.epoch + 1 and (await _row(db, b))["owner_id"] == "owner-b"


async def test_the_holder_renews_a_third_into_its_lease(
    db_ctx: Context, table: LeaseTable, frozen_clock: clock.FrozenClock
) -> None:
    db = await _store(db_ctx)
    keeper = LeaseKeeper()
    assert keeper.next_renewal_at() is None  # nothing held: no renewal is ever planned
    lease = await _claimed(db, table)
    keeper.hold(lease)
    assert keeper.next_renewal_at() == frozen_clock.now + LENGTH // 3
    frozen_clock.advance(LENGTH // 3 - 1)
    assert await keeper.renew_due(db) == [] and (await _row(db, lease))[table.expires] == lease.expires_at
    before = lease.expires_at
    frozen_clock.advance(1)
    assert await keeper.renew_due(db) == []  # renewed, none lost
    assert lease.expires_at == frozen_clock.now + LENGTH > before
    assert (await _row(db, lease))[table.expires] == lease.expires_at
    keeper.drop(lease)
    assert keeper.next_renewal_at() is None and len(keeper) == 0


async def test_a_write_after_a_lost_lease_changes_nothing(
    db_ctx: Context, table: LeaseTable, frozen_clock: clock.FrozenClock
) -> None:
    db = await _store(db_ctx)
    a, b = await _lost_to_b(db, table, frozen_clock)
    taken = await _row(db, b)
    now = clock.now_ms()
    for write in (
        lambda conn: fencing.write_sync(conn, a, "owner_id = 'zombie'"),
        lambda conn: fencing.write_sync(conn, a, "owner_id = 'zombie'", unread=True),
        lambda conn: fencing.guard_sync(conn, a, now=now, unread=True),
        lambda conn: fencing.hand_back_sync(conn, a, now=now),
        lambda conn: fencing.end_sync(conn, a, unread=True),
    ):
        with pytest.raises(LeaseLost, match=f"no longer held by owner-a at epoch {a.epoch}"):
            await db.write_in_thread(write)
    assert not await db.write_in_thread(
        lambda conn: fencing.write_if_held_sync(conn, a, "owner_id = 'zombie'")
    )
    assert await db.read_in_thread(lambda conn: fencing.read_held_sync(conn, a, "epoch")) is None
    assert await fencing.renew(db, [a, b]) == [a] and a.lost and not b.lost
    assert {k: v for k, v in (await _row(db, b)).items() if k not in (table.expires, table.renewed)} == {
        k: v for k, v in taken.items() if k not in (table.expires, table.renewed)
    }  # b's renewal moved its expiry; nothing of a's landed
    await db.write_in_thread(
        lambda conn: fencing.write_sync(conn, b, "owner_id = owner_id")
    )  # b still holds it


async def test_a_release_is_fenced_on_the_epoch_the_operator_saw(
    db_ctx: Context, table: LeaseTable, frozen_clock: clock.FrozenClock
) -> None:
    db = await _store(db_ctx)
    lease = await _claimed(db, table)
    released = await db.write_in_thread(
        lambda conn: fencing.release_sync(
            conn, table.kind, lease.key, expected_epoch=lease.epoch, force=False, now=clock.now_ms()
        )
    )
    assert (released.old_epoch, released.owner_id, released.session_id) == (lease.epoch, "owner-a", SID)
    assert released.new_epoch == lease.epoch + 1 and released.expires_at == lease.expires_at
    row = await _row(db, lease)
    assert (row["epoch"], row[table.expires]) == (released.new_epoch, frozen_clock.now)  # expired now
    if table.session_epoch:  # the next grant draws past it too
        assert await db.scalar("SELECT lease_epoch FROM session WHERE id = ?", (SID,)) == released.new_epoch
    with pytest.raises(LeaseLost):  # the holder is fenced out
        await db.write_in_thread(lambda conn: fencing.guard_sync(conn, lease, now=clock.now_ms()))
    taker = await db.write_in_thread(lambda conn: _take_over_sync(conn, table, lease, "owner-b"))
    assert taker is not None and taker.epoch == released.new_epoch + 1  # taken over at once


async def test_a_release_is_refused_once_the_lease_was_granted_anew_unless_forced(
    db_ctx: Context, table: LeaseTable, frozen_clock: clock.FrozenClock
) -> None:
    db = await _store(db_ctx)
    seen, b = await _lost_to_b(db, table, frozen_clock)  # the operator looked at `seen`; b took over since
    before = await _row(db, b)

    def release(force: bool) -> Any:
        now = clock.now_ms()
        return lambda conn: fencing.release_sync(
            conn, table.kind, b.key, expected_epoch=seen.epoch, force=force, now=now
        )

    with pytest.raises(Refused, match=rf"epoch {b.epoch}, not (the epoch )?{seen.epoch}.*--force"):
        await db.write_in_thread(release(False))
    assert await _row(db, b) == before  # refused: nothing changed
    forced = await db.write_in_thread(release(True))
    assert (forced.old_epoch, forced.owner_id) == (b.epoch, "owner-b")  # fenced on what it read
    with pytest.raises(LeaseLost):
        await db.write_in_thread(lambda conn: fencing.guard_sync(conn, b, now=clock.now_ms()))


async def test_an_unknown_lease_is_named_in_one_line(db_ctx: Context, table: LeaseTable) -> None:
    db = await _store(db_ctx)
    key = "exe_nope" if table is fencing.EXECUTION else SID  # the session's job is not held
    with pytest.raises(LeaseNotFound, match=f"'{key}'.*rem status"):
        await db.write_in_thread(
            lambda conn: fencing.release_sync(conn, table.kind, key, expected_epoch=None, force=False, now=1)
        )
    with pytest.raises(LeaseNotFound, match="no live lease"):
        await db.read_in_thread(lambda conn: fencing.kind_of_sync(conn, key))


# -- one fence clause ---------------------------------------------------------------

BACKEND = Path(__file__).resolve().parents[2] / "backend"
FENCING = BACKEND / "store" / "fencing.py"
# `owner_id = <x> AND [alias.]epoch = <y>` (or the other way round), in any SQL text
FENCE = re.compile(
    r"\bowner_id\s*=\s*[^,]{1,60}?\s+AND\s+(\S*[.}])?epoch\s*="
    r"|\bepoch\s*=\s*[^,]{1,60}?\s+AND\s+(\S*[.}])?owner_id\s*=",
    re.IGNORECASE,
)


def _sql_texts(source: str) -> list[str]:
    """Every string a module spells out: literals, f-strings (with `{}` for their values) and
    the `+` chains of them, each as one text, plus all of them in source order, joined."""
    texts: list[tuple[int, int, str]] = []

    def render(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(render(v) or "{}" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = render(node.left), render(node.right)
            return None if left is None and right is None else (left or "{}") + " " + (right or "{}")
        return None

    for node in ast.walk(ast.parse(source)):
        text = render(node)
        if text is not None:
            texts.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), text))
    ordered = [text for *_, text in sorted(texts)]
    return [*ordered, " ".join(ordered)]


def _fences(source: str) -> list[str]:
    return [text for text in _sql_texts(source) if FENCE.search(text)]


def test_the_fence_finder_finds_every_way_of_writing_one() -> None:
    found = [
        'SQL = "UPDATE t SET x = 1 WHERE session_id = ? AND owner_id = ? AND epoch = ?"',
        'sql = f"DELETE FROM t WHERE id = :id AND {p}owner_id = :owner AND e.epoch = :epoch"',
        'sql = "UPDATE t SET x = 1 WHERE owner_id = :o " + "AND epoch = :e"',
        'q = ("SELECT 1 FROM t WHERE epoch = ? "\n     "AND owner_id = ?")',
        'SQL = f"""WHERE e.id = j.eid {"" if OFF else "AND e.owner_id = j.value ->> \'owner\' AND e.epoch = 1"}"""',
    ]
    for source in found:
        assert _fences(source), source
    assert not _fences(
        'SQL = "UPDATE t SET owner_id = :owner, epoch = epoch + 1 WHERE id = :id AND epoch = :seen"'
    )


def test_no_module_but_the_fencing_module_writes_the_fence_clause() -> None:
    offenders = {}
    for path in sorted(BACKEND.rglob("*.py")):
        if path == FENCING:
            continue
        fences = _fences(path.read_text())
        if fences:
            offenders[str(path.relative_to(BACKEND.parent))] = fences[0][:200]
    assert offenders == {}, "fence clauses outside backend/store/fencing.py (use fencing.fence_sql)"
    assert _fences(FENCING.read_text())  # it is written there: in fence_sql
