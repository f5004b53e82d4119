"""The status snapshot: indexed queries only, and the right rows in the right sections."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from backend import ops
from backend.core import clock
from backend.core.errors import DatabaseUnreachable, RemError
from backend.ops import actions, snapshot, snapshot_reads, tool_status
from backend.ops.records import Snapshot
from backend.ops.snapshot import snapshot_sync
from backend.ops.status_queries import LIST_CAP, PLAN_PARAMS, STATUS_QUERIES
from backend.runtime.context import Context
from backend.store.db import Conn, Database, Query, ReadAhead, read_ahead_sync
from backend.store.events import EventKind, append_event
from backend.store.postgres import PgConnection

# Tables that grow without bound; a full SCAN of one is a bug in the snapshot.
BIG_TABLES = (
    "session",
    "session_message",
    "session_input",
    "session_recovery",
    "summary_job",
    "dream_state",
    "event",
    "graph_node",
    "graph_edge",
    "worker",
    "model_call",
    "tool_call",
)


# count(*) of sessions walks the smallest index of session (not the table); the
# event tail walks the rowid backwards and stops at its LIMIT. Both accepted.
ALLOWED_SCANS = {("sessions", "session"), ("events", "event")}
ALIASES = {"e": "session_execution", "j": "summary_job", "d": "dream_state", "w": "worker", "c": "tool_call"}


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small data dir of the benchmark's shape, with planner statistics (ANALYZE)."""
    from benchmarks.gen_big import generate

    root = tmp_path_factory.mktemp("populated") / "data"
    generate(
        root,
        sessions=3000,
        per_session=4,
        receipts=1000,
        mismatched=50,
        leases=100,
        dream_pending=100,
        events=2000,
    )
    return root


@pytest.mark.parametrize("analyzed", [False, True], ids=["empty", "analyzed"])
@pytest.mark.parametrize("name", sorted(STATUS_QUERIES))
async def test_status_query_uses_an_index(
    db_ctx: Context, populated: Path, name: str, analyzed: bool
) -> None:
    db = await db_ctx.db() if not analyzed else await Database.open(populated / "state.db", read_only=True)
    try:
        await _assert_indexed(db, name)
    finally:
        if analyzed:
            await db.close()


async def _assert_indexed(db: Database, name: str) -> None:
    partial = {
        r[0]
        for r in await db.fetchall(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql LIKE '%WHERE%'"
        )
    }
    plan = await db.fetchall("EXPLAIN QUERY PLAN " + STATUS_QUERIES[name], PLAN_PARAMS)
    details = [row["detail"] for row in plan]
    for detail in details:
        words = detail.split()
        if words[:1] != ["SCAN"] or len(words) < 2:
            continue
        table = ALIASES.get(words[1], words[1])
        # scanning a partial index reads only the rows it selects: that is the point of it
        if "INDEX" in words and words[words.index("INDEX") + 1] in partial:
            continue
        if table in BIG_TABLES and (name, table) not in ALLOWED_SCANS:
            pytest.fail(f"{name}: full scan of {table}: {details}")


async def _seed(ctx: Context, now: int) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        for sid in ("s1", "s2", "s3"):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (sid,)
            )
        await conn.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
            "wake_pending, time_created) VALUES ('i1', 's1', '{}', 'queue', 1, 1, ?)",
            (now - 5000,),
        )
        await conn.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
            "wake_pending, time_created) VALUES ('i2', 's1', '{}', 'steer', 2, 1, ?)",
            (now - 1000,),
        )
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at) "
            "VALUES ('ex-live', 'executor', 1, 'h', ?, ?)",
            (now - 60_000, now - 1000),
        )
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at) "
            "VALUES ('ex-dead', 'executor', 2, 'h', ?, ?)",
            (now - 60_000, now - 45_000),
        )
        await conn.execute(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES ('e-dead', 's2', 'ex-dead', 4, 'unknown', 1, 1, ?)",
            (now - 15_000,),
        )
        await conn.execute(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES ('e-live', 's3', 'ex-live', 1, 'safe', 1, 1, ?)",
            (now + 20_000,),
        )
        detail = {"keys": [{"key": "memoryCount", "expected": 3, "actual": 3.0, "reason": "type"}]}
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, verdict, verdict_detail, verdict_checked_at, "
            "result_staged_at, time_created, time_updated) VALUES ('s1', 'completed', 'keys_differ', ?, ?, 1, 1, 1)",
            (json.dumps(detail), now - 100),
        )
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, verdict, result_staged_at, dirty_seq, "
            "time_created, time_updated) VALUES ('s2', 'completed', 'present', 1, 2, 1, 1)"
        )
        await conn.execute(
            "INSERT INTO dream_state (session_id, input_revision, completed_revision, digest_state, "
            "time_published, time_updated) VALUES ('s1', 'sha256:b', 'sha256:a', 'pending', 5, 5)"
        )
        await conn.execute(
            "INSERT INTO dream_state (session_id, input_revision, digest_state, digest_attempts, "
            "defer_reason, time_published, time_updated) "
            "VALUES ('s3', 'sha256:c', 'undigestible', 3, 'extractor failed', 6, 6)"
        )


