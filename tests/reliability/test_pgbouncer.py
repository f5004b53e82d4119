"""rem behind PgBouncer in transaction mode (Debian's pgbouncer 1.18, tests/pgbouncer.py), real processes.

Every rem process reaches the store through the pooler (`REM_DB_URL` is PgBouncer's, with
`REM_DB_POOLED=1`), whose three server connections every client shares between transactions: a
startup option, a session setting or a statement prepared in one transaction would not be there
in the next. Through it: `rem init` on an empty database, admissions, turns, a SIGKILLed executor
taken over at its lease's expiry, a tool call held for an operator's decision and approved, the
console's change feed (polled through the pooler, or LISTENing on `REM_DB_LISTEN_URL`), `rem
status` naming the feed in use, `rem check --settled` clean, and `rem serve`: its event streams on
the same feed, its admissions exactly once by input id across its write connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from backend.core.settings import settings
from backend.ops.console import listen_changes
from backend.programs.demo_tools import server_config
from backend.programs.postgres_server import LocalPostgres
from tests import pg, pgbouncer
from tests.api.conftest import start_serve, stop_serve
from tests.api.serving import Sse, collect, sse_blocks
from tests.helpers import rem_env, rem_json, run_rem, spawn_rem, wait_until

pytestmark = pytest.mark.slow

INPUTS = 6


@pytest.fixture(scope="module")
def bouncer(pg_server: LocalPostgres) -> Iterator[pgbouncer.Bouncer]:
    running = pgbouncer.start(pg_server)
    yield running
    running.stop()


@pytest.fixture
def databases(pg_server: LocalPostgres, bouncer: pgbouncer.Bouncer) -> Iterator[tuple[str, str]]:
    """An empty database (no schema): its URL through the pooler, and its direct URL."""
    name = pg.fresh_database(pg_server, migrated=False)
    try:
        yield bouncer.url(name), pg_server.url(name)
    finally:
        pg.drop_database(pg_server, name)


def _scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return row[0] if row else None


def _answered(direct: str) -> int:
    return int(
        _scalar(
            direct,
            "SELECT count(*) FROM session_message WHERE type = 'assistant' AND data::jsonb ->> 'status' = 'completed'",
        )
    )


def test_the_pooler_refuses_startup_options_so_rem_sends_none(
    bouncer: pgbouncer.Bouncer, databases: tuple[str, str]
) -> None:
    pooled, _ = databases
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        psycopg.connect(pooled, options="-c lock_timeout=1000").close()
    _scalar(pooled, "SELECT 1")  # the same database without them: fine


def test_turns_takeover_a_decision_and_check_through_pgbouncer(
    bouncer: pgbouncer.Bouncer, databases: tuple[str, str], tmp_path: Path, chroma_url: str, collection: str
) -> None:
    pooled, direct = databases
    tools = tmp_path / "tools"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"demo": server_config(tools)}}))
    env = rem_env(
        REM_DB_URL=pooled,
        REM_DB_POOLED="1",
        # no LISTEN through the pooler: an idle daemon looks for commits every poll, not every 1 s
        REM_DB_POLL_MS="200",
        REM_DATA=str(tmp_path / "data"),
        REM_CHROMA_URL=chroma_url,
        REM_CHROMA_COLLECTION=collection,
        REM_EXECUTION_LEASE_MS="1500",
        REM_AGENT_DELAY_MS="3000",
        REM_MCP_CONFIG=str(config),
        REM_OPERATOR="alice",
        REM_LOG="1",
    )
    init = run_rem("init", env=env)
    assert init.returncode == 0, init.stderr
    assert "schema" in init.stderr and "6432" in init.stderr  # the pooler's URL, migrated through it
    for i in range(INPUTS):
        assert (
            run_rem("send", f"s{i % 3}", f"question number {i}?", "--id", f"in-{i}", env=env).returncode == 0
        )
    # an executor taken down by SIGKILL mid-turn (a reply streams over 3 s): its sessions wait for the lease
    victim = spawn_rem("daemon", "--role", "executor", env=env, log=tmp_path / "victim.log")
    try:
        wait_until(
            lambda: _scalar(direct, "SELECT count(*) FROM session_part") > 0, timeout=60, message="a part"
        )
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    held = int(_scalar(direct, "SELECT count(*) FROM session_execution"))
    assert held > 0
    rescuer = spawn_rem(
        "daemon", "--role", "executor", env={**env, "REM_AGENT_DELAY_MS": "0"}, log=tmp_path / "r.log"
    )
    try:
        wait_until(lambda: _answered(direct) >= INPUTS, timeout=120, message="every input answered")
        recovered = _scalar(direct, "SELECT count(*) FROM event WHERE kind = 'execution.taken_over'")
        assert recovered >= 1, (tmp_path / "r.log").read_text()[-3000:]
        # a tool call held for an operator's decision (an effect tool: `ask` by default), approved
        assert (
            run_rem("send", "s9", "Send the weekly report to bob.", "--id", "in-tool", env=env).returncode
            == 0
        )
        calls = wait_until(
            lambda: rem_json("status", env=env)["tools"]["awaiting_approval"],
            timeout=60,
            message="a held call",
        )
        assert run_rem("approve", calls[0]["call_id"], env=env).returncode == 0
        wait_until(lambda: _answered(direct) >= INPUTS + 1, timeout=60, message="the approved call's turn")
    finally:
        rescuer.send_signal(signal.SIGTERM)
        rescuer.wait(60)
    assert [line for line in (tools / "outbox.jsonl").read_text().splitlines() if line]  # sent once, approved
    replies = _scalar(
        direct,
        "SELECT json_agg(n) FROM (SELECT count(*) AS n FROM session_message WHERE type = 'user' GROUP BY id) AS u",
    )
    assert set(replies) == {1}
    status = rem_json("status", env=env)
    assert status["change_feed"].startswith("poll every")
    for role in ("summarizer", "dream"):  # summaries and the recall index, through the pooler too
        done = run_rem("daemon", "--role", role, "--once", env=env, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
    check = run_rem("check", "--settled", env=env)
    assert check.returncode == 0, (
        check.stdout + check.stderr + run_rem("check", "--settled", "--json", env=env).stdout
    )


@pytest.mark.parametrize("listen", [False, True], ids=["polled", "listen-url"])
def test_the_consoles_change_feed_through_pgbouncer(
    databases: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listen: bool
) -> None:
    pooled, direct = databases
    env = rem_env(
        REM_DB_URL=pooled, REM_DB_POOLED="1", REM_DATA=str(tmp_path / "d"), REM_CHROMA_AUTOSTART="0"
    )
    assert run_rem("init", env=env).returncode == 0
    monkeypatch.setenv("REM_DB_POOLED", "1")
    monkeypatch.setenv("REM_DB_POLL_MS", "200")
    if listen:
        monkeypatch.setenv("REM_DB_LISTEN_URL", direct)
    events = asyncio.run(_feed_hears_a_send(pooled, env))
    assert events[0].kind == "listening" and events[-1].kind == "changed", events
    expected = "LISTEN on REM_DB_LISTEN_URL" if listen else "poll every 200 ms"
    assert rem_json(
        "status", env={**env, **({"REM_DB_LISTEN_URL": direct} if listen else {}), "REM_DB_POLL_MS": "200"}
    )["change_feed"].startswith(expected)
    assert settings.db_pooled


async def _feed_hears_a_send(pooled: str, env: dict[str, str]) -> list[Any]:
    """What the console's watch worker hears (`listen_changes`) around a `rem send` by another process."""
    heard: list[Any] = []
    feed = listen_changes(pooled)
    heard.append(await asyncio.wait_for(feed.__anext__(), 15))
    sent = await asyncio.to_thread(run_rem, "send", "s1", "are you there?", env=env)
    assert sent.returncode == 0, sent.stderr
    while heard[-1].kind != "changed":
        heard.append(await asyncio.wait_for(feed.__anext__(), 15))
    await feed.aclose()
    return heard


