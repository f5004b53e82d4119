"""The executor -> summarizer -> Dream hand-off rows."""

from __future__ import annotations

from backend.runtime.context import Context
from backend.store.handoffs import mark_turns_changed, publish_input_revision


async def _session(ctx: Context) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s1', 1, 1)")


async def test_mark_turns_changed_bumps_the_drift_queue(db_ctx: Context) -> None:
    await _session(db_ctx)
    db = await db_ctx.db()
    for now in (10, 20, 30):
        async with db.tx() as conn:
            await mark_turns_changed(conn, "s1", now)
    row = await db.fetchone("SELECT dirty_seq, clean_seq, status FROM summary_job WHERE session_id='s1'")
    assert tuple(row) == (3, 0, "pending")
    pending = await db.fetchall("SELECT session_id FROM summary_job WHERE dirty_seq > clean_seq")
    assert [r[0] for r in pending] == ["s1"]


async def test_a_drifted_session_keeps_its_place_in_the_queue(db_ctx: Context) -> None:
    """Marks on an already-drifted session count the change but keep when it first drifted."""
    await _session(db_ctx)
    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s2', 1, 1)")
        await mark_turns_changed(conn, "s1", 10)
        await mark_turns_changed(conn, "s2", 20)
        await mark_turns_changed(conn, "s1", 30)  # s1 keeps talking: it must not go behind s2
    rows = await db.fetchall(
        "SELECT session_id, dirty_seq, time_updated FROM summary_job "
        "WHERE dirty_seq > clean_seq ORDER BY time_updated, session_id"
    )
    assert [tuple(r) for r in rows] == [("s1", 2, 10), ("s2", 1, 20)]
    async with db.tx() as conn:  # summarized: the next change starts a new drift, stamped now
        await conn.execute("UPDATE summary_job SET clean_seq = dirty_seq WHERE session_id = 's1'")
        await mark_turns_changed(conn, "s1", 40)
    row = await db.fetchone(
        "SELECT dirty_seq, clean_seq, time_updated FROM summary_job WHERE session_id = 's1'"
    )
    assert tuple(row) == (3, 2, 40)


async def test_publishing_is_idempotent_and_a_new_revision_reopens(db_ctx: Context) -> None:
    await _session(db_ctx)
    db = await db_ctx.db()
    async with db.tx() as conn:
        assert await publish_input_revision(conn, "s1", "sha256:a", 100)
        assert not await publish_input_revision(conn, "s1", "sha256:a", 200)
    row = await db.fetchone(
        "SELECT input_revision, time_published, digest_state, state_revision FROM dream_state"
    )
    assert tuple(row) == ("sha256:a", 100, "pending", 1)
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE dream_state SET completed_revision = 'sha256:a', digest_state = 'digested', "
            "digest_attempts = 2"
        )
        assert await publish_input_revision(conn, "s1", "sha256:b", 300)
    row = await db.fetchone("SELECT input_revision, digest_state, digest_attempts FROM dream_state")
    assert tuple(row) == ("sha256:b", "pending", 0)
    async with db.tx() as conn:
        assert await publish_input_revision(conn, "s1", "sha256:a", 400)
    assert await db.scalar("SELECT digest_state FROM dream_state") == "digested"


async def test_publishing_keeps_a_live_dream_claim_visible(db_ctx: Context) -> None:
    await _session(db_ctx)
    db = await db_ctx.db()
    async with db.tx() as conn:
        await publish_input_revision(conn, "s1", "sha256:a", 100)
        await conn.execute(
            "UPDATE dream_state SET digest_state = 'in_progress', owner_id = 'd1', lease_expires_at = 999999"
        )
        assert await publish_input_revision(conn, "s1", "sha256:b", 200)
    row = await db.fetchone("SELECT input_revision, digest_state FROM dream_state")
    assert tuple(row) == ("sha256:b", "in_progress")
