"""The schema's constraints bite: the database itself refuses what the contract forbids."""

from __future__ import annotations

import re
import sqlite3
from enum import StrEnum

import pytest

from backend.core.errors import SchemaTooNew
from backend.dream.digester import DigestState
from backend.execution.leases import ExecutionPhase
from backend.execution.sessions import Delivery
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.schema import SCHEMA_VERSION, migrate, schema_version
from backend.store.workers import WorkerRole, WorkerState
from backend.summaries.summarizer import JobStatus

SEED_004_INDEXES = {
    "session_message_session_seq_idx",
    "session_message_session_type_seq_idx",
    "session_message_session_time_created_id_idx",
    "session_message_time_created_idx",
    "session_input_session_admitted_seq_idx",
    "session_input_session_promoted_seq_idx",
    "session_recovery_wake_pending_error_attempts_created_execution_idx",
    "session_input_wake_pending_promoted_attempts_created_id_idx",
}


async def _session(db: Database, sid: str = "s1") -> None:
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (sid,))


async def _message(db: Database, mid: str, seq: int, sid: str = "s1") -> None:
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated) "
            "VALUES (?, ?, 'user', ?, 1, 1)",
            (mid, sid, seq),
        )


async def test_migrate_sets_user_version_and_is_idempotent(db_ctx: Context) -> None:
    db = await db_ctx.db()
    assert await schema_version(db) == SCHEMA_VERSION
    assert await migrate(db) == SCHEMA_VERSION
    migrations = await db.scalar("SELECT count(*) FROM event WHERE kind = 'schema.migrated'")
    assert migrations == 1


async def test_a_v1_database_migrates_to_the_lean_journal_indexes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A state.db made by schema v1 keeps its journal; v2 swaps the journal's indexes."""
    from backend.dream.digester import LAST_LEGACY_EVENT_SQL
    from backend.store import events, schema
    from backend.store.maintenance import PRUNE_SQL

    db = await Database.open(tmp_path / "state.db")
    try:
        async with db.tx() as conn:
            await schema._apply(conn, schema.V1)  # build exactly what v1 built
            await conn.execute("PRAGMA user_version = 1")
            await events.append_event(
                conn, kind="execution.claimed", actor="x1", session_id="s1", target="e1"
            )
            await events.append_event(conn, kind="worker.started", actor="x1", target="x1")
        assert await migrate(db) == SCHEMA_VERSION == 13
        names = {
            r[0]
            for r in await db.fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'event'"
            )
        }
        assert names == {"event_session_idx", "event_target_idx", "event_operator_idx", "event_legacy_idx"}
        assert await db.scalar("SELECT count(*) FROM event") == 3  # two rows kept, one migration row added
        shown = await events.history(db, session_id="s1", target="e1")
        assert [e["kind"] for e in shown] == ["execution.claimed"]
        assert [e["kind"] for e in await events.history(db, target="x1")] == ["worker.started"]
        plans = {
            "history": events.HISTORY_SQL,
            "legacy": LAST_LEGACY_EVENT_SQL,
            "prune": PRUNE_SQL,
        }
        params = {
            "history": {"target": "e1", "session_id": "s1", "limit": 5},
            "legacy": {},
            "prune": {"cutoff": 0, "chunk": 5},
        }
        detail = {
            name: " | ".join(r[3] for r in await db.fetchall("EXPLAIN QUERY PLAN " + sql, params[name]))
            for name, sql in plans.items()
        }
        assert "event_target_idx" in detail["history"] and "event_session_idx" in detail["history"]
        assert "event_legacy_idx" in detail["legacy"]
        assert "SCAN event" in detail["prune"]  # in id order, stopping at the first row kept
    finally:
        await db.close()