def test_a_full_server_is_waited_out_with_one_log_line_and_nothing_lost(
    pg_server: LocalPostgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No free connection (here the pooler's `max_client_conn`, as a server's `max_connections`): a
    write waits for one, says so once in the log, and goes in when one frees; past
    REM_DB_CONNECT_WAIT_MS it is refused in one line, nothing written."""
    full = pgbouncer.start(pg_server, max_clients=2)
    name = pg.fresh_database(pg_server)
    try:
        url = full.url(name)
        holders = [psycopg.connect(url, autocommit=True) for _ in range(2)]
        admitted = asyncio.run(_admit_while_full(url, holders, caplog))
        assert admitted["input_id"] == "in-full"
        waits = [r.getMessage() for r in caplog.records if "no free connection" in r.getMessage()]
        assert len(waits) == 1 and "max_connections" in waits[0] and "REM_DB_CONNECT_WAIT_MS" in waits[0]
        held = [psycopg.connect(url, autocommit=True) for _ in range(2)]
        env = rem_env(
            REM_DB_URL=url, REM_DB_POOLED="1", REM_DB_CONNECT_WAIT_MS="500", REM_CHROMA_AUTOSTART="0"
        )
        refused = run_rem(
            "send", "s1", "anyone?", "--id", "in-refused", "--data", str(tmp_path / "d"), env=env
        )
        # the wait's log line, then the error's one line; no traceback
        assert "Traceback" not in refused.stderr and "waiting up to 0.5 s" in refused.stderr, refused.stderr
        line = refused.stderr.strip().splitlines()[-1]
        assert line.startswith("rem: error: ") and "***" not in line, line
        assert refused.returncode == 3 and "had no free connection" in line and "max_connections" in line, (
            line
        )
        for conn in held:
            conn.close()
        ids = _scalar(pg_server.url(name), "SELECT json_agg(id ORDER BY id) FROM session_input")
        assert ids == ["in-full"]  # the refused one wrote nothing
    finally:
        full.stop()
        pg.drop_database(pg_server, name)


async def _admit_while_full(url: str, holders: list[Any], caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    from backend.execution import sessions
    from backend.store.db import Database

    caplog.set_level("WARNING", logger="rem.postgres")
    opening = asyncio.ensure_future(Database.connect(url))
    await asyncio.sleep(1.0)  # it waits (the log line says so) while both slots are held
    assert not opening.done()
    for conn in holders:
        conn.close()
    db = await asyncio.wait_for(opening, 30)
    try:
        return await sessions.admit(db, "s1", "are you there?", input_id="in-full")
    finally:
        await db.close()


@pytest.mark.parametrize("listen", [False, True], ids=["polled", "listen-url"])
def test_the_api_server_through_pgbouncer(databases: tuple[str, str], tmp_path: Path, listen: bool) -> None:
    """`rem serve` behind the pooler: its event stream hears another process's admission (the feed
    polled, or on REM_DB_LISTEN_URL), and an input id posted twice at once, to one session or to
    two whose admissions go on different write connections, is admitted exactly once."""
    pooled, direct = databases
    env = rem_env(
        REM_DB_URL=pooled,
        REM_DB_POOLED="1",
        REM_DB_POLL_MS="200",
        REM_DB_MAX_CONNECTIONS="6",  # the server's three write connections
        REM_DATA=str(tmp_path / "data"),
        REM_CHROMA_AUTOSTART="0",
        **({"REM_DB_LISTEN_URL": direct} if listen else {}),
    )
    assert run_rem("init", env=env).returncode == 0
    made = run_rem("token", "create", "ops", "--all-projects", "--scope", "read", "--scope", "write", env=env)
    assert made.returncode == 0, made.stderr
    proc, url = start_serve(tmp_path / "data", env, tmp_path / "serve.log")
    try:
        admitted = asyncio.run(_serve_through_the_pooler(url, made.stdout.strip(), env))
    finally:
        stop_serve(proc)
    assert admitted == {"in-cli": 1, "in-same": 1, "in-apart": 1}, (tmp_path / "serve.log").read_text()
    rows = _scalar(direct, "SELECT json_object_agg(id, session_id) FROM session_input")
    assert rows["in-cli"] == "s1" and rows["in-same"] == "s2" and rows["in-apart"] in _APART


_APART = ("s3", "s4")  # crc32 % 3 puts them on different write connections (`Database._lane`)


async def _serve_through_the_pooler(url: str, token: str, env: dict[str, str]) -> dict[str, int]:
    """Each input id's `input.admitted` events on the server's stream, once all three are in."""
    assert len({zlib.crc32(s.encode()) % 3 for s in _APART}) == 2
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        async with client.stream("GET", "/v1/events") as stream:
            blocks = sse_blocks(stream)
            await collect(blocks, count=0)  # the priming block: the stream follows from here
            sent = await asyncio.to_thread(
                run_rem, "send", "s1", "from another process", "--id", "in-cli", env=env
            )
            assert sent.returncode == 0, sent.stderr
            seen = await _admissions(blocks, {"in-cli"})  # heard through the feed
            same = await asyncio.gather(
                *(
                    client.post("/v1/sessions/s2/inputs", json={"text": "twice?", "input_id": "in-same"})
                    for _ in range(2)
                )
            )
            assert sorted(a.status_code for a in same) == [202, 202]
            assert sorted(a.json()["duplicate"] for a in same) == [False, True]
            apart = await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/{s}/inputs", json={"text": "where?", "input_id": "in-apart"})
                    for s in _APART
                )
            )
            assert sorted(a.status_code for a in apart) == [202, 409], [a.text for a in apart]
            seen += await _admissions(blocks, {"in-same", "in-apart"})
            # nothing more comes: a second admission of either id would be here within the poll
            with contextlib.suppress(TimeoutError):
                seen += await asyncio.wait_for(collect(blocks, count=1), 1.0)
    ids = [b.json()["input_id"] for b in seen if b.event == "input.admitted"]
    return {i: ids.count(i) for i in ids}


async def _admissions(blocks: AsyncIterator[Sse], ids: set[str]) -> list[Sse]:
    """The stream's blocks until an `input.admitted` of each of `ids` came (30 s at most)."""
    seen: list[Sse] = []

    async def read() -> None:
        async for block in blocks:
            seen.append(block)
            if ids <= {b.json()["input_id"] for b in seen if b.event == "input.admitted"}:
                return

    await asyncio.wait_for(read(), 30)
    return seen
