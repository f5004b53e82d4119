"""The PostgreSQL store's write connections (lanes): a session's writes on one, other sessions' beside
it, at most REM_DB_MAX_CONNECTIONS in all; group commits that never deadlock another process's."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from backend.core.datadir import DataDir
from backend.core.errors import DatabaseLocked
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store.db import Database

pytestmark = pytest.mark.parametrize("store", ["postgres"], indirect=True)


def _rem_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rem' AND datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


@pytest.mark.parametrize("budget", [3, 5])
async def test_a_process_holds_at_most_rem_db_max_connections(
    data_dir: DataDir, db_url: str, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    monkeypatch.setenv("REM_DB_MAX_CONNECTIONS", str(budget))
    ctx = Context(data_dir, start_chroma=False, db_url=db_url)
    db = await ctx.db()
    try:
        for i in range(40):
            await sessions.admit(db, f"s{i % 16}", f"question {i}?", input_id=f"in-{i}")
        executor = Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), concurrency=8)
        assert await executor.run() == 0 and executor.turns_completed == 40
        writers = len(db.server_pids())  # the write connections it opened (a listener would be one more)
        assert writers == budget - 2  # all but the reader's and the listener's: sessions spread over them
        assert _rem_connections(db_url) <= budget - 1  # and the reader (no listener: a `--once` pass)
    finally:
        await ctx.close()


async def test_two_processes_group_commits_over_the_same_sessions_never_deadlock(
    db_ctx: Context, db_url: str
) -> None:
    """Each group commit locks its members' session rows; two processes' groups that locked them in
    opposite orders deadlocked (SQLSTATE 40P01): members go in key order, in every process."""
    first, second = await Database.connect(db_url), await Database.connect(db_url)
    names = [f"s{i:02d}" for i in range(24)]
    try:
        for round_ in range(6):

            async def admit(db: Database, order: list[str], tag: str, n: int = round_) -> list[object]:
                return await asyncio.gather(
                    *(sessions.admit(db, sid, f"{tag} {n}?", input_id=f"{tag}-{n}-{sid}") for sid in order),
                    return_exceptions=True,
                )

            results = await asyncio.gather(admit(first, names, "a"), admit(second, names[::-1], "b"))
            failures = [r for batch in results for r in batch if isinstance(r, BaseException)]
            assert not [f for f in failures if isinstance(f, DatabaseLocked)], failures
            assert not failures, failures
        assert await first.scalar("SELECT count(*) FROM session_input") == 2 * 6 * len(names)
    finally:
        await first.close()
        await second.close()
