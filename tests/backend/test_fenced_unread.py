"""Fenced writes sent unread (`db.fenced_write(unread=True)`): a write that changes no row still fails its
transaction, or only its own member of a group commit, as `LeaseLost` with its own message."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from backend.core import clock
from backend.core.errors import LeaseLost
from backend.execution import leases, projection, sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store.db import Conn, Database, execute_unread

pytestmark = pytest.mark.both_stores

LEASE = 60_000
MARK = "INSERT INTO event (time, kind, actor, data) VALUES (?, 'test.mark', 'test', ?)"


async def _held(db: Database, sid: str = "s1") -> leases.Lease:
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (sid,))
    lease = await leases.claim(db, sid, "owner-a", length_ms=LEASE)
    assert lease is not None
    return lease


async def _marks(db: Database) -> list[str]:
    rows = await db.fetchall("SELECT data FROM event WHERE kind = 'test.mark' ORDER BY id")
    return [json.loads(r[0])["mark"] for r in rows]


def _guarded_mark(lease: leases.Lease, mark: str, *, read_after: bool = False) -> object:
    def body(conn: Conn) -> str:
        leases.guard_sync(conn, lease, now=clock.now_ms(), unread=True, phase="unknown")
        execute_unread(conn, MARK, (clock.now_ms(), json.dumps({"mark": mark})))
        if read_after:  # the queued guard goes with this read, and fails it
            conn.execute("SELECT 1").fetchone()
        return mark

    return body


async def test_a_stale_fence_sent_unread_fails_only_its_own_member_of_a_group(db_ctx: Context) -> None:
    db = await db_ctx.db()
    lease = await _held(db)
    stale = dataclasses.replace(lease, epoch=lease.epoch + 7)
    groups = db.groups_committed
    outcomes = await asyncio.gather(
        db.write_in_thread(_guarded_mark(stale, "stale")),  # type: ignore[arg-type]
        db.write_in_thread(_guarded_mark(lease, "held")),  # type: ignore[arg-type]
        return_exceptions=True,
    )
    assert db.groups_committed == groups + 1, [
        repr(o) for o in outcomes
    ]  # one group: the failure stayed in its savepoint
    assert isinstance(outcomes[0], LeaseLost) and f"at epoch {stale.epoch}" in str(outcomes[0])
    assert outcomes[1] == "held"
    assert await _marks(db) == ["held"]
    assert await db.scalar("SELECT phase FROM session_execution WHERE id = ?", (lease.execution_id,)) == (
        "unknown"
    )


@pytest.mark.parametrize("read_after", [False, True], ids=["seen-at-commit", "seen-at-a-later-members-read"])
async def test_a_stale_fence_fails_only_its_member_wherever_its_write_goes_out(
    db_ctx: Context, read_after: bool
) -> None:
    # PostgreSQL sends a member's unread writes with a later member's read or with the COMMIT
    db = await db_ctx.db()
    lease = await _held(db)
    stale = dataclasses.replace(lease, epoch=lease.epoch + 7)
    groups = db.groups_committed
    outcomes = await asyncio.gather(
        *(
            db.write_in_thread(body)  # type: ignore[arg-type]
            for body in (
                _guarded_mark(lease, "first"),
                _guarded_mark(stale, "stale"),
                _guarded_mark(lease, "after", read_after=read_after),
                _guarded_mark(stale, "stale again"),
                _guarded_mark(lease, "last"),
            )
        ),
        return_exceptions=True,
    )
    assert db.groups_committed == groups + 1, outcomes
    assert [o if isinstance(o, str) else type(o) for o in outcomes] == [
        "first",
        LeaseLost,
        "after",
        LeaseLost,
        "last",
    ]
    assert await _marks(db) == ["first", "after", "last"]


async def test_a_later_member_never_sees_a_failed_members_writes(db_ctx: Context) -> None:
    db = await db_ctx.db()
    lease = await _held(db)
    stale = dataclasses.replace(lease, epoch=lease.epoch + 7)

    def count_marks(conn: Conn) -> int:
        execute_unread(conn, MARK, (clock.now_ms(), json.dumps({"mark": "counted"})))
        return int(conn.execute("SELECT count(*) FROM event WHERE kind = 'test.mark'").fetchone()[0])

    def raises(conn: Conn) -> None:
        execute_unread(conn, MARK, (clock.now_ms(), json.dumps({"mark": "raised"})))
        raise ValueError("the member's own failure")

    outcomes = await asyncio.gather(
        db.write_in_thread(_guarded_mark(stale, "stale")),  # type: ignore[arg-type]
        db.write_in_thread(raises),
        db.write_in_thread(count_marks),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], LeaseLost) and isinstance(outcomes[1], ValueError)
    assert outcomes[2] == 1  # its own mark only: neither the stale member's nor the raising one's
    assert await _marks(db) == ["counted"]


@pytest.mark.parametrize("read_after", [False, True], ids=["failed-at-commit", "failed-at-next-read"])
async def test_a_stale_fence_sent_unread_fails_a_lone_transaction_whole(
    db_ctx: Context, read_after: bool
) -> None:
    db = await db_ctx.db()
    lease = await _held(db)
    stale = dataclasses.replace(lease, epoch=lease.epoch - 1)
    with pytest.raises(LeaseLost, match=f"no longer held by owner-a at epoch {stale.epoch}"):
        await db.write_in_thread(_guarded_mark(stale, "stale", read_after=read_after))  # type: ignore[arg-type]
    assert await _marks(db) == []
    assert await db.scalar("SELECT phase FROM session_execution WHERE id = ?", (lease.execution_id,)) == (
        "ready"
    )


async def test_a_closed_assistant_row_refuses_an_unread_rewrite(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _held(db)

    def insert(conn: Conn) -> None:
        sessions.insert_message_sync(conn, "a1", "s1", "assistant", 1, {"status": "completed"}, 1)

    await db.write_in_thread(insert)
    with pytest.raises(LeaseLost, match="assistant a1 is no longer open"):
        await db.write_in_thread(
            lambda conn: projection.update_owned_assistant_sync(
                conn, "a1", {"status": "streaming"}, 2, unread=True
            )
        )
    assert await db.scalar("SELECT data FROM session_message WHERE id = 'a1'") == '{"status":"completed"}'


async def test_a_claim_under_a_lock_whose_epoch_moved_grants_nothing(db_ctx: Context) -> None:
    db = await db_ctx.db()
    lease = await _held(db)
    await db.write_in_thread(lambda conn: leases.end_execution_sync(conn, lease))

    def claim(held_epoch: int) -> object:
        def body(conn: Conn) -> leases.Lease:
            locked = leases.lock_session_epoch_sync(conn, "s1")
            assert locked == lease.epoch
            return leases.claim_locked_execution_sync(
                conn, "s1", "owner-b", held_epoch, now=clock.now_ms(), length_ms=LEASE
            )

        return body

    with pytest.raises(LeaseLost, match="lease epoch moved"):
        await db.write_in_thread(claim(lease.epoch - 1))  # type: ignore[arg-type]
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    granted = await db.write_in_thread(claim(lease.epoch))  # type: ignore[arg-type]
    assert granted.epoch == lease.epoch + 1
    assert await db.scalar("SELECT lease_epoch FROM session WHERE id = 's1'") == granted.epoch
    assert await db.scalar("SELECT epoch FROM session_execution WHERE session_id = 's1'") == granted.epoch


@pytest.mark.parametrize("steer_first", [False, True], ids=["queue-older", "steer-older"])
async def test_the_inputs_at_a_turn_start_in_one_read(db_ctx: Context, steer_first: bool) -> None:
    db = await db_ctx.db()
    order = ["st1", "q1", "q2", "st2"] if steer_first else ["q1", "st1", "q2", "st2"]
    for input_id in order:
        delivery = "steer" if input_id.startswith("st") else "queue"
        await sessions.admit(db, "s1", f"text {input_id}", delivery=delivery, input_id=input_id)
    start = await db.read_in_thread(lambda conn: sessions.pending_inputs_sync(conn, "s1", turn_start=True))
    later = await db.read_in_thread(lambda conn: sessions.pending_inputs_sync(conn, "s1", turn_start=False))
    # a queue input starts the turn only when no steer waits from before it
    assert [r["id"] for r in start] == (["st1", "st2"] if steer_first else ["q1", "st1", "st2"])
    assert [r["id"] for r in later] == ["st1", "st2"]


async def test_turns_are_counted_once_their_transaction_is_in(db_ctx: Context) -> None:
    db = await db_ctx.db()
    for n in range(3):
        await sessions.admit(db, f"s{n % 2}", f"question {n}", input_id=f"i{n}")
    executor = Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=LEASE)
    await executor.run()
    completed = await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.completed'")
    assert executor.turns_completed == 3 == completed
    assert await db.scalar("SELECT sum(turn_count) FROM session") == 3
