"""What the PostgreSQL benchmarks share: a server to run on and a fresh database per round."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg


@contextlib.contextmanager
def server(url: str | None, tmp: Path) -> Iterator[str]:
    """`url` (a server you run: its role needs CREATEDB), else a throw-away local one (fsync on)."""
    if url:
        yield url
        return
    from backend.programs import postgres_server

    local = postgres_server.start(tmp / "pg")
    try:
        yield local.url()
    finally:
        local.stop(remove=True)


@contextlib.contextmanager
def fresh_database(server_url: str, name: str) -> Iterator[str]:
    """A new empty database `name` on the server (dropped first if left over, and after)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def migrated_throwaway(prefix: str, *, fast: bool = False) -> tuple[str, Path]:
    """A throw-away local server's database with rem's schema (stopped and removed at exit): its URL
    and the scratch dir it lives in."""
    from backend.programs import postgres_server
    from backend.store import schema_pg
    from backend.store.postgres import PgConnection

    root = Path(tempfile.mkdtemp(prefix=prefix))
    local = postgres_server.start(root / "pg", fast=fast)
    atexit.register(shutil.rmtree, root, True)
    atexit.register(local.stop)
    url = local.url()
    conn = PgConnection(url)
    try:
        schema_pg.migrate_sync(conn, "bench")
    finally:
        conn.close()
    return url, root
