"""One real `rem serve` per test module and store (SQLite, PostgreSQL), its tokens, and a Context on
the same store for what a test sets up or checks behind the API's back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import ops
from backend.chroma.server import ChromaServer
from backend.core import clock
from backend.core.datadir import DataDir
from backend.execution import leases, parking, tool_calls
from backend.execution.tool_calls import Outcome, PlannedCall
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState
from tests import pg
from tests.helpers import REM, rem_env, wait_until

# name -> (projects (None: all), scopes)
TOKENS: dict[str, tuple[list[str] | None, list[str]]] = {
    "ops": (None, ["read", "write", "decide"]),
    "alpha": (["alpha"], ["read", "write", "decide"]),
    "beta": (["beta"], ["read", "write", "decide"]),
    "reader": (["alpha"], ["read"]),
}


@dataclass
class Served:
    """A `rem serve` process on a store, with a bearer token per name in TOKENS."""

    url: str
    data: Path
    db_url: str | None
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, token: str | None = "ops", **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[token]}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def async_client(self, token: str = "ops") -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)

    def context(self) -> Context:
        return Context(DataDir(self.data), start_chroma=False, db_url=self.db_url)


def start_serve(data: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`rem serve` on a free loopback port; its URL from the line it prints."""
    proc = subprocess.Popen(
        [REM, "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),
        env=env,
        start_new_session=True,
    )
    found = wait_until(
        lambda: (
            proc.poll() is None
            and re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        ),
        timeout=60,
        message=f"`rem serve` to listen ({log})",
    )
    return proc, found.group(1)


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def make_tokens(ctx: Context) -> dict[str, str]:
    made = {}
    for name, (projects, scopes) in TOKENS.items():
        created = await ops.token_create(
            ctx, name, projects=projects, all_projects=projects is None, scopes=scopes
        )
        made[name] = created["token"]
    await ctx.close()
    return made


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, chroma: ChromaServer
) -> Iterator[Served]:
    """The module's server, on SQLite and on PostgreSQL."""
    root = tmp_path_factory.mktemp(f"serve-{request.param}")
    data = root / "data"
    db_name = None
    server: pg.LocalPostgres | None = None
    if request.param == "postgres":
        server = request.getfixturevalue("pg_server")
        db_name = pg.fresh_database(server)
    db_url = server.url(db_name) if server and db_name else None
    env = rem_env(REM_CHROMA_URL=chroma.url, REM_DB_URL=db_url or "", REM_TEST_MODE="1")
    tokens = asyncio.run(make_tokens(Context(DataDir(data), start_chroma=False, db_url=db_url)))
    proc, url = start_serve(data, env, root / "serve.log")
    try:
        yield Served(url=url, data=data, db_url=db_url, env=env, proc=proc, tokens=tokens)
    finally:
        stop_serve(proc)
        if server is not None and db_name is not None:
            pg.drop_database(server, db_name)


@pytest.fixture
async def store_ctx(served: Served) -> AsyncIterator[Context]:
    """A Context on the server's store, for setting up and checking behind the API."""
    ctx = served.context()
    await ctx.db()
    yield ctx
    await ctx.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def parked_turn(db: Database, session_id: str, project: str, states: list[ToolCallState]) -> list[str]:
    """A session of `project` whose turn asked for calls in `states` (running ones become unknown), parked."""
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, project, time_created, time_updated) VALUES (?, ?, ?, ?)",
            (session_id, project, now, now),
        )
    lease = await leases.claim(db, session_id, "executor-test", length_ms=60_000)
    assert lease is not None
    planned = [
        PlannedCall(
            idx=i,
            model_call_id=f"m{i}",
            tool="outbox.outbox_send",
            arguments=json.dumps({"to": "ops", "n": i}),
            effect="effect",
            effect_source="annotation",
            permission="ask" if s == ToolCallState.AWAITING_APPROVAL else "allow",
            state=s,
        )
        for i, s in enumerate(states)
    ]

    def write(conn: Any) -> list[str]:
        guard_sync(conn, lease, now=now)
        ids = tool_calls.insert_sync(conn, lease, 1, f"{lease.execution_id}:1", planned, now)
        tool_calls.start_sync(conn, lease, [], now)
        for cid, state in zip(ids, states, strict=True):
            if state == ToolCallState.RUNNING:
                unknown = Outcome(state=ToolCallState.UNKNOWN, result=None, is_error=False, reason="x")
                tool_calls.finish_sync(conn, lease, cid, unknown, now)
        assert parking.park_sync(conn, lease, now=now) is not None
        return ids

    ids: list[str] = await db.write_in_thread(write)
    return ids
