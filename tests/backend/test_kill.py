"""`ops.kill` (`rem kill`, the console's `k`): a real worker process SIGKILLed, journaled with what it
held, recorded dead at once; every refusal one line, journaled, and nothing signalled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from backend import ops
from backend.chroma import server as chroma_server
from backend.core import clock, processes
from backend.core.datadir import DataDir
from backend.core.errors import ReadOnly, Refused, WorkerNotFound
from backend.ops import status_scope
from backend.runtime.context import Context
from backend.store import workers
from backend.store.events import verify_operator_chain_sync
from tests.backend.test_ops_actions import _spawn_idle, _wait_registered
from tests.tui.tool_turns import running_call

pytestmark = pytest.mark.both_stores


async def _events(ctx: Context, kind: str) -> list[dict[str, object]]:
    db = await ctx.db()
    rows = await db.fetchall("SELECT actor, target, data FROM event WHERE kind = ? ORDER BY id", (kind,))
    return [{"actor": r["actor"], "target": r["target"], "data": json.loads(r["data"])} for r in rows]


async def test_kill_sigkills_a_live_worker_names_what_it_held_and_records_it_dead(db_ctx: Context) -> None:
    owner = "dream-kill-1"
    proc = _spawn_idle(db_ctx, owner)
    try:
        await _wait_registered(db_ctx, owner)
        call_id = await running_call(db_ctx, "s-kill", owner=owner)
        started = processes.started_at(proc.pid)
        report = await ops.kill(db_ctx, owner)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    assert (report["role"], report["pid"], report["host"]) == ("dream", proc.pid, workers.host_name())
    assert report["signal"] == "SIGKILL" and report["exited"] is True
    assert report["process_started_at"] == started is not None  # identified by its recorded start
    assert [(lease["kind"], lease["session_id"]) for lease in report["leases"]] == [("execution", "s-kill")]
    assert [(c["call_id"], c["tool"], c["effect"]) for c in report["running_calls"]] == [
        (call_id, "demo.outbox_send", "effect")
    ]
    db = await db_ctx.db()
    row = await db.fetchone("SELECT state, exited_at FROM worker WHERE owner_id = ?", (owner,))
    assert row is not None and row["exited_at"] is not None
    assert row["state"] == "running"  # dead, not reaped: its lease expires or is released
    (killed,) = await _events(db_ctx, "operator.kill")
    assert killed["actor"] == db_ctx.operator and killed["target"] == owner
    data = killed["data"]
    assert isinstance(data, dict)
    assert data["pid"] == proc.pid and data["signal"] == "SIGKILL" and data["role"] == "dream"
    assert data["running_calls"][0]["call_id"] == call_id and data["leases"][0]["session_id"] == "s-kill"
    (exited,) = await _events(db_ctx, "worker.exited")
    assert exited["actor"] == db_ctx.operator and "rem kill" in str(exited["data"])
    chain = await db.read_in_thread(verify_operator_chain_sync)  # chained like every operator event
    assert chain["ok"] and chain["count"] == 1 and chain["unchained"] == 0


async def _worker(ctx: Context, owner: str, pid: int, *, host: str, started_at: int, **info: object) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state, info) "
            "VALUES (?, 'executor', ?, ?, ?, ?, 'running', ?)",
            (owner, pid, host, started_at, clock.now_ms(), json.dumps(info)),
        )


async def _set_exited(ctx: Context, owner: str, at: int) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute("UPDATE worker SET exited_at = ? WHERE owner_id = ?", (at, owner))


async def test_kill_refusals_signal_nothing_and_are_journaled(db_ctx: Context) -> None:
    here, now = workers.host_name(), clock.now_ms()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    try:
        started = processes.started_at(bystander.pid)
        assert started is not None
        await _worker(db_ctx, "elsewhere", bystander.pid, host="other-host", started_at=now)
        # its pid now names a process that started after the worker recorded its own start
        await _worker(
            db_ctx, "reused", bystander.pid, host=here, started_at=now, process_started_at=started - 50
        )
        # nothing recorded of the process: it must have been running when the worker registered
        await _worker(db_ctx, "reused-old-row", bystander.pid, host=here, started_at=now - 3_600_000)
        await _worker(db_ctx, "gone", finished.pid, host=here, started_at=now)
        me = os.getpid()
        await _worker(db_ctx, "myself", me, host=here, started_at=now, **workers.own_process())
        with pytest.raises(WorkerNotFound, match="no worker"):
            await ops.kill(db_ctx, "nobody")
        with pytest.raises(Refused, match="runs on host other-host.*never signals another machine"):
            await ops.kill(db_ctx, "elsewhere")
        for owner in ("reused", "reused-old-row"):
            with pytest.raises(Refused, match=f"pid {bystander.pid} is no longer worker {owner}"):
                await ops.kill(db_ctx, owner)
        with pytest.raises(Refused, match="has exited already"):
            await ops.kill(db_ctx, "gone")
        with pytest.raises(Refused, match="this very process"):
            await ops.kill(db_ctx, "myself")
        await _set_exited(db_ctx, "reused", now)
        with pytest.raises(Refused, match="already dead"):
            await ops.kill(db_ctx, "reused")
        assert bystander.poll() is None  # nothing was signalled
    finally:
        bystander.kill()
        bystander.wait()
    assert await _events(db_ctx, "operator.kill") == []
    refused = await _events(db_ctx, "operator.refused")
    assert len(refused) == 7 and {r["data"]["action"] for r in refused} == {"kill"}  # type: ignore[index]


async def test_a_read_only_rem_refuses_to_kill_before_reading_anything(db_ctx: Context) -> None:
    owner = "dream-kill-ro"
    proc = _spawn_idle(db_ctx, owner)
    try:
        await _wait_registered(db_ctx, owner)
        async with Context(db_ctx.data, read_only=True, start_chroma=False, db_url=db_ctx.db_url) as ro:
            with pytest.raises(ReadOnly):
                await ops.kill(ro, owner)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()
    assert await _events(db_ctx, "operator.refused") == []


async def test_a_reaping_supervisor_stops_a_worker_a_kill_recorded_dead(db_ctx: Context) -> None:
    """The kill records the exit, not the reap: `rem up` (reaping) still marks the row stopped, so
    its leases are taken over before they expire, as after any death it sees."""
    here, now = workers.host_name(), clock.now_ms()
    await _worker(db_ctx, "killed", 4242, host=here, started_at=now)
    await _set_exited(db_ctx, "killed", now - 5)
    db = await db_ctx.db()
    assert await workers.mark_exited(db, 4242, here, "killed by SIGKILL", reap=False) == []
    assert await workers.mark_exited(db, 4242, here, "killed by SIGKILL", reap=True) == ["killed"]
    row = await db.fetchone("SELECT state, exited_at FROM worker WHERE owner_id = 'killed'")
    assert row is not None and (row["state"], row["exited_at"]) == ("stopped", now - 5)


@pytest.mark.sqlite_only
async def test_kill_chroma_sigkills_the_data_dirs_own_server(data_dir: DataDir) -> None:
    server = chroma_server.resolve(data_dir, start=True)
    assert server.process is not None
    try:
        async with Context(data_dir, start_chroma=False) as ctx:
            report = await ops.kill(ctx, "chroma")
            assert server.process.wait(timeout=10) == -signal.SIGKILL
            assert (report["role"], report["pid"], report["url"]) == (
                "chroma",
                server.process.pid,
                server.url,
            )
            (killed,) = await _events(ctx, "operator.kill")
            assert killed["target"] == "chroma"
            with pytest.raises(Refused, match="no Chroma server runs"):
                await ops.kill(ctx, "chroma")
        async with Context(data_dir, chroma_url="http://127.0.0.1:9", start_chroma=False) as ctx:
            with pytest.raises(Refused, match="not a server this data dir started"):
                await ops.kill(ctx, "chroma")
    finally:
        server.stop()


async def test_status_lists_each_running_call_with_its_executor_kept_to_a_tokens_projects(
    db_ctx: Context,
) -> None:
    """`tools.running`: what the console's Backlog lists and `k` kills; a token of another project
    sees none of it (`status_scope`)."""
    call_id = await running_call(db_ctx, "s-run", owner="executor-x-1")
    status = await ops.status(db_ctx)
    (call,) = status["tools"]["running"]
    assert (call["call_id"], call["session_id"], call["owner_id"], call["state"]) == (
        call_id,
        "s-run",
        "executor-x-1",
        "running",
    )
    assert call["effect"] == "effect" and call["started_at"] is not None
    assert status_scope.keep_to(status, set())["tools"]["running"] == []