async def test_every_seed_index_exists(db_ctx: Context) -> None:
    db = await db_ctx.db()
    names = {r[0] for r in await db.fetchall("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert SEED_004_INDEXES <= names
    unique = {r[1] for r in await db.fetchall("PRAGMA index_list(session_message)") if r[2]}
    assert "session_message_session_seq_idx" in unique


async def test_execution_phase_outside_the_four_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    with pytest.raises(sqlite3.IntegrityError, match="session_execution_phase_check"):
        async with db.tx() as conn:
            await conn.execute(
                "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, "
                "time_created, time_renewed, expires_at) VALUES ('e1','s1','o',1,'running',1,1,1)"
            )
    for phase in ("ready", "safe", "unknown", "continue"):
        async with db.tx() as conn:
            await conn.execute(
                "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, "
                "time_created, time_renewed, expires_at) VALUES ('e1','s1','o',1,?,1,1,1)",
                (phase,),
            )
            await conn.execute("DELETE FROM session_execution")


async def test_second_execution_for_one_session_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    insert = (
        "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
        "time_renewed, expires_at) VALUES (?, 's1', 'o', 1, 'ready', 1, 1, 1)"
    )
    async with db.tx() as conn:
        await conn.execute(insert, ("e1",))
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        async with db.tx() as conn:
            await conn.execute(insert, ("e2",))


async def test_duplicate_message_seq_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    await _message(db, "m1", 1)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        await _message(db, "m2", 1)


@pytest.mark.parametrize("column", ["admitted_seq", "promoted_seq"])
async def test_duplicate_input_seq_is_refused(db_ctx: Context, column: str) -> None:
    db = await db_ctx.db()
    await _session(db)
    insert = (
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, promoted_seq, "
        "time_created) VALUES (?, 's1', '{}', 'queue', ?, ?, 1)"
    )
    async with db.tx() as conn:
        await conn.execute(insert, ("i1", 1, 5))
    other = (2, 5) if column == "promoted_seq" else (1, 6)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        async with db.tx() as conn:
            await conn.execute(insert, ("i2", *other))


async def test_unknown_delivery_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        async with db.tx() as conn:
            await conn.execute(
                "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                "time_created) VALUES ('i1', 's1', '{}', 'shout', 1, 1)"
            )


async def test_deleting_a_session_cascades(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _session(db)
    await _message(db, "m1", 1)
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
            "time_created) VALUES ('i1', 's1', '{}', 'queue', 2, 1)"
        )
        await conn.execute(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, "
            "time_created, time_renewed, expires_at) VALUES ('e1','s1','o',1,'ready',1,1,1)"
        )
        await conn.execute(
            "INSERT INTO session_recovery (execution_id, session_id, continuation_message_id, "
            "phase, time_created) VALUES ('e0', 's1', 'm1', 'ready', 1)"
        )
        await conn.execute(
            "INSERT INTO summary_job (session_id, time_created, time_updated) VALUES ('s1', 1, 1)"
        )
        await conn.execute("INSERT INTO dream_state (session_id, time_updated) VALUES ('s1', 1)")
        await conn.execute(
            "INSERT INTO session_context_epoch (session_id, baseline, snapshot, baseline_seq, "
            "time_updated) VALUES ('s1', 'b', '{}', 0, 1)"
        )
    async with db.tx() as conn:
        await conn.execute("DELETE FROM session WHERE id = 's1'")
    for table in (
        "session_message",
        "session_input",
        "session_execution",
        "session_recovery",
        "summary_job",
        "dream_state",
        "session_context_epoch",
    ):
        assert await db.scalar(f"SELECT count(*) FROM {table}") == 0, table


async def test_event_journal_is_append_only(db_ctx: Context) -> None:
    db = await db_ctx.db()
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        async with db.tx() as conn:
            await conn.execute("UPDATE event SET kind = 'forged'")


async def test_state_db_from_a_newer_rem_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNew, match="newer than this rem supports"):
        await migrate(db)