async def test_snapshot_sections(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    now = frozen_clock.now
    await _seed(db_ctx, now)
    db_ctx.read_only = False
    snap = await ops.status(db_ctx)
    assert snap["backlog"]["inputs"] == [
        {"session_id": "s1", "pending": 2, "oldest_at": now - 5000, "oldest_age_ms": 5000}
    ]
    leases = {lease["id"]: lease for lease in snap["leases"]}
    assert leases["e-dead"]["expired"] and leases["e-dead"]["time_left_ms"] == -15_000
    assert not leases["e-dead"]["owner_alive"]
    assert leases["e-live"]["owner_alive"] and leases["e-live"]["time_left_ms"] == 20_000
    assert [lease["id"] for lease in snap["leases"]] == ["e-dead", "e-live"]
    (mismatch,) = snap["receipts"]["mismatched"]
    assert mismatch["summary_id"] == "summary_s1"
    assert mismatch["keys"][0]["key"] == "memoryCount"
    assert snap["receipts"]["counts"]["present"] == 1
    drift = {d["session_id"]: d["class"] for d in snap["dream_drift"]}
    assert drift == {"s1": "stale_completion", "s3": "undigestible", "s2": "summary_stale"}
    assert snap["counts"]["expired_leases"] == 1
    assert snap["counts"]["mismatches"] == 1
    workers = {w["owner_id"]: w["alive"] for w in snap["workers"]}
    assert workers == {"ex-live": True, "ex-dead": False}
    assert snap["chroma"]["healthy"] is False


async def test_tool_sources_of_live_executors_are_listed_and_damaged_records_skipped(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    now = frozen_clock.now
    await _seed(db_ctx, now)
    db = await db_ctx.db()
    down = {"server": "demo", "up": False, "error": "exited with code 1", "since": now - 65_000}
    recorded = {
        "ex-live": {
            "agent": "a",
            "tool_servers": [down, {"server": 7}, "junk", {"server": "git", "up": True}],
        },
        "ex-dead": {"tool_servers": [{**down, "server": "dead-executors"}]},  # its servers died with it
    }
    async with db.tx() as conn:
        for owner, info in recorded.items():
            await conn.execute("UPDATE worker SET info = ? WHERE owner_id = ?", (json.dumps(info), owner))
    servers = (await _fresh(db, now))["tools"]["servers"]
    assert servers == [
        {**down, "worker": "ex-live"},  # down first
        {"server": "git", "up": True, "error": None, "since": 0, "worker": "ex-live"},
    ]
    assert tool_status.server_down_lines(servers, now) == [
        "tool server demo down for 1m05s in ex-live: exited with code 1"
    ]


async def _fresh(db: Database, now: int) -> Snapshot:
    """A snapshot read from scratch (no cache), at `now`."""
    return await db.read_in_thread(lambda conn: snapshot_sync(conn, now=now))


async def test_snapshot_cache_reuses_rows_until_a_commit(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    now = frozen_clock.now
    await _seed(db_ctx, now)
    db = await db_ctx.db()
    await ops.status(db_ctx)
    cache = actions._SNAPSHOT_CACHES[db]
    misses = cache.misses
    again = await ops.status(db_ctx)
    assert cache.misses == misses and cache.hits >= 1, "nothing was committed: the rows are reused"
    fresh = await _fresh(db, now)
    assert {key: again[key] for key in fresh} == fresh  # type: ignore[literal-required]

    # the clock moves, nothing is committed: ages, time left, expiry follow the clock
    frozen_clock.advance(30_000)
    later = await ops.status(db_ctx)
    assert cache.misses == misses
    leases = {lease["id"]: lease for lease in later["leases"]}
    assert leases["e-live"]["expired"] and leases["e-live"]["time_left_ms"] == -10_000
    assert later["backlog"]["inputs"][0]["oldest_age_ms"] == 35_000
    assert later["counts"]["expired_leases"] == 2
    fresh = await _fresh(db, frozen_clock.now)
    assert {key: later[key] for key in fresh} == fresh  # type: ignore[literal-required]

    # another connection commits: the next snapshot reads again and sees it
    other = await Database.open(db_ctx.data.state_db)
    try:
        async with other.tx() as conn:
            await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s4', 1, 1)")
            await conn.execute(
                "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                "wake_pending, time_created) VALUES ('i4', 's4', '{}', 'queue', 1, 1, ?)",
                (now - 90_000,),
            )
    finally:
        await other.close()
    seen = await ops.status(db_ctx)
    assert cache.misses == misses + 1
    assert seen["counts"]["sessions"] == 4
    assert [i["session_id"] for i in seen["backlog"]["inputs"]] == ["s4", "s1"]

    # this connection commits (data_version does not move for its own writes)
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s5', 1, 1)")
        await conn.execute("DELETE FROM session_execution WHERE id = 'e-dead'")
    mine = await ops.status(db_ctx)
    assert cache.misses == misses + 2
    assert mine["counts"]["sessions"] == 5
    assert [lease["id"] for lease in mine["leases"]] == ["e-live"]
    fresh = await _fresh(db, frozen_clock.now)
    assert {key: mine[key] for key in fresh} == fresh  # type: ignore[literal-required]


async def test_session_count_follows_every_delete_at_once(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    """The count is the `sessions` counter: a delete anywhere shows at the next snapshot (it
    used to wait up to a minute for a whole recount when the row was not the highest)."""
    db = await db_ctx.db()
    async with db.tx() as conn:
        for i in range(5):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"s{i}",)
            )
    assert (await ops.status(db_ctx))["counts"]["sessions"] == 5
    async with db.tx() as conn:  # the highest rowid goes
        await conn.execute("DELETE FROM session WHERE rowid = (SELECT max(rowid) FROM session)")
    assert (await ops.status(db_ctx))["counts"]["sessions"] == 4
    async with db.tx() as conn:
        await conn.execute("DELETE FROM session WHERE id = 's0'")
    assert (await ops.status(db_ctx))["counts"]["sessions"] == 3


@pytest.mark.parametrize(
    ("cap", "crowd"),
    [(None, 0), (50, 0), (50, 900)],
    ids=["all-read-at-once", "counted-per-session", "one-session-crowds-the-oldest"],
)
@pytest.mark.both_stores  # PostgreSQL reads each row with its session's count (`inputs_oldest_counted`)
async def test_inputs_list_the_sessions_waiting_longest(
    db_ctx: Context,
    frozen_clock,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    cap: int | None,
    crowd: int,
) -> None:
    """More waiting sessions than a panel lists: the oldest, as the GROUP BY over all would pick."""
    if cap is not None:
        monkeypatch.setattr(snapshot, "LIST_CAP", cap)
    listed = snapshot.LIST_CAP
    now = frozen_clock.now
    db = await db_ctx.db()
    n = LIST_CAP + 40
    async with db.tx() as conn:
        for i in range(n):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"s{i:04d}",)
            )
            # two inputs per session, the sessions' oldest in a shuffled order; some promoted
            oldest = now - 1_000 * ((i * 7919) % n) - 10
            for seq, (created, promoted) in enumerate(((oldest, None), (now - 5, i % 3 or None))):
                await conn.execute(
                    "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                    "promoted_seq, wake_pending, time_created) VALUES (?, ?, '{}', 'queue', ?, ?, ?, ?)",
                    (f"i{i}-{seq}", f"s{i:04d}", seq + 1, promoted, i % 2, created),
                )
        if crowd:  # one session whose inputs are all older than anyone else's
            await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('crowd', 1, 1)")
            for k in range(crowd):
                await conn.execute(
                    "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                    "wake_pending, time_created) VALUES (?, 'crowd', '{}', 'queue', ?, 1, ?)",
                    (f"c{k}", k + 1, now - 10_000_000 + k),
                )
    expected = await db.fetchall(
        "SELECT session_id, count(*) AS pending, min(time_created) AS oldest_at FROM session_input "
        "WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL GROUP BY session_id "
        "ORDER BY oldest_at LIMIT ?",
        (listed,),
    )
    inputs = (await ops.status(db_ctx))["backlog"]["inputs"]
    assert [(i["session_id"], i["pending"], i["oldest_at"]) for i in inputs] == [tuple(r) for r in expected]
    assert len(inputs) == listed
    if crowd:
        assert inputs[0]["session_id"] == "crowd" and inputs[0]["pending"] == crowd


