"""The status counters (schema v6): kept by triggers, equal to real counts whatever writes the rows.

Every test that uses the `ctx` or `db_ctx` fixture also checks every counter
against a real count at teardown (tests/conftest.py), so each write path the
suite drives (turns, recovery, holds, summaries, receipts, replay, Dream,
the recall index, operator actions) is covered; here: the migration's
backfill, arbitrary sequences of row changes (hypothesis), rollback, a
SIGKILL in the middle of a transaction, and `rem check` finding a drift.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend import ops
from backend.core.datadir import DataDir
from backend.dream.digester import DigestState
from backend.ops import checks
from backend.runtime.context import Context
from backend.store import counters, schema
from backend.store.db import Database
from backend.store.states import ToolCallState
from backend.summaries.receipts import ReceiptVerdict
from backend.summaries.summarizer import JobStatus
from tests.helpers import counter_drift


def _all_drift(conn: sqlite3.Connection) -> list[dict[str, object]]:
    return [d for c in counters.COUNTERS for d in counters.drift_sync(conn, c)]


def _kept(conn: sqlite3.Connection) -> dict[str, Any]:
    plain, keyed = counters.counts_sync(conn)
    return {**plain, **keyed}


def test_the_counted_states_are_the_enums_states() -> None:
    assert set(counters.JOB_STATES) == set(JobStatus) - {JobStatus.COMPLETED}
    assert set(counters.DREAM_STATES) == set(DigestState) - {DigestState.DIGESTED}
    assert set(counters.VERDICTS) == set(ReceiptVerdict)


async def _v5_database(path: Path) -> Database:
    """A state.db exactly as schema v5 built it, with rows of every counted kind."""
    db = await Database.open(path)
    async with db.tx() as conn:
        for script in schema.MIGRATIONS[:5]:
            await schema._apply(conn, script)
        await conn.execute("PRAGMA user_version = 5")
        for i in range(6):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"s{i}",)
            )
        inputs = [
            ("i1", "s0", 1, None, 1),
            ("i2", "s0", 2, None, 0),
            ("i3", "s1", 1, 1, 0),
            ("i4", "s2", 1, None, 1),
        ]
        for iid, sid, seq, promoted, wake in inputs:
            await conn.execute(
                "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, promoted_seq, "
                "wake_pending, time_created) VALUES (?, ?, '{}', 'queue', ?, ?, ?, ?)",
                (iid, sid, seq, promoted, wake, 100 + seq),
            )
        jobs = [
            ("s0", "completed", "present", 1, 0, 0),
            ("s1", "completed", "keys_differ", 1, 3, 1),
            ("s2", "pending", None, 1, 1, 0),
            ("s3", "failed", None, None, 0, 0),
            ("s4", "in_progress", "quarantined", 1, 0, 0),
        ]
        for sid, status, verdict, staged, dirty, clean in jobs:
            await conn.execute(
                "INSERT INTO summary_job (session_id, status, verdict, result_staged_at, dirty_seq, clean_seq, "
                "time_created, time_updated) VALUES (?, ?, ?, ?, ?, ?, 1, 1)",
                (sid, status, verdict, staged, dirty, clean),
            )
        dreams = [
            ("s0", "sha256:a", "sha256:a", "sha256:a", "digested"),
            ("s1", "sha256:b", None, None, "pending"),
            ("s2", "sha256:c", "sha256:x", "sha256:c", "deferred"),
            ("s3", None, None, None, "legacy"),
        ]
        for sid, inp, done, indexed, state in dreams:
            await conn.execute(
                "INSERT INTO dream_state (session_id, input_revision, completed_revision, indexed_revision, "
                "digest_state, time_updated) VALUES (?, ?, ?, ?, ?, 1)",
                (sid, inp, done, indexed, state),
            )
        for n, (digest, vector) in enumerate([("d1", "d1"), ("d2", None), ("d3", "d0")]):
            await conn.execute(
                "INSERT INTO memory_turn (message_id, session_id, project, ord, role, time, digest, "
                "vector_digest, revision, time_indexed) VALUES (?, 's0', 'default', ?, 'user', 1, ?, ?, 'r', 1)",
                (f"m{n}", n, digest, vector),
            )
        for sid, owner in (("s0", "ex-a"), ("s1", "ex-a"), ("s2", "ex-b")):
            await conn.execute(
                "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
                "time_renewed, expires_at) VALUES (?, ?, ?, 1, 'ready', 1, 1, 1)",
                (f"e-{sid}", sid, owner),
            )
    return db


async def test_a_v5_database_migrates_with_every_counter_backfilled(tmp_path: Path) -> None:
    db = await _v5_database(tmp_path / "state.db")
    try:
        assert await schema.migrate(db) == schema.SCHEMA_VERSION
        kept = await db.read_in_thread(_kept)
        # hand-counted from the rows above
        assert kept["sessions"] == 6 and kept["inputs_total"] == 3
        assert (kept["summary_pending"], kept["summary_in_progress"], kept["summary_failed"]) == (1, 1, 1)
        assert kept["summary_stale"] == 2
        assert (kept["receipt_present"], kept["receipt_keys_differ"], kept["receipt_quarantined"]) == (
            1,
            1,
            1,
        )
        assert kept["receipt_missing"] == kept["receipt_document_differs"] == 0
        assert kept["receipt_unchecked"] == 1
        assert kept["dream_pending"] == 2 and kept["index_behind"] == 1
        assert (kept["dream_state_pending"], kept["dream_state_deferred"], kept["dream_state_legacy"]) == (
            1,
            1,
            1,
        )
        assert kept["vectors_pending"] == 2
        assert kept["execution_held"] == {"ex-a": 2, "ex-b": 1}
        assert await db.read_in_thread(_all_drift) == []
        # and from now on the triggers keep them
        async with db.tx() as conn:
            await conn.execute("UPDATE summary_job SET verdict = 'present' WHERE session_id = 's1'")
            await conn.execute("DELETE FROM session_execution WHERE owner_id = 'ex-b'")
        kept = await db.read_in_thread(_kept)
        assert kept["receipt_present"] == 2 and kept["receipt_keys_differ"] == 0
        assert kept["execution_held"] == {"ex-a": 2}  # an owner holding nothing has no row
        assert await db.read_in_thread(_all_drift) == []
    finally:
        await db.close()


async def test_a_v7_database_migrates_with_the_usage_sums_backfilled(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "state.db")
    try:
        async with db.tx() as conn:
            for script in schema.MIGRATIONS[:7]:
                await schema._apply(conn, script)
            await conn.execute("PRAGMA user_version = 7")
            usage = [  # (tokens in, out, reasoning, cache read, cache write, cost, model error)
                ("u0", 100, 20, 5, 40, 0, 0.1, None),
                ("u1", 0, 0, 0, 0, 0, 0.0, '{"class": "auth"}'),  # counted: it failed to use a model
                ("u2", 3000, 700, 0, 0, 9, 0.2, None),
                ("u3", 0, 0, 0, 0, 0, 0.0, None),  # never used a model: not counted
            ]
            for sid, t_in, t_out, t_rs, t_cr, t_cw, cost, error in usage:
                await conn.execute(
                    "INSERT INTO session (id, time_created, time_updated, tokens_input, tokens_output, "
                    "tokens_reasoning, tokens_cache_read, tokens_cache_write, cost, model_error) "
                    "VALUES (?, 1, 1, ?, ?, ?, ?, ?, ?, ?)",
                    (sid, t_in, t_out, t_rs, t_cr, t_cw, cost, error),
                )
        assert await schema.migrate(db) == schema.SCHEMA_VERSION
        kept = await db.read_in_thread(_kept)
        assert kept["usage_sessions"] == 3
        assert (kept["usage_tokens_input"], kept["usage_tokens_output"]) == (3100, 720)
        assert (kept["usage_tokens_reasoning"], kept["usage_tokens_cache_read"]) == (5, 40)
        assert kept["usage_tokens_cache_write"] == 9
        assert kept["usage_cost"] == pytest.approx(0.3)
        # the snapshot's usage total is the counters'
        reader = Context(DataDir(tmp_path), start_chroma=False)
        try:
            total = (await ops.status(reader))["usage"]["total"]
        finally:
            await reader.close()
        assert total["sessions"] == 3 and total["tokens"]["input"] == 3100
        async with db.tx() as conn:  # and from now on the triggers keep them
            await conn.execute(
                "UPDATE session SET tokens_input = tokens_input + 50, cost = cost + 0.05 WHERE id = 'u3'"
            )
            await conn.execute("DELETE FROM session WHERE id = 'u0'")
        kept = await db.read_in_thread(_kept)
        assert (kept["usage_sessions"], kept["usage_tokens_input"]) == (3, 3050)
        assert kept["usage_cost"] == pytest.approx(0.25)
        assert await db.read_in_thread(_all_drift) == []
    finally:
        await db.close()


# -- arbitrary sequences of row changes ------------------------------------------------

SIDS = ("s0", "s1", "s2")
REVS = (None, "sha256:a", "sha256:b")
_sid = st.sampled_from(SIDS)
_ops = st.one_of(
    st.tuples(st.just("session+"), _sid),
    st.tuples(st.just("session-"), _sid),
    st.tuples(
        st.just("input"),
        _sid,
        st.integers(1, 3),
        st.sampled_from((None, 1, 2)),
        st.sampled_from((0, 1, 2)),
    ),
    st.tuples(st.just("input-"), _sid, st.integers(1, 3)),
    st.tuples(
        st.just("job"),
        _sid,
        st.sampled_from(("pending", "in_progress", "completed", "failed")),
        st.sampled_from((None, *counters.VERDICTS)),
        st.sampled_from((None, 1)),
        st.integers(0, 2),
        st.integers(0, 2),
    ),
    st.tuples(
        st.just("dream"),
        _sid,
        st.sampled_from(REVS),
        st.sampled_from(REVS),
        st.sampled_from(REVS),
        st.sampled_from(tuple(DigestState)),
    ),
    st.tuples(
        st.just("turn"), _sid, st.integers(0, 2), st.sampled_from(("d1", "d2")), st.sampled_from((None, "d1"))
    ),
    st.tuples(st.just("turn-"), st.integers(0, 2)),
    st.tuples(st.just("lease"), _sid, st.sampled_from(("ex-a", "ex-b", "ex-c"))),
    st.tuples(st.just("lease-"), _sid),
    st.tuples(st.just("rollback"), _sid),
    # the model usage sums (schema v8): tokens, a cost that is no exact binary fraction, an error
    st.tuples(
        st.just("usage"),
        _sid,
        st.sampled_from((0, 7, 1200)),
        st.sampled_from((0, 3)),
        st.sampled_from((0, 5)),
        st.sampled_from((0, 11)),
        st.sampled_from((0.0, 0.1, 0.2, 1e-7, 3.3)),
        st.sampled_from((None, '{"class": "rate_limit"}')),
    ),
    # the tool calls by state and tool (schema v12): a call moves between states, a tool renamed
    st.tuples(
        st.just("tool"),
        _sid,
        st.integers(0, 2),
        st.sampled_from(("demo.a", "demo.b")),
        st.sampled_from(tuple(ToolCallState)),
    ),
    st.tuples(st.just("tool-"), st.integers(0, 2)),
)

UPSERTS = {
    "session+": "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1) ON CONFLICT DO NOTHING",
    "session-": "DELETE FROM session WHERE id = ?",
    "input": "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, promoted_seq, "
    "wake_pending, time_created) VALUES (?1 || '-' || ?2, ?1, '{}', 'queue', ?2, ?3, ?4, 1) "
    "ON CONFLICT (id) DO UPDATE SET promoted_seq = excluded.promoted_seq, wake_pending = excluded.wake_pending",
    "input-": "DELETE FROM session_input WHERE id = ?1 || '-' || ?2",
    "job": "INSERT INTO summary_job (session_id, status, verdict, result_staged_at, dirty_seq, clean_seq, "
    "time_created, time_updated) VALUES (?, ?, ?, ?, ?, ?, 1, 1) ON CONFLICT (session_id) DO UPDATE SET "
    "status = excluded.status, verdict = excluded.verdict, result_staged_at = excluded.result_staged_at, "
    "dirty_seq = excluded.dirty_seq, clean_seq = excluded.clean_seq",
    "dream": "INSERT INTO dream_state (session_id, input_revision, completed_revision, indexed_revision, "
    "digest_state, time_updated) VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT (session_id) DO UPDATE SET "
    "input_revision = excluded.input_revision, completed_revision = excluded.completed_revision, "
    "indexed_revision = excluded.indexed_revision, digest_state = excluded.digest_state",
    "turn": "INSERT INTO memory_turn (id, message_id, session_id, project, ord, role, time, digest, "
    "vector_digest, revision, time_indexed) VALUES (?2 + 1, 'm' || ?2, ?1, 'p', ?2, 'user', 1, ?3, ?4, 'r', 1) "
    "ON CONFLICT (id) DO UPDATE SET digest = excluded.digest, vector_digest = excluded.vector_digest",
    "turn-": "DELETE FROM memory_turn WHERE id = ? + 1",
    "lease": "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, time_renewed, "
    "expires_at) VALUES ('e-' || ?1, ?1, ?2, 1, 'ready', 1, 1, 1) "
    "ON CONFLICT (id) DO UPDATE SET owner_id = excluded.owner_id, epoch = epoch + 1",
    "lease-": "DELETE FROM session_execution WHERE session_id = ?",
    "tool": "INSERT INTO tool_call (id, session_id, execution_id, step, idx, model_call_id, tool, arguments, "
    "effect, effect_source, permission, state, idempotency_key, time_created, time_updated) "
    "VALUES ('c' || ?2, ?1, 'e', 1, ?2, 'm', ?3, '{}', 'effect', 'config', 'ask', ?4, 'k', 1, 1) "
    "ON CONFLICT (id) DO UPDATE SET tool = excluded.tool, state = excluded.state",
    "tool-": "DELETE FROM tool_call WHERE id = 'c' || ?",
    "usage": "UPDATE session SET tokens_input = ?2, tokens_output = ?3, tokens_reasoning = ?4, "
    "tokens_cache_read = ?5, tokens_cache_write = ?4 + ?5, cost = ?6, model_error = ?7 WHERE id = ?1",
}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state.db at the current schema holding the sessions the examples use, copied for each example."""
    import asyncio

    from backend.core.datadir import DataDir

    root = tmp_path_factory.mktemp("counters") / "data"

    async def init() -> None:
        ctx = Context(DataDir(root), start_chroma=False)
        db = await ctx.db()
        async with db.tx() as conn:
            for sid in SIDS:
                await conn.execute(
                    "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (sid,)
                )
        await ctx.close()

    asyncio.run(init())
    return root / "state.db"


