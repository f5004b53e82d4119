"""The daemons ride out a PostgreSQL restart: fast shutdown mid-load, same data dir and socket, nothing lost.

A `rem --db URL up` (executors, summarizer, Dream) works through queued turns
on a PostgreSQL server of this test's own (the session's server is shared by
the other tests of the worker). The postmaster is stopped with a fast
shutdown (SIGINT: every connection is cut, open transactions roll back) while
turns stream, and started again on the same data dir and socket. The daemons
reconnect on their own, no daemon dies for it, and the store settles: the real
`rem check --settled` finds no violation and every admitted input has exactly
one completed reply.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.programs import postgres_server
from backend.programs.postgres_server import LocalPostgres
from backend.runtime.context import Context
from backend.store import schema_pg
from backend.store.postgres import PgConnection
from tests import pg
from tests.helpers import await_until, rem_env, run_rem, spawn_rem, wait_until
from tests.reliability.rig import await_settled

pytestmark = pytest.mark.slow

WORK = [(f"s{i}", f"Question {i}: who owns the nightly ledger export?", "queue") for i in range(4)] + [
    (f"s{i}", f"Follow-up {i}: and what does Ken check first?", "queue") for i in range(4)
]


@pytest.fixture
def own_pg(pg_server: LocalPostgres) -> Iterator[tuple[LocalPostgres, str]]:
    """A PostgreSQL server of this test's own (it gets restarted) with rem's schema in database `rem`."""
    if pg_server.process.poll() is not None:
        pytest.fail("the session PostgreSQL is down")
    server = postgres_server.start(pg.scratch_root())
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE rem")
        conn_ = PgConnection(server.url("rem"))
        try:
            schema_pg.migrate_sync(conn_, "rem")
        finally:
            conn_.close()
        yield server, server.url("rem")
    finally:
        server.stop(remove=True)
        shutil.rmtree(server.root, ignore_errors=True)


def _query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    conn = PgConnection(url)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _manifest(root: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((root / "up.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


async def test_daemons_reconnect_after_a_postgresql_restart_and_lose_nothing(
    own_pg: tuple[LocalPostgres, str], chroma_url: str, collection: str, tmp_path: Path
) -> None:
    server, url = own_pg
    ctx = Context(DataDir(tmp_path / "admit"), start_chroma=False, db_url=url)
    db = await ctx.db()
    for sid, text, delivery in WORK:
        await sessions.admit(db, sid, text, delivery=delivery)
    await ctx.close()
    inputs = {r[0] for r in _query(url, "SELECT id FROM session_input")}
    root = tmp_path / "host"
    root.mkdir()
    env = rem_env(
        REM_AGENT_DELAY_MS="400",
        REM_EXECUTION_LEASE_MS="3000",
        REM_SUMMARY_LEASE_MS="3000",
        REM_DREAM_LEASE_MS="3000",
        REM_DREAM_CHUNK_ROWS="10",
        REM_CHROMA_AUTOSTART="0",
        REM_CHROMA_COLLECTION=collection,
        REM_LOG="1",
    )
    env.pop("REM_DB_URL", None)
    log = tmp_path / "up.log"
    up = spawn_rem(
        "--db",
        url,
        "up",
        "--data",
        str(root),
        "--chroma-url",
        chroma_url,
        "--executors",
        "2",
        env=env,
        log=log,
    )

    def tail() -> str:
        return log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"

    try:

        async def mid_load() -> bool:  # every daemon running, some replies done, turns streaming now
            manifest = _manifest(root)
            if not manifest or not all(c["pid"] for c in manifest["children"]):
                return False
            running = {r[0] for r in _query(url, "SELECT pid FROM worker WHERE state = 'running'")}
            if not {c["pid"] for c in manifest["children"]} <= running:
                return False  # (a daemon still starting up when the store goes away exits, and is restarted)
            done = _query(url, "SELECT count(*) FROM session_message WHERE type = 'assistant'")[0][0]
            streaming = _query(url, "SELECT count(*) FROM session_execution")[0][0]
            return bool(done >= 2 and streaming >= 1)

        await await_until(mid_load, timeout=90, interval=0.2, message=f"turns mid-load: {tail()}")
        before = _manifest(root)
        assert before is not None
        pids = {c["name"]: c["pid"] for c in before["children"]}
        server.stop()  # fast shutdown: SIGINT to the postmaster
        assert server.process.returncode is not None
        restarted = server.restart()
        assert restarted.url("rem") == url  # same socket, same data dir: the daemons' URL still holds
        server.process = restarted.process  # the fixture stops (and removes) the running one

        check_ctx = Context(
            DataDir(root), chroma_url=chroma_url, start_chroma=False, db_url=url, collection=collection
        )
        try:  # polled in process (cheap); the verdict below is the real command
            await await_settled(check_ctx, 120, tail=tail, what="the store")
        finally:
            await check_ctx.close()
        proc = run_rem(
            "--db", url, "check", "--settled", "--json", "--data", str(root), "--chroma-url", chroma_url,
            env=env,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and report["ok"], json.dumps(report["violations"], indent=1)[:4000]
        assert report["counts"] == {"violations": 0, "unsettled": 0}, (report["counts"], tail())
        after = _manifest(root)
        assert after is not None
        # every daemon waited the outage out: none exited for the supervisor to restart
        assert {c["name"]: (c["pid"], c["restarts"]) for c in after["children"]} == {
            name: (pid, 0) for name, pid in pids.items()
        }, tail()
        assert "exited with code" not in tail()
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, tail()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    replies: Counter[str] = Counter({i: 0 for i in inputs})
    for (data,) in _query(url, "SELECT data FROM session_message WHERE type = 'assistant'"):
        reply = json.loads(data or "{}")
        if reply.get("status") == "completed":
            replies.update(reply.get("answers") or [])
    wrong = {i: n for i, n in replies.items() if i not in inputs or n != 1}
    if wrong:  # printed whole (an assertion message is cut short): everything needed to tell why
        print(
            "inputs:",
            _query(url, "SELECT id, session_id, delivery, admitted_seq, promoted_seq FROM session_input"),
        )
        for row in _query(
            url, "SELECT session_id, type, seq, data FROM session_message ORDER BY session_id, seq"
        ):
            print("message:", row)
        for row in _query(
            url, "SELECT kind, session_id, target, data FROM event WHERE kind LIKE 'execution.%' ORDER BY id"
        ):
            print("event:", row)
        print("log:", log.read_text(errors="replace") if log.exists() else "(no log)")
    assert not wrong, f"inputs without exactly one completed reply: {wrong} (stdout has the rest)"


async def test_a_daemon_started_while_the_server_is_down_waits_for_it(
    own_pg: tuple[LocalPostgres, str], tmp_path: Path
) -> None:
    """A daemon whose store cannot be reached at start waits it out (no exit 3 for a supervisor to
    restart), says so in its log, and works once the server is back."""
    server, url = own_pg
    server.stop()
    env = rem_env(REM_CHROMA_AUTOSTART="0", REM_MEMORY_CONTEXT_ITEMS="0", REM_LOG="1")
    env.pop("REM_DB_URL", None)
    log = tmp_path / "daemon.log"
    daemon = spawn_rem(
        "--db", url, "daemon", "--role", "executor", "--data", str(tmp_path / "d"), env=env, log=log
    )
    try:
        wait_until(
            lambda: log.exists() and "cannot open the store yet" in log.read_text(errors="replace"),
            timeout=60,
            message="the daemon to say it waits for the store",
        )
        wait_until(
            lambda: log.read_text(errors="replace").count("cannot open the store yet") >= 2,
            timeout=30,
            message="a second attempt",
        )
        assert daemon.poll() is None, log.read_text(errors="replace")
        restarted = server.restart()
        server.process = restarted.process
        ctx = Context(DataDir(tmp_path / "admit"), start_chroma=False, db_url=url)
        db = await ctx.db()
        try:
            await sessions.admit(db, "s1", "Are you there?", input_id="q1")

            async def answered() -> bool:
                rows = await db.fetchall("SELECT data FROM session_message WHERE type = 'assistant'")
                return any(json.loads(r[0]).get("status") == "completed" for r in rows)

            await await_until(
                answered, timeout=60, message=f"a reply: {log.read_text(errors='replace')[-3000:]}"
            )
        finally:
            await ctx.close()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, log.read_text(errors="replace")
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(10)
