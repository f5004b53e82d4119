"""The console over the PostgreSQL store (`--db`): LISTEN/NOTIFY instead of watchfiles, on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backend import ops
from backend.core.datadir import DataDir
from backend.programs.postgres_server import LocalPostgres
from tests import pg
from tests.helpers import rem_env, run_rem
from tests.tui.test_console import SIZE, loaded, plain, table, until
from tui.app import ConsoleApp
from tui.widgets.banner import Banner
from tui.widgets.header import ConsoleHeader


@pytest.fixture
def store() -> str:
    """Every test here runs on PostgreSQL (`db_url` is a fresh migrated database)."""
    return "postgres"


def commit_journal_row(url: str, kind: str = "test.commit") -> None:
    """A commit by another connection, as another process would make it."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (1, %s, 'test', '{}')", (kind,))


def event_kinds(app: ConsoleApp) -> set[str]:
    return {e["kind"] for e in app.latest["events"]} if app.latest is not None else set()


class CountedStatus:
    """`ops.status`, counting the snapshot reads the console makes."""

    def __init__(self) -> None:
        self.reads = 0

    async def __call__(self, ctx: Any, **options: Any) -> Any:
        self.reads += 1
        return await ops.status(ctx, **options)


async def test_the_console_over_db_names_the_store_and_shows_another_process_commit(
    tmp_path: Path, db_url: str
) -> None:
    secret = db_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@")
    with psycopg.connect(db_url, autocommit=True) as conn:  # the server trusts local users: any password
        conn.execute("SELECT 1")
    app = ConsoleApp(DataDir(tmp_path / "data"), db_url=secret, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert not (tmp_path / "data" / "state.db").exists()  # nothing falls back to SQLite
        header = plain(app.query_one("#header", ConsoleHeader))
        name = db_url.split("?")[0].rsplit("/", 1)[1]
        assert "postgresql://postgres@" in header and f"/{name}" in header, header
        assert "s3cret" not in header and "***" not in header
        assert app.backend is not None
        await until(pilot, lambda: app.backend is not None and app.backend.listening, "the listener")
        assert table(app, "backlog").shown_keys() == []
        # another process admits an input: only the change feed can tell the console (no poll for an hour)
        sent = await asyncio.to_thread(
            run_rem,
            "--db",
            db_url,
            "--data",
            str(tmp_path / "writer"),
            "send",
            "s-pg",
            "hello",
            env=rem_env(REM_CHROMA_AUTOSTART="0"),
        )
        assert sent.returncode == 0, sent.stderr
        await until(pilot, lambda: "in:s-pg" in table(app, "backlog").shown_keys(), "the input on screen")
        assert table(app, "events").shown_keys()  # its journal rows too


@pytest.fixture
def other_db_url(pg_server: LocalPostgres) -> Iterator[str]:
    """Another rem database on the same server."""
    yield from pg.database_url(pg_server)


async def test_another_database_on_the_same_server_never_opens_the_gate(
    tmp_path: Path, db_url: str, other_db_url: str
) -> None:
    counted = CountedStatus()
    app = ConsoleApp(
        DataDir(tmp_path / "data"), db_url=db_url, status_loader=counted, poll_s=0.05, health_s=3600
    )
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        backend = app.backend
        assert backend is not None
        await until(pilot, lambda: backend.listening, "the listener")
        # the connect itself opened the gate once: wait until that read is done
        await until(pilot, lambda: app.refresher.idle and backend.changes_heard > 0)
        gate_checks = {"n": 0}
        real_version = backend.data_version

        async def counted_version() -> int:
            gate_checks["n"] += 1
            return await real_version()

        backend.data_version = counted_version  # type: ignore[method-assign]
        await until(pilot, lambda: app.refresher.idle)
        reads = counted.reads
        for i in range(20):  # commits in ANOTHER rem database on the same server
            await asyncio.to_thread(commit_journal_row, other_db_url, f"other.{i}")
        start = gate_checks["n"]
        # the poll consults the gate every 50 ms: after 10 more checks, none of them read
        await until(pilot, lambda: gate_checks["n"] >= start + 10, "ten gate checks")
        assert counted.reads == reads
        # a commit in this database is heard and read: once
        await asyncio.to_thread(commit_journal_row, db_url, "ours")
        await until(pilot, lambda: counted.reads == reads + 1, "one read after our commit")
        await until(pilot, lambda: "ours" in event_kinds(app), "our commit in the snapshot")
        checks = gate_checks["n"]
        await until(pilot, lambda: gate_checks["n"] >= checks + 10, "ten more gate checks")
        assert counted.reads == reads + 1


async def test_a_lost_change_feed_is_shown_and_the_listener_comes_back(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every problem the banner was given, in order: the lost feed shows only until the listener
    # is back (0.5 s), which a check every 50 ms can miss on a loaded machine (a clean-clone CI
    # run on three workers did); the history cannot miss it
    shown: list[tuple[str, str | None]] = []
    original = Banner.set_problem

    def recorded(self: Banner, source: str, message: str | None) -> None:
        shown.append((source, message))
        original(self, source, message)

    monkeypatch.setattr(Banner, "set_problem", recorded)
    app = ConsoleApp(DataDir(tmp_path / "data"), db_url=db_url, poll_s=3600, health_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        backend = app.backend
        assert backend is not None
        await until(pilot, lambda: backend.listening, "the listener")
        banner = app.query_one("#banner", Banner)
        with psycopg.connect(db_url, autocommit=True) as killer:
            # the server ends the listener's session, as a restart or failover would
            listeners = killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
            ).fetchall()
        assert listeners == [(True,)]
        await until(
            pilot, lambda: any(src == "feed" and msg for src, msg in shown), "the lost feed on the banner"
        )
        assert any(src == "feed" and msg and "change feed lost" in msg for src, msg in shown), shown
        await until(pilot, lambda: backend.listening and "feed" not in banner.problems, "listening again")
        await asyncio.to_thread(commit_journal_row, db_url, "after.reconnect")
        await until(pilot, lambda: "after.reconnect" in event_kinds(app), "a commit after the reconnect")