async def test_a_v2_database_gains_the_model_columns_and_keeps_its_sessions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """v3: holds, the last model error, the usage index and model_call; existing rows untouched."""
    from backend.store import schema

    db = await Database.open(tmp_path / "state.db")
    try:
        async with db.tx() as conn:
            await schema._apply(conn, schema.V1)
            await schema._apply(conn, schema.V2)
            await conn.execute("PRAGMA user_version = 2")
            await conn.execute(
                "INSERT INTO session (id, tokens_input, tokens_output, cost, time_created, time_updated) "
                "VALUES ('s1', 10, 5, 0.5, 1, 1)"
            )
        assert await migrate(db) == SCHEMA_VERSION >= 3
        row = await db.fetchone("SELECT tokens_input, cost, held_at, held_reason, model_error FROM session")
        assert tuple(row) == (10, 0.5, None, None, None)
        assert await db.scalar("SELECT count(*) FROM model_call") == 0
        plan = await db.fetchall(
            "EXPLAIN QUERY PLAN SELECT count(*) FROM session INDEXED BY session_usage_idx "
            "WHERE tokens_input > 0 OR tokens_output > 0 OR model_error IS NOT NULL"
        )
        assert "COVERING INDEX session_usage_idx" in " ".join(r["detail"] for r in plan)
    finally:
        await db.close()


async def test_a_v3_database_migrates_to_projects_and_the_recall_index(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """v4 keeps every session (now in project `default`) and adds an empty recall index."""
    from backend.store import schema

    db = await Database.open(tmp_path / "state.db")
    try:
        async with db.tx() as conn:
            await schema._apply(conn, schema.V1)
            await schema._apply(conn, schema.V2)
            await schema._apply(conn, schema.V3)
            await conn.execute("PRAGMA user_version = 3")
            await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s1', 1, 1)")
            await conn.execute(
                "INSERT INTO dream_state (session_id, input_revision, time_updated) VALUES ('s1', 'sha256:a', 1)"
            )
        assert await migrate(db) == SCHEMA_VERSION == 13
        assert await db.scalar("SELECT project FROM session WHERE id = 's1'") == "default"
        lagging = await db.fetchall(
            "SELECT session_id FROM dream_state WHERE input_revision IS NOT NULL "
            "AND indexed_revision IS NOT input_revision"
        )
        assert [r[0] for r in lagging] == ["s1"]  # published but not indexed yet: index lag
        assert await db.scalar("SELECT count(*) FROM memory_turn") == 0
        # the FTS5 side is one table per project, created with the project's first indexed turn
        assert await db.scalar("SELECT count(*) FROM sqlite_master WHERE name GLOB 'memory_fts_*'") == 0
    finally:
        await db.close()


# every closed set of strings a column holds is one StrEnum in the code; the schema's CHECK is the other copy
COLUMN_ENUMS = [
    ("session_execution", "phase", ExecutionPhase, set(ExecutionPhase)),
    ("session_recovery", "phase", ExecutionPhase, set(ExecutionPhase) - {ExecutionPhase.SAFE}),
    ("session_input", "delivery", Delivery, set(Delivery)),
    ("summary_job", "status", JobStatus, set(JobStatus)),
    ("dream_state", "digest_state", DigestState, set(DigestState)),
    ("worker", "role", WorkerRole, set(WorkerRole)),
    ("worker", "state", WorkerState, set(WorkerState)),
]


@pytest.mark.parametrize(
    ("table", "column", "enum", "allowed"),
    COLUMN_ENUMS,
    # ids from the table and column only: a set's order changes with the hash seed, and
    # pytest-xdist needs every worker to collect the same ids in the same order
    ids=[f"{table}.{column}" for table, column, _, _ in COLUMN_ENUMS],
)
async def test_each_enum_matches_its_column_check(
    db_ctx: Context, table: str, column: str, enum: type[StrEnum], allowed: set[StrEnum]
) -> None:
    db = await db_ctx.db()
    sql = await db.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
    check = re.search(rf"CHECK \({column} IN \(([^)]*)\)\)", sql)
    assert check is not None, f"{table}.{column} has no CHECK ... IN (...)"
    values = {v.strip().strip("'") for v in check.group(1).split(",")}
    assert values == {str(v) for v in allowed}, enum.__name__
