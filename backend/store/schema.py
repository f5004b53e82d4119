"""Applying the schema: state.db versioned with `PRAGMA user_version`, forward migrations only.

The migrations themselves are `backend.store.migrations` (SQLite scripts);
PostgreSQL's are built from them by `backend.store.schema_pg`, which this
module calls for a PostgreSQL store. The scripts, `MIGRATIONS`,
`SCHEMA_VERSION` and `split_statements` are re-exported here, where callers
have always found them.
"""

from __future__ import annotations

import logging
from functools import partial

import aiosqlite

from backend.core import clock
from backend.core.errors import DataDirError, SchemaTooNew, SchemaTooOld
from backend.store.db import FOREIGN_TABLES_SQL, Conn, Database, engine_of, refuse_foreign
from backend.store.events import append_event

# re-exported: where callers and tests have always found them
from backend.store.migrations import MIGRATIONS as MIGRATIONS
from backend.store.migrations import SCHEMA_VERSION as SCHEMA_VERSION
from backend.store.migrations import V1 as V1
from backend.store.migrations import V2 as V2
from backend.store.migrations import V3 as V3
from backend.store.migrations import V4 as V4
from backend.store.migrations import V5 as V5
from backend.store.migrations import V6 as V6
from backend.store.migrations import V7 as V7
from backend.store.migrations import V8 as V8
from backend.store.migrations import V9 as V9
from backend.store.migrations import V10 as V10
from backend.store.migrations import V11 as V11
from backend.store.migrations import V12 as V12
from backend.store.migrations import split_statements as split_statements

log = logging.getLogger("rem.schema")


async def schema_version(db: Database) -> int:
    if db.postgres:
        from backend.store import schema_pg  # import time: psycopg, only for a PostgreSQL store

        return await db.run_in_thread(schema_pg.schema_version_sync)
    return int(await db.scalar("PRAGMA user_version"))


def schema_version_sync(conn: Conn) -> int:
    """`schema_version`, inside the caller's transaction on the connection's thread."""
    if engine_of(conn) == "postgresql":
        from backend.store import schema_pg  # import time: psycopg, only for a PostgreSQL store

        return schema_pg.schema_version_sync(conn)
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def supported_version(db: Database) -> int:
    """The newest schema this rem knows for the store's engine (PostgreSQL has migrations of its own)."""
    if db.postgres:
        from backend.store import schema_pg  # import time: psycopg, only for a PostgreSQL store

        return schema_pg.pg_schema_version()
    return SCHEMA_VERSION


async def migrate(db: Database) -> int:
    """Bring the store to SCHEMA_VERSION; refuse a database from a newer rem, or not rem's at all."""
    if db.postgres:
        from backend.store import schema_pg  # import time: psycopg, only for a PostgreSQL store

        with db.errors():
            await db.run_in_thread(partial(schema_pg.migrate_sync, where=db.where))
        return schema_pg.pg_schema_version()
    current = await schema_version(db)
    _refuse_newer(db, current)
    if current == SCHEMA_VERSION:
        return current
    async with db.tx() as conn:
        # re-read inside the write lock: another process may have migrated meanwhile
        current = int(list(await conn.execute_fetchall("PRAGMA user_version"))[0][0])
        _refuse_newer(db, current)
        refuse_foreign(db.path, current, [r["name"] for r in await conn.execute_fetchall(FOREIGN_TABLES_SQL)])
        for version in range(current, SCHEMA_VERSION):
            await _apply(conn, MIGRATIONS[version])
            log.info("migrated %s to schema version %d", db.path, version + 1)
        if current < SCHEMA_VERSION:
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await append_event(
                conn,
                kind="schema.migrated",
                actor="rem",
                data={"from": current, "to": SCHEMA_VERSION},
                now=clock.now_ms(),
            )
    return SCHEMA_VERSION


async def refuse_unusable(db: Database) -> None:
    """For read-only opens: refuse a state.db from a newer rem, another program, never initialised,
    or not migrated yet (a read-only rem never migrates, and cannot read an older schema)."""
    current = await schema_version(db)
    _refuse_newer(db, current)
    if db.postgres:
        from backend.store import schema_pg  # import time: psycopg, only for a PostgreSQL store

        if current == 0:
            schema_pg.refuse_foreign(db.where, current, await db.run_in_thread(schema_pg.foreign_tables_sync))
            raise DataDirError(f"{db.where} has no rem schema yet; run `rem init --db URL`")
        if current < schema_pg.pg_schema_version():
            raise SchemaTooOld(
                f"{db.where} has schema version {current}, older than this rem reads "
                f"({schema_pg.pg_schema_version()}); run `rem init --db URL` to migrate it (that writes)"
            )
        return
    if current == 0:
        refuse_foreign(db.path, current, [r["name"] for r in await db.fetchall(FOREIGN_TABLES_SQL)])
        raise DataDirError(f"{db.path} has no rem schema yet; run `rem init --data {db.path.parent}`")
    if current < SCHEMA_VERSION:
        # a read-only open writes nothing, so it cannot migrate, and this rem's queries name
        # tables and indexes the older schema lacks: say so instead of failing on one of them
        raise SchemaTooOld(
            f"{db.path} has schema version {current}, older than this rem reads ({SCHEMA_VERSION}); "
            f"run `rem init --data {db.path.parent}` to migrate it (that writes), or read it with the "
            "rem that wrote it"
        )


def _refuse_newer(db: Database, current: int) -> None:
    supported = supported_version(db)
    if current > supported:
        fix = "point --db at another database" if db.postgres else "point --data at another directory"
        raise SchemaTooNew(
            f"{db.where} has schema version {current}, newer than this rem supports "
            f"({supported}); upgrade rem or {fix}"
        )


async def _apply(conn: aiosqlite.Connection, script: str) -> None:
    # executescript would COMMIT our BEGIN IMMEDIATE; run statement by statement.
    for statement in split_statements(script):
        await conn.execute(statement)
