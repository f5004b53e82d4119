"""`rem serve` on PostgreSQL holds at most REM_DB_MAX_CONNECTIONS connections to the store, counted at
the server (`pg_stat_activity`), with every kind of use open at once: admissions over many sessions
(its write connections), token checks and a read (its reader), an event stream (the hub's reader and its
LISTEN): all but the write connections are needed, so at least 4."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from backend.core.datadir import DataDir
from backend.runtime.context import Context
from tests import pg
from tests.api.conftest import make_tokens, start_serve, stop_serve
from tests.api.serving import collect, sse_blocks
from tests.helpers import rem_env

SESSIONS = 16


@pytest.fixture
def database(pg_server: pg.LocalPostgres) -> Iterator[str]:
    name = pg.fresh_database(pg_server)
    try:
        yield pg_server.url(name)
    finally:
        pg.drop_database(pg_server, name)


def _connections(url: str) -> int:
    """Every client connection to the test's database but this one (the LISTEN's has no application name)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row else 0


async def _admit_and_follow(url: str, token: str) -> None:
    """Admissions on SESSIONS sessions side by side while a stream follows them; a transcript read."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        async with client.stream("GET", "/v1/events") as stream:
            blocks = sse_blocks(stream)
            await collect(blocks, count=0)  # the priming block: the hub listens and reads from here
            answers = await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/s{i}/inputs", json={"text": "hello?", "input_id": f"in-{i}"})
                    for i in range(SESSIONS)
                )
            )
            assert [a.status_code for a in answers] == [202] * SESSIONS
            seen = await asyncio.wait_for(collect(blocks, count=SESSIONS), 60)
            assert {b.json()["session_id"] for b in seen if b.event == "input.admitted"} == {
                f"s{i}" for i in range(SESSIONS)
            }
            assert (await client.get("/v1/sessions/s0/messages")).status_code == 200


@pytest.mark.parametrize("budget", [4, 6])
def test_the_servers_connections_stay_within_rem_db_max_connections(
    database: str, tmp_path: Path, budget: int
) -> None:
    data = tmp_path / "data"
    tokens = asyncio.run(make_tokens(Context(DataDir(data), start_chroma=False, db_url=database)))
    env = rem_env(REM_DB_URL=database, REM_DB_MAX_CONNECTIONS=str(budget), REM_CHROMA_AUTOSTART="0")
    proc, url = start_serve(data, env, tmp_path / "serve.log")
    try:
        asyncio.run(_admit_and_follow(url, tokens["ops"]))
        held = _connections(database)
        assert 4 <= held <= budget, (held, (tmp_path / "serve.log").read_text())
    finally:
        stop_serve(proc)