async def test_leases_past_the_cap_are_counted_not_listed(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    """A snapshot lists what a panel can show, soonest expiry first; the totals count every lease."""
    now = frozen_clock.now
    db = await db_ctx.db()
    n = LIST_CAP + 30
    async with db.tx() as conn:
        for i in range(n):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"s{i:04d}",)
            )
            await conn.execute(
                "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
                "time_renewed, expires_at) VALUES (?, ?, 'gone', 1, 'safe', 1, 1, ?)",
                (f"e{i:04d}", f"s{i:04d}", now + 1_000 * ((i * 7919) % n) - 20_000),
            )
    snap = await ops.status(db_ctx)
    listed = [lease["expires_at"] for lease in snap["leases"]]
    assert len(listed) == LIST_CAP
    everything = sorted(r[0] for r in await db.fetchall("SELECT expires_at FROM session_execution"))
    assert listed == everything[:LIST_CAP]
    execution = snap["totals"]["leases"]["execution"]
    assert execution["held"] == n and execution["dead_owner"] == n
    assert execution["expired"] == sum(1 for t in everything if t <= now) == snap["counts"]["expired_leases"]


@pytest.mark.both_stores
async def test_a_windowed_backlog_lists_the_running_calls_after_the_waiting_ones(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    """The console's Backlog window reads its rows in the panel's order: the calls to decide, then
    the calls in flight (what `k` kills), then the rest; `rem status` lists them all."""
    now = frozen_clock.now
    await _seed(db_ctx, now)  # s1 has inputs waiting: the Backlog's last row
    db = await db_ctx.db()
    calls = [("unknown", 50_000), ("running", 30_000), ("running", 40_000), ("running", 20_000)]
    async with db.tx() as conn:
        for i, (state, ago) in enumerate(calls):
            await conn.execute(
                "INSERT INTO tool_call (id, session_id, execution_id, step, idx, model_call_id, tool, "
                "arguments, effect, effect_source, permission, state, idempotency_key, owner_id, epoch, "
                "time_created, time_updated) VALUES (?, 's2', 'e-live', 1, ?, 'm', 'demo.send', '{}', "
                "'effect', 'config', 'ask', ?, ?, 'ex-live', 1, ?, ?)",
                (f"c{i}", i, state, f"k{i}", now - ago, now - ago),
            )

    async def listed(window: int | None) -> tuple[list[str], list[str]]:
        limits = None if window is None else snapshot.ListLimits(backlog=window)
        snap = await ops.status(db_ctx, limits=limits)
        tools = snap["tools"]
        waiting = [c["call_id"] for c in tools["unknown_outcome"] + tools["awaiting_approval"]]
        running = [c["call_id"] for c in tools["running"]]
        assert tools["counts"]["running"] == 3  # counted whatever the window
        return waiting + running, [i["session_id"] for i in snap["backlog"]["inputs"]]

    assert await listed(3) == (["c0", "c2", "c1"], [])  # the oldest running first, to the window's end
    assert await listed(5) == (["c0", "c2", "c1", "c3"], ["s1"])
    assert await listed(None) == (["c0", "c2", "c1", "c3"], ["s1"])


# what a console's panels ask of each list at 120x40 (`tui/loading.py` `list_limits`)
CONSOLE_LIMITS = snapshot.ListLimits(backlog=14, mismatched=14, drift=14, events=7, actions=7, sessions=4)


async def _seed_waiting(ctx: Context, now: int, sessions: int, per_session: int) -> None:
    """`sessions` more sessions with `per_session` waiting inputs each, older than `_seed`'s."""
    db = await ctx.db()
    async with db.tx() as conn:
        for i in range(sessions):
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated) VALUES (?, 1, 1)", (f"w{i:03d}",)
            )
            for k in range(per_session):
                await conn.execute(
                    "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                    "wake_pending, time_created) VALUES (?, ?, '{}', 'queue', ?, ?, ?)",
                    (f"w{i}-{k}", f"w{i:03d}", k + 1, k % 2, now - 60_000 + 100 * i + k),
                )


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("limits", "inputs_listed"),
    [(CONSOLE_LIMITS, 13), (snapshot.ListLimits(backlog=3, drift=1), 2), (None, 21)],
    ids=["console", "narrow", "all"],
)
async def test_a_snapshot_read_ahead_is_the_snapshot_read_statement_by_statement(
    db_ctx: Context, frozen_clock: clock.FrozenClock, limits: snapshot.ListLimits | None, inputs_listed: int
) -> None:
    """What PostgreSQL reads ahead in one round trip (`snapshot_reads_sync`) answers the snapshot as
    sending each statement alone does, in the same read; SQLite reads nothing ahead."""
    now = frozen_clock.now
    await _seed(db_ctx, now)
    await _seed_waiting(db_ctx, now, sessions=20, per_session=3)  # more than a window: read per session
    db = await db_ctx.db()
    async with db.tx() as conn:  # a call in flight: the window's later lists read fewer rows than guessed
        await conn.execute(
            "INSERT INTO tool_call (id, session_id, execution_id, step, idx, model_call_id, tool, arguments, "
            "effect, effect_source, permission, state, idempotency_key, owner_id, epoch, time_created, "
            "time_updated) VALUES ('c1', 's2', 'e-live', 1, 0, 'm', 'demo.send', '{}', 'effect', 'config', "
            "'ask', 'running', 'k1', 'ex-live', 1, ?, ?)",
            (now - 1000, now - 1000),
        )

    def both_sync(conn: Conn) -> tuple[Snapshot, Snapshot, Conn]:
        alone = snapshot_sync(conn, now, cache=snapshot.SnapshotCache(), limits=limits)
        reading = read_ahead_sync(conn, lambda: snapshot_reads.snapshot_reads_sync(conn, now, limits))
        return alone, snapshot_sync(reading, now, cache=snapshot.SnapshotCache(), limits=limits), reading

    alone, ahead, reading = await db.read_in_thread(both_sync)
    assert ahead == alone
    # the 21 sessions waiting, after the call in flight (one row of a window)
    assert len(alone["backlog"]["inputs"]) == inputs_listed
    assert [c["call_id"] for c in alone["tools"]["running"]] == ["c1"]
    assert isinstance(reading, ReadAhead) == db.postgres
    if isinstance(reading, ReadAhead):
        assert reading.answered > 20  # nearly all of it came in the one round trip


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
@pytest.mark.parametrize(
    ("waiting", "per_session", "wider", "limits"),
    [(5, 2, 0, CONSOLE_LIMITS), (40, 1, 0, CONSOLE_LIMITS), (40, 2, 1, CONSOLE_LIMITS), (40, 2, 0, None)],
    ids=["whole-backlog-read", "longer-than-the-window", "the-oldest-inputs-crowd-the-window", "rem-status"],
)
async def test_the_consoles_snapshot_on_postgres_is_three_round_trips(
    db_ctx: Context,
    frozen_clock: clock.FrozenClock,
    waiting: int,
    per_session: int,
    wider: int,
    limits: snapshot.ListLimits | None,
) -> None:
    """`ops.status` as a console reads it sends every statement it knows ahead in one round trip
    (with the BEGIN), whatever the backlog; then only the journal's new events (their two
    aggregates together) and the ROLLBACK go on their own; every statement read ahead is used.
    When the window's oldest inputs belong to fewer sessions than it lists, the wider read of
    them goes on its own too."""
    now = frozen_clock.now
    await _seed(db_ctx, now)  # drift and a dead lease: the drift window's later lists read less
    await _seed_waiting(db_ctx, now, sessions=waiting, per_session=per_session)
    db = await db_ctx.db()
    first = await ops.status(db_ctx, limits=limits)  # the tally's start, the reader opened
    async with db.tx() as conn:
        event_id = await append_event(conn, kind=EventKind.OPERATOR_RESUME, actor="test", session_id="s1")
    reader = cast(PgConnection, await db.read_beside(lambda conn: conn))  # the connection reads go to
    before = reader.round_trips
    reads: list[ReadAhead] = []
    original = actions.read_ahead_sync

    def kept(conn: Conn, queries: Callable[[], list[Query]]) -> Conn:
        reading = original(conn, queries)
        reads.append(cast(ReadAhead, reading))
        return reading

    with pytest.MonkeyPatch.context() as patch:  # a spy on what the read sent, nothing changed
        patch.setattr(actions, "read_ahead_sync", kept)
        snap = await ops.status(db_ctx, chroma=first["chroma"], limits=limits)
    assert snap["throughput"]["through_event_id"] == event_id  # the new event was folded
    inputs = snap["backlog"]["inputs"]
    assert len(inputs) == min(waiting + 1, (limits or snapshot.ListLimits()).backlog or LIST_CAP)
    assert inputs[0] == {
        "session_id": "w000",
        "pending": per_session,
        "oldest_at": now - 60_000,
        "oldest_age_ms": 60_000,
    }
    assert reader.round_trips - before == 3 + wider  # the read ahead, the fold's range, the ROLLBACK
    (reading,) = reads
    assert reading.sent == wider  # nothing else of the snapshot went on its own
    assert reading.unused == 0  # every statement read ahead was asked for


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_read_ahead_answers_only_the_statement_and_parameters_it_was_sent_with(
    db_ctx: Context,
) -> None:
    """Another parameter, another statement, or a parameter that is no key (a list) is sent on its own."""
    db = await db_ctx.db()
    ahead = [("SELECT ? + 1 AS n", (1,)), ("SELECT cardinality(CAST(? AS bigint[])) AS n", ([1, 2],))]

    def read_sync(conn: Conn) -> tuple[list[int], int, int, int]:
        reading = read_ahead_sync(conn, lambda: ahead)
        assert isinstance(reading, ReadAhead)
        asked = [("SELECT ? + 1 AS n", (1,)), ("SELECT ? + 1 AS n", (5,)), ("SELECT ? + 1 AS n", (1,))]
        asked.append(("SELECT cardinality(CAST(? AS bigint[])) AS n", ([1, 2, 3],)))
        found = [reading.execute(sql, params).fetchone()[0] for sql, params in asked]
        return found, reading.answered, reading.sent, reading.unused

    found, answered, sent, unused = await db.read_in_thread(read_sync)
    assert found == [2, 6, 2, 3]  # each as sent alone
    assert (answered, sent, unused) == (1, 3, 0)  # the list's answer was never a key: not kept


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_read_ahead_that_fails_raises_the_stores_one_line_error(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    """A statement failing in the batch read ahead, or the connection dropped under it, fails the read
    with the store's one-line error (its SQLSTATE, no traceback), and the next read goes through."""
    await _seed(db_ctx, frozen_clock.now)
    db = await db_ctx.db()
    failing = [("SELECT count(*) FROM session", ()), ("SELECT 1 / (count(*) - count(*)) FROM session", ())]
    with pytest.raises(RemError) as failed:
        await db.read_in_thread(lambda conn: read_ahead_sync(conn, lambda: failing))
    assert "SQLSTATE 22012" in str(failed.value) and "\n" not in str(failed.value)
    first = await ops.status(db_ctx, limits=CONSOLE_LIMITS)  # the transaction was rolled back
    reader = cast(PgConnection, await db.read_beside(lambda conn: conn))
    async with db.tx() as conn:  # the server drops the reading connection between two reads
        await conn.execute("SELECT pg_terminate_backend(CAST(? AS integer))", (reader.backend_pid,))
    with pytest.raises(DatabaseUnreachable) as dropped:
        await ops.status(db_ctx, chroma=first["chroma"], limits=CONSOLE_LIMITS)
    assert "\n" not in str(dropped.value) and "Traceback" not in str(dropped.value)
    again = await ops.status(db_ctx, chroma=first["chroma"], limits=CONSOLE_LIMITS)  # reconnected
    assert again["backlog"]["inputs"] == first["backlog"]["inputs"]