@pytest.fixture
def fresh_db(migrated: Path, tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.lists(_ops, min_size=1, max_size=4), min_size=1, max_size=12))
def test_counters_equal_real_counts_after_any_sequence_of_changes(
    migrated: Path, fresh_db: Path, steps: list[list[tuple[Any, ...]]]
) -> None:
    """Inserts, upserts (UPDATE triggers), deletes, cascades from a session, and rolled-back transactions."""
    path = fresh_db / "state.db"
    for leftover in (path, path.with_name("state.db-wal"), path.with_name("state.db-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copyfile(migrated, path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        for transaction in steps:
            conn.execute("BEGIN IMMEDIATE")
            before = _kept(conn)
            rollback = False
            for kind, *args in transaction:
                if kind == "rollback":
                    rollback = True
                    continue
                try:
                    conn.execute(UPSERTS[kind], args)
                except sqlite3.IntegrityError:
                    pass  # a row of a session that is not there: refused, nothing written
            if rollback:
                conn.execute("ROLLBACK")
                assert _kept(conn) == before, "a rolled-back transaction moved a counter"
            else:
                conn.execute("COMMIT")
            assert _all_drift(conn) == []
    finally:
        conn.close()


# -- a SIGKILL in the middle of a transaction ------------------------------------------

WRITER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("BEGIN IMMEDIATE")
    for i in range(2000):
        conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"k{i}",))
        conn.execute(
            "INSERT INTO summary_job (session_id, status, verdict, result_staged_at, dirty_seq, "
            "time_created, time_updated) VALUES (?, 'pending', 'present', 1, 1, 1, 1)", (f"k{i}",))
        conn.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES (?, ?, '{}', 'queue', 1, 1, 1)", (f"in{i}", f"k{i}"))
    conn.execute("UPDATE summary_job SET verdict = 'missing' WHERE session_id = 'base'")
    print("written", flush=True)  # everything in the open transaction, counters moved with it
    sys.stdin.read()  # killed here, never committing
    """
)


async def test_a_sigkill_mid_transaction_leaves_counters_equal_to_rows(db_ctx: Context) -> None:
    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('base', 1, 1)")
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, verdict, result_staged_at, time_created, time_updated) "
            "VALUES ('base', 'completed', 'present', 1, 1, 1)"
        )
    before = await db.read_in_thread(_kept)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db_ctx.data.state_db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "written"
        # the writer really is inside its transaction: it holds the write lock
        probe = sqlite3.connect(db_ctx.data.state_db, timeout=0, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                probe.execute("BEGIN IMMEDIATE")
        finally:
            probe.close()
        writer.kill()
        writer.wait(10)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == -9
    assert await db.read_in_thread(_kept) == before
    assert await db.read_in_thread(_all_drift) == []
    # and the next writer (the lock freed by the kill) moves counters and rows together again
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET verdict = 'missing' WHERE session_id = 'base'")
    kept = await db.read_in_thread(_kept)
    assert kept["receipt_missing"] == before["receipt_missing"] + 1
    assert kept["receipt_present"] == before["receipt_present"] - 1
    assert counter_drift(db_ctx.data.state_db) == []


# -- `rem check` finds a counter that drifted ------------------------------------------


async def test_check_names_a_counter_that_differs_from_its_rows(db_ctx: Context) -> None:
    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s1', 1, 1)")
        await conn.execute(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES ('e1', 's1', 'ex-a', 1, 'ready', 1, 1, 1)"
        )
        # what a write around the triggers would leave: a counter off by one, a key that should not be
        await conn.execute("UPDATE status_count SET n = n + 1 WHERE name = 'sessions'")
        await conn.execute("INSERT INTO status_count (name, key, n) VALUES ('execution_held', 'ex-gone', 2)")
    result = await ops.check(db_ctx, verify_chroma=False)
    (finding,) = [f for f in result["violations"] if f["invariant"] == "counters"]
    assert finding["count"] == 2
    assert {(r["counter"], r["key"], r["kept"], r["real"]) for r in finding["rows"]} == {
        ("sessions", "", 2, 1),
        ("execution_held", "ex-gone", 2, 0),
    }
    in_batches = await checks.check_database_in_batches(db)
    assert [f.rows for f in in_batches.violations if f.invariant == "counters"] == [finding["rows"]]
    async with db.tx() as conn:  # repaired, so the fixture's own teardown check passes
        await conn.execute("UPDATE status_count SET n = n - 1 WHERE name = 'sessions'")
        await conn.execute("DELETE FROM status_count WHERE key = 'ex-gone'")


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_postgres_reads_every_counter_as_its_real_count(db_ctx: Context) -> None:
    """PostgreSQL keeps no counters: one statement counts them all (the usage count and sums in one pass
    of the sessions that used a model), each equal to its own real count."""
    db = await db_ctx.db()
    async with db.tx() as conn:
        for i in range(12):  # some used a model, one failed to, some never did
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated, tokens_input, tokens_output, "
                "tokens_reasoning, tokens_cache_read, tokens_cache_write, cost, model_error) "
                "VALUES (?, 1, 1, ?, ?, ?, ?, ?, ?, ?)",
                (
                    f"s{i}",
                    100 * (i % 4),
                    7 * (i % 4),
                    i,
                    3 * i,
                    2,
                    0.125 * (i % 4),
                    '{"e": 1}' if i == 4 else None,
                ),
            )
        await conn.execute(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES ('e1', 's1', 'ex-a', 1, 'safe', 1, 1, 1)"
        )

    def both_sync(conn: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        real: dict[str, Any] = {}
        for counter in counters.COUNTERS:
            rows = {r[0]: r[1] for r in conn.execute(counter.truth_sql()).fetchall()}
            real[counter.name] = {k: int(n) for k, n in rows.items()} if counter.key else rows[""]
        return _kept(conn), real

    read, real = await db.read_in_thread(both_sync)
    assert "WITH" in counters.REAL_COUNTS_SQL  # the usage sums share one pass
    assert read == real
    assert read["usage_sessions"] == 10 and read["usage_cost"] == 2.25  # s0, s8 used none; s4 failed
    assert read["usage_tokens_reasoning"] == sum(range(12)) - 8
    assert read["execution_held"] == {"ex-a": 1} and read["sessions"] == 12
