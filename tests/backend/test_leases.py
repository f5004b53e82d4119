"""Execution leases: claim, takeover, fencing, renewal, release (the primitives, on a real state.db)."""

from __future__ import annotations

import pytest

from backend.core import clock
from backend.core.errors import LeaseLost, LeaseNotFound, Refused, UsageError
from backend.execution import leases
from backend.ops.lease_release import release_lease
from backend.runtime.context import Context
from backend.store.db import Database

# the lease and turn paths are the store's hot paths: both engines run them
pytestmark = pytest.mark.both_stores

LEASE = 1_000


async def _session(db: Database, sid: str = "s1") -> None:
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (sid,))


async def _row(db: Database, execution_id: str) -> dict[str, object] | None:
    row = await db.fetchone("SELECT * FROM session_execution WHERE id = ?", (execution_id,))
    return None if row is None else dict(row)


async def test_one_lease_per_session_and_the_epoch_survives_deletion(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await _session(db)
    first = await leases.claim(db, "s1", "owner-a", length_ms=LEASE)
    assert first is not None and first.epoch == 1
    assert await leases.claim(db, "s1", "owner-b", length_ms=LEASE) is None
    row = await _row(db, first.execution_id)
    assert row is not None and row["phase"] == "ready" and row["expires_at"] == frozen_clock.now + LEASE
    await db.write_in_thread(lambda conn: leases.end_execution_sync(conn, first))
    assert await _row(db, first.execution_id) is None
    second = await leases.claim(db, "s1", "owner-b", length_ms=LEASE)
    assert second is not None and second.epoch == 2  # never reuses the deleted row's epoch
    # the first owner's fence names epoch 1: nothing it writes can land
    with pytest.raises(LeaseLost):
        await db.write_in_thread(
            lambda conn: leases.guard_sync(conn, first, now=clock.now_ms(), phase="unknown")
        )
    assert (await _row(db, second.execution_id))["phase"] == "ready"  # type: ignore[index]


async def test_guard_renews_and_a_takeover_needs_expiry(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await _session(db)
    lease = await leases.claim(db, "s1", "owner-a", length_ms=LEASE)
    assert lease is not None
    frozen_clock.advance(LEASE - 1)
    await db.write_in_thread(
        lambda conn: leases.guard_sync(conn, lease, now=clock.now_ms(), phase="unknown", step=1)
    )
    row = await _row(db, lease.execution_id)
    assert row is not None and (row["phase"], row["step"]) == ("unknown", 1)
    assert row["expires_at"] == frozen_clock.now + LEASE and lease.expires_at == row["expires_at"]
    frozen_clock.advance(LEASE - 1)  # renewed, so still held
    assert (
        await db.write_in_thread(
            lambda conn: leases.take_over_execution_sync(
                conn, lease.execution_id, "owner-b", now=clock.now_ms(), length_ms=LEASE
            )
        )
        is None
    )
    frozen_clock.advance(1)  # now expired
    taken = await db.write_in_thread(
        lambda conn: leases.take_over_execution_sync(
            conn, lease.execution_id, "owner-b", now=clock.now_ms(), length_ms=LEASE
        )
    )
    assert taken is not None
    new, old = taken
    assert (new.epoch, new.owner_id, old["owner_id"], old["phase"]) == (2, "owner-b", "owner-a", "unknown")
    with pytest.raises(LeaseLost):
        await db.write_in_thread(lambda conn: leases.guard_sync(conn, lease, now=clock.now_ms()))
    lost = await leases.renew(db, [lease, new])
    assert lost == [lease]


async def test_release_refuses_a_stale_epoch_unless_forced(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await _session(db)
    lease = await leases.claim(db, "s1", "owner-a", length_ms=LEASE)
    assert lease is not None
    events_before = await db.scalar("SELECT count(*) FROM event")
    with pytest.raises(Refused, match="epoch 1, not the epoch 7 you saw.*--force"):
        async with db.tx() as conn:
            await release_lease(
                conn, "execution", lease.execution_id, expected_epoch=7, actor="op", now=clock.now_ms()
            )
    assert (await _row(db, lease.execution_id))["epoch"] == 1  # type: ignore[index]
    assert await db.scalar("SELECT count(*) FROM event") == events_before
    async with db.tx() as conn:
        result = await release_lease(
            conn,
            "execution",
            lease.execution_id,
            expected_epoch=7,
            force=True,
            actor="op",
            now=clock.now_ms(),
        )
    assert (result["old_epoch"], result["new_epoch"], result["forced"]) == (1, 2, True)
    row = await _row(db, lease.execution_id)
    assert row is not None and row["epoch"] == 2 and row["expires_at"] == frozen_clock.now
    with pytest.raises(LeaseLost):  # the old owner is fenced
        await db.write_in_thread(lambda conn: leases.guard_sync(conn, lease, now=clock.now_ms()))
    event = await db.fetchone("SELECT kind, actor, target FROM event ORDER BY id DESC LIMIT 1")
    assert tuple(event) == ("operator.release", "op", lease.execution_id)
    # released means expired: any executor may take it over right away
    taken = await db.write_in_thread(
        lambda conn: leases.take_over_execution_sync(
            conn, lease.execution_id, "owner-b", now=clock.now_ms(), length_ms=LEASE
        )
    )
    assert taken is not None and taken[0].epoch == 3


async def test_release_with_the_current_epoch_and_unknown_ids(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    lease = await leases.claim(db, "s1", "owner-a", length_ms=LEASE)
    assert lease is not None
    async with db.tx() as conn:
        result = await release_lease(
            conn, "execution", lease.execution_id, expected_epoch=1, actor="op", now=clock.now_ms()
        )
    assert result["new_epoch"] == 2 and result["seen"]["owner_id"] == "owner-a"
    with pytest.raises(LeaseNotFound, match="no execution lease 'exe_nope'"):
        async with db.tx() as conn:
            await release_lease(conn, "execution", "exe_nope", actor="op", now=clock.now_ms())


def test_lease_length_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert leases.lease_ms() == 30_000 and leases.renew_every_ms() == 10_000
    monkeypatch.setenv("REM_EXECUTION_LEASE_MS", "1500")
    assert leases.lease_ms() == 1500 and leases.renew_every_ms() == 500
    monkeypatch.setenv("REM_EXECUTION_LEASE_MS", "soon")
    with pytest.raises(UsageError, match="not a whole number"):
        leases.lease_ms()
