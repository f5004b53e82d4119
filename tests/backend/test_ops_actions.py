"""Operator actions on live state: drain and lease release, refusals, audit, read-only."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import pytest

from backend import ops
from backend.core.errors import LeaseNotFound, ReadOnly, Refused, UsageError, WorkerNotFound
from backend.runtime.context import Context

# every operator action and invariant below runs on state.db and on PostgreSQL
pytestmark = pytest.mark.both_stores

IDLE_DAEMON = textwrap.dedent(
    """
    import asyncio, sys
    from backend.runtime.context import Context
    from backend.runtime.daemon import Daemon
    from backend.core.datadir import DataDir

    class Idle(Daemon):
        role = "dream"
        async def run_pass(self):
            return 0
        async def hand_back(self):
            print("handed back", flush=True)

    async def main():
        ctx = Context(DataDir.resolve(sys.argv[1]), start_chroma=False)
        code = await Idle(ctx, owner_id=sys.argv[2]).run()
        await ctx.close()
        sys.exit(code)

    asyncio.run(main())
    """
)


async def _db_digest(ctx: Context) -> str:
    db = await ctx.db()
    digest = hashlib.sha256()
    for table in ("worker", "summary_job", "event", "session_execution"):
        for row in await db.fetchall(f"SELECT * FROM {table} ORDER BY 1"):
            digest.update(repr(tuple(row)).encode())
    return digest.hexdigest()


def _spawn_idle(ctx: Context, owner: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", IDLE_DAEMON, str(ctx.data.root), owner],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _wait_registered(ctx: Context, owner: str) -> None:
    from tests.helpers import await_until

    db = await ctx.db()
    await await_until(
        lambda: db.scalar("SELECT state FROM worker WHERE owner_id = ?", (owner,)),
        timeout=30,
        message=f"{owner} to register",
    )


async def test_drain_wait_stops_a_live_daemon_and_journals(db_ctx: Context) -> None:
    proc = _spawn_idle(db_ctx, "dream-test-1")
    try:
        await _wait_registered(db_ctx, "dream-test-1")
        seen: list[str] = []
        result = await ops.drain(
            db_ctx, "dream-test-1", wait=True, timeout_s=30, progress=lambda r: seen.append(r["state"])
        )
        assert result["state"] == "stopped"
        assert "draining" in seen or seen[-1] == "stopped"
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "handed back" in out
        db = await db_ctx.db()
        event = await db.fetchone(
            "SELECT actor, data FROM event WHERE kind = 'operator.drain' AND target = 'dream-test-1'"
        )
        assert event is not None and event["actor"] == db_ctx.operator
        assert '"state":"running"' in event["data"]
    finally:
        proc.kill()


async def test_drain_refusals(db_ctx: Context) -> None:
    with pytest.raises(WorkerNotFound, match="no worker"):
        await ops.drain(db_ctx, "nobody")
    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES ('gone', 'executor', 1, 'h', 1, 1, 'stopped'), "
            "('dead', 'executor', 2, 'h', 1, 1, 'running')"
        )
    with pytest.raises(Refused, match="already stopped"):
        await ops.drain(db_ctx, "gone")
    with pytest.raises(Refused, match="presumed dead"):
        await ops.drain(db_ctx, "dead")
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'operator.drain'") == 0


async def _job_lease(ctx: Context, epoch: int, expires_at: int) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s1', 1, 1)")
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, owner_id, epoch, lease_expires_at, "
            "time_created, time_updated) VALUES ('s1', 'in_progress', 'summarizer-x', ?, ?, 1, 1)",
            (epoch, expires_at),
        )


async def test_release_summary_lease_fenced_on_epoch(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    await _job_lease(db_ctx, epoch=3, expires_at=frozen_clock.now + 200_000)
    db = await db_ctx.db()
    with pytest.raises(Refused, match="renewed or taken over"):
        await ops.release(db_ctx, "s1", expected_epoch=2)
    assert await db.scalar("SELECT epoch FROM summary_job") == 3
    result = await ops.release(db_ctx, "s1", expected_epoch=3)
    assert (result["kind"], result["old_epoch"], result["new_epoch"]) == ("summary_job", 3, 4)
    row = await db.fetchone("SELECT epoch, lease_expires_at FROM summary_job")
    assert tuple(row) == (4, frozen_clock.now)
    # the old owner's fenced write now changes nothing
    async with db.tx() as conn:
        cur = await conn.execute(
            "UPDATE summary_job SET status = 'completed' "
            "WHERE session_id = 's1' AND owner_id = 'summarizer-x' AND epoch = 3"
        )
        assert cur.rowcount == 0
    forced = await ops.release(db_ctx, "s1", expected_epoch=1, force=True)
    assert forced["forced"] and forced["new_epoch"] == 5
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'operator.release'") == 2


async def test_release_unknown_and_bad_kind(db_ctx: Context) -> None:
    with pytest.raises(LeaseNotFound, match="no live lease"):
        await ops.release(db_ctx, "exe_nope")
    with pytest.raises(UsageError, match="unknown lease kind"):
        await ops.release(db_ctx, "x", kind="banana")


async def test_read_only_context_refuses_every_action_and_writes_nothing(
    db_ctx: Context, frozen_clock
) -> None:  # type: ignore[no-untyped-def]
    await _job_lease(db_ctx, epoch=1, expires_at=frozen_clock.now + 1000)
    before = await _db_digest(db_ctx)
    db_ctx.read_only = True
    with pytest.raises(ReadOnly):
        await ops.release(db_ctx, "s1", force=True)
    with pytest.raises(ReadOnly):
        await ops.drain(db_ctx, "whoever")
    with pytest.raises(ReadOnly):
        await ops.init(db_ctx)
    db_ctx.read_only = False
    assert await _db_digest(db_ctx) == before
