"""Dream against a real state.db (no Chroma): eligibility, fencing, failures, fairness."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from backend.core import clock
from backend.dream.digester import (
    MAX_DIGEST_ATTEMPTS,
    NEVER,
    SELECT_PENDING_SQL,
    STALE_RECHECK_MS,
    Candidate,
    Dreamer,
    claim_session,
    classify_drift,
    legacy_only_count,
    legacy_retirement,
    select_pending,
)
from backend.dream.extractor import Extraction, KeywordExtractor
from backend.runtime.context import Context
from backend.store.revision import raw_revision
from tests.dreamkit import (
    add_session_with_turns,
    add_turn,
    dream_row,
    graph_snapshot,
    publish,
    replace_text,
    without_revisions,
)

# Dream on both engines
pytestmark = pytest.mark.both_stores

TEXTS = [
    "The Chroma Server uses SQLite for durable storage.",
    "Storage on SQLite is durable because of the WAL journal.",
    "Ask Redis about caching; Redis depends on Linux memory.",
]


class FailingExtractor:
    """Stands in for the extraction model call: fails for chosen sessions' turns."""

    def __init__(self, fail_ids: set[str], times: int = 10**9) -> None:
        self.fail_prefixes, self.times, self.calls = fail_ids, times, 0
        self.inner = KeywordExtractor()

    def extract(self, turns: Sequence[Mapping[str, Any]]) -> Extraction:
        if (
            turns
            and any(str(turns[0]["id"]).startswith(p + "-") for p in self.fail_prefixes)
            and self.calls < self.times
        ):
            self.calls += 1
            raise RuntimeError("extraction model refused the input")
        return self.inner.extract(turns)


async def _events(db: Any, kind: str, sid: str | None = None) -> list[Any]:
    if sid is None:
        return await db.fetchall("SELECT * FROM event WHERE kind = ? ORDER BY id", (kind,))
    return await db.fetchall("SELECT * FROM event WHERE kind = ? AND session_id = ? ORDER BY id", (kind, sid))


async def digested_from_scratch(
    ctx: Context, sid: str, chunk_rows: int | None = None
) -> tuple[list[Any], list[Any]]:
    """The graph one clean digestion of the session's current revision gives (graph reset first)."""
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute("DELETE FROM graph_edge")
        await conn.execute("DELETE FROM graph_node")
        await conn.execute(
            "UPDATE dream_state SET completed_revision = NULL, digest_state = 'pending', "
            "next_attempt_at = 0 WHERE session_id = ?",
            (sid,),
        )
    assert await Dreamer(ctx, chunk_rows=chunk_rows).run_pass() == 1
    return await graph_snapshot(db)


async def test_a_published_session_is_digested_from_its_raw_turns(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    revision = await publish(db, "s1")
    assert [c.session_id for c in await select_pending(db, clock.now_ms())] == ["s1"]
    assert await Dreamer(db_ctx).run_pass() == 1
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["digest_state"], row["owner_id"]) == (revision, "digested", None)
    assert row["overlay_pending"] == 1  # no Chroma here: the overlay waits, state.db is the record
    nodes, edges = await graph_snapshot(db)
    ids = {n[0] for n in nodes}
    assert {"session:s1", "turn:s1-m0000", "turn:s1-m0001", "turn:s1-m0002"} <= ids
    assert {"entity:sqlite", "entity:chroma server", "entity:redis", "concept:storage"} <= ids
    assert ("entity:chroma server", "entity:sqlite", "uses", "s1", 1.0, revision) in edges
    assert all(e[5] == revision for e in edges)
    assert await select_pending(db, clock.now_ms()) == []
    assert len(await _events(db, "dream.completed", "s1")) == 1


async def test_interleaving_completing_a_after_b_was_published_leaves_b_pending(db_ctx: Context) -> None:
    """Dream starts A; synthesis publishes B; Dream completes A; B is still eligible; a later pass completes B."""
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev_a = await publish(db, "s1")
    dreamer = Dreamer(db_ctx)
    claim = await claim_session(db, "s1", dreamer.owner_id, clock.now_ms())
    assert claim is not None and claim.revision == rev_a
    prepared = await dreamer.prepare(claim)  # Dream has read A's raw turns
    assert prepared is not None

    await add_turn(db, "s1", "s1-m0003", "Kafka replaces Redis for the event stream.", time=5_000)
    rev_b = await publish(db, "s1")  # synthesis publishes B
    assert rev_b != rev_a

    assert await dreamer.complete(prepared) == "completed_superseded"
    row = await dream_row(db, "s1")
    assert (row["input_revision"], row["completed_revision"], row["digest_state"]) == (
        rev_b,
        rev_a,
        "pending",
    )
    assert classify_drift(row) == "stale_completion"
    assert [c.session_id for c in await select_pending(db, clock.now_ms())] == ["s1"]
    _, edges = await graph_snapshot(db)
    assert "turn:s1-m0003" not in {e[1] for e in edges}  # A's graph: B's turn is not in it

    assert await dreamer.run_pass() == 1
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["digest_state"]) == (rev_b, "digested")
    _, edges = await graph_snapshot(db)
    assert ("session:s1", "turn:s1-m0003", "has_turn", "s1", 1.0, rev_b) in edges
    # B wrote only what it changed: A's rows that B kept as they were are not rewritten
    assert ("session:s1", "turn:s1-m0000", "has_turn", "s1", 1.0, rev_a) in edges
    assert {e[5] for e in edges if e[3] == "s1"} == {rev_a, rev_b}
    assert await select_pending(db, clock.now_ms()) == []
    assert without_revisions(await graph_snapshot(db)) == without_revisions(
        await digested_from_scratch(db_ctx, "s1")
    )


async def test_a_revision_the_raw_turns_no_longer_match_writes_nothing(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev_a = await publish(db, "s1")
    await add_turn(db, "s1", "s1-m0009", "A new user turn nobody summarized yet.", time=9_000)
    dreamer = Dreamer(db_ctx)
    assert await dreamer.run_pass() == 1
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["digest_state"], row["owner_id"]) == (None, "pending", None)
    assert row["next_attempt_at"] == frozen_clock.now + STALE_RECHECK_MS
    assert await graph_snapshot(db) == ([], [])
    stale = await _events(db, "dream.stale", "s1")
    assert len(stale) == 1 and rev_a in stale[0]["data"]
    assert classify_drift({**row, "dirty_seq": 2, "clean_seq": 1}) == "summary_stale"
    # synthesis catches up and publishes: eligible at once, digested
    rev_b = await publish(db, "s1")
    assert [c.session_id for c in await select_pending(db, frozen_clock.now)] == ["s1"]
    assert await dreamer.run_pass() == 1
    assert (await dream_row(db, "s1"))["completed_revision"] == rev_b


async def test_republishing_an_equal_revision_does_not_redigest(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev = await publish(db, "s1")
    dreamer = Dreamer(db_ctx)
    assert await dreamer.run_pass() == 1
    before = await graph_snapshot(db)
    assert await publish(db, "s1") == rev  # a re-synthesis of equal input (new prose, same turns)
    assert await select_pending(db, clock.now_ms()) == []
    assert await dreamer.run_pass() == 0
    assert len(await _events(db, "dream.completed", "s1")) == 1
    assert await graph_snapshot(db) == before


async def test_count_only_collision_reopens_the_session_for_summarizer_and_dream(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev_a = await publish(db, "s1")
    dreamer = Dreamer(db_ctx)
    assert await dreamer.run_pass() == 1
    count_before = await db.scalar("SELECT count(*) FROM session_message WHERE session_id = 's1'")

    await replace_text(db, "s1-m0002", "Postgres handles analytics now; Kafka feeds Postgres.")
    assert await db.scalar("SELECT count(*) FROM session_message WHERE session_id = 's1'") == count_before
    async with db.snapshot() as conn:
        raw, _ = await raw_revision(conn, "s1")
    job = await db.fetchone(
        "SELECT summarized_revision, dirty_seq, clean_seq FROM summary_job WHERE session_id = 's1'"
    )
    assert raw != rev_a and job["summarized_revision"] == rev_a  # the summarizer's drift: raw != summarized
    assert job["dirty_seq"] > job["clean_seq"]

    rev_b = await publish(db, "s1")
    assert rev_b == raw
    assert [c.session_id for c in await select_pending(db, clock.now_ms())] == ["s1"]
    assert await dreamer.run_pass() == 1
    nodes, edges = await graph_snapshot(db)
    ids = {n[0] for n in nodes}
    assert {"entity:postgres", "entity:kafka"} <= ids
    assert "entity:redis" not in ids and "entity:linux" not in ids  # swept: no edge reaches them now
    assert without_revisions((nodes, edges)) == without_revisions(await digested_from_scratch(db_ctx, "s1"))


async def test_failures_defer_then_make_only_that_revision_undigestible(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev_a = await publish(db, "s1")
    dreamer = Dreamer(db_ctx, extractor=FailingExtractor({"s1"}), retry_base_ms=1_000)
    for attempt in range(1, MAX_DIGEST_ATTEMPTS + 1):
        assert await dreamer.run_pass() == 1
        row = await dream_row(db, "s1")
        assert row["digest_attempts"] == attempt and row["attempts_revision"] == rev_a
        assert "extraction model refused" in row["defer_reason"]
        if attempt < MAX_DIGEST_ATTEMPTS:
            assert row["digest_state"] == "deferred" and classify_drift(row) == "deferred"
            assert await dreamer.run_pass() == 0  # backing off: not selected yet
            frozen_clock.advance(row["next_attempt_at"] - frozen_clock.now)
    assert (row["digest_state"], row["next_attempt_at"]) == ("undigestible", NEVER)
    assert classify_drift(row) == "undigestible"
    assert len(await _events(db, "dream.undigestible", "s1")) == 1
    assert len(await _events(db, "dream.deferred", "s1")) == MAX_DIGEST_ATTEMPTS - 1
    frozen_clock.advance(10**10)
    assert await select_pending(db, frozen_clock.now) == []
    assert await graph_snapshot(db) == ([], [])

    # a new revision is not blocked by the old one's failures
    await add_turn(db, "s1", "s1-m0005", "One more turn.", time=7_000)
    rev_b = await publish(db, "s1")
    row = await dream_row(db, "s1")
    assert (row["digest_state"], row["digest_attempts"], row["next_attempt_at"]) == ("pending", 0, 0)
    assert await Dreamer(db_ctx).run_pass() == 1
    assert (await dream_row(db, "s1"))["completed_revision"] == rev_b


async def test_a_failure_of_a_superseded_revision_does_not_block_the_new_one(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    await publish(db, "s1")
    dreamer = Dreamer(db_ctx, extractor=FailingExtractor({"s1"}, times=1))
    claim = await claim_session(db, "s1", dreamer.owner_id, clock.now_ms())
    assert claim is not None
    prepared = await dreamer.prepare(claim)
    assert prepared is not None
    await add_turn(db, "s1", "s1-m0005", "One more turn.", time=7_000)
    rev_b = await publish(db, "s1")
    assert await dreamer.complete(prepared) == "superseded"
    row = await dream_row(db, "s1")
    assert (row["digest_state"], row["digest_attempts"], row["next_attempt_at"]) == ("pending", 0, 0)
    assert await dreamer.run_pass() == 1
    assert (await dream_row(db, "s1"))["completed_revision"] == rev_b


async def test_a_lost_lease_publishes_nothing_and_the_taker_completes(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev = await publish(db, "s1")
    slow, fast = Dreamer(db_ctx, lease_ms=1_000), Dreamer(db_ctx, lease_ms=1_000)
    claim = await claim_session(db, "s1", slow.owner_id, frozen_clock.now, 1_000)
    assert claim is not None
    prepared = await slow.prepare(claim)
    assert prepared is not None
    assert await claim_session(db, "s1", fast.owner_id, frozen_clock.now, 1_000) is None  # held
    frozen_clock.advance(1_001)  # the slow worker stalls past its lease
    assert await fast.run_pass() == 1
    taken = await _events(db, "dream.taken_over", "s1")
    assert len(taken) == 1 and slow.owner_id in taken[0]["data"]
    after_fast = await graph_snapshot(db)
    assert await slow.complete(prepared) == "lost"
    assert await graph_snapshot(db) == after_fast
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["digest_state"], row["epoch"]) == (rev, "digested", 2)
    assert len(await _events(db, "dream.completed", "s1")) == 1


class RecordingDreamer(Dreamer):
    """Records the ready time of every session it claims, in claim order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: list[Candidate] = []

    async def digest_candidate(self, candidate: Candidate) -> str | None:
        outcome = await super().digest_candidate(candidate)
        if outcome is not None:
            self.claimed.append(candidate)
        return outcome


async def test_selection_is_fair_under_overload_and_skips_no_window(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    """Fresh sessions arrive faster than Dream digests; old ones and retries are never starved."""
    db = await db_ctx.db()
    published: list[str] = []
    for i in range(12):
        sid = f"old{i:02d}"
        await add_session_with_turns(db, sid, [f"Turn about Topic{i} and storage."])
        await publish(db, sid, now=frozen_clock.now + i)
        published.append(sid)
    dreamer = RecordingDreamer(
        db_ctx, batch=3, extractor=FailingExtractor({"old02", "old05"}, times=2), retry_base_ms=2_500
    )
    fresh = 0
    for _ in range(40):
        frozen_clock.advance(1_000)
        for _ in range(4):  # 4 fresh publications per pass, 3 digested per pass: a growing backlog
            sid = f"new{fresh:03d}"
            await add_session_with_turns(db, sid, [f"Fresh turn {fresh} about Kafka."])
            await publish(db, sid)
            published.append(sid)
            fresh += 1
        await dreamer.run_pass()
    ready = [c.ready_at for c in dreamer.claimed]
    assert ready == sorted(ready), "a session ready later was served before one ready earlier"
    digested = {
        r[0]
        for r in await db.fetchall(
            "SELECT session_id FROM dream_state WHERE completed_revision IS input_revision"
        )
    }
    assert {f"old{i:02d}" for i in range(12)} <= digested  # including the two that failed first
    assert [c.session_id for c in dreamer.claimed].count("old02") == 2
    # what is still pending is exactly the newest tail: no window was skipped
    waiting = [sid for sid in published if sid not in digested]
    assert waiting == published[len(published) - len(waiting) :]


@pytest.mark.sqlite_only  # SQLite's EXPLAIN QUERY PLAN
async def test_the_selection_query_uses_the_partial_index(db_ctx: Context) -> None:
    db = await db_ctx.db()
    plan = await db.fetchall("EXPLAIN QUERY PLAN " + SELECT_PENDING_SQL, {"now": 1, "limit": 10})
    details = [r["detail"] for r in plan]
    searches = [d for d in details if "dream_state" in d]
    assert len(searches) == 2 and all("USING INDEX dream_state_pending_idx" in d for d in searches), details
    assert not any(d.startswith("SCAN dream_state") and "INDEX" not in d for d in details)


async def test_drift_classes(db_ctx: Context) -> None:
    base = {"input_revision": "sha256:b", "completed_revision": None, "digest_state": "pending"}
    assert classify_drift(base) == "dream_pending"
    assert classify_drift({**base, "completed_revision": "sha256:a"}) == "stale_completion"
    assert classify_drift({**base, "completed_revision": "sha256:b", "digest_state": "digested"}) == "current"
    assert classify_drift({**base, "digest_state": "deferred"}) == "deferred"
    assert classify_drift({**base, "digest_state": "undigestible"}) == "undigestible"
    assert classify_drift({**base, "dirty_seq": 3, "clean_seq": 2}) == "summary_stale"
    assert (
        classify_drift(
            {
                "input_revision": None,
                "completed_revision": None,
                "digest_state": "legacy",
                "legacy_digested": 1,
            }
        )
        == "legacy_only"
    )


async def test_legacy_retirement_needs_zero_rows_for_a_full_window(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    from backend.dream.legacy import LEGACY_RETIREMENT_WINDOW_MS, _mark_legacy

    db = await db_ctx.db()
    assert (await legacy_retirement(db))["retired"]  # never had legacy rows
    await add_session_with_turns(db, "s1", TEXTS)
    assert await _mark_legacy(db, ["s1", "no-such-session"]) == 1
    async with db.tx() as conn:
        from backend.store.events import append_event

        await append_event(conn, kind="dream.legacy_imported", actor="t", data={"marked": 1})
    assert await legacy_only_count(db) == 1
    assert await select_pending(db, frozen_clock.now) == []  # honoured as digested
    state = await legacy_retirement(db)
    assert (state["legacy_only"], state["retired"]) == (1, False)

    await publish(db, "s1")  # synthesis publishes a revision: the legacy flag stops counting
    assert await legacy_only_count(db) == 0
    assert await Dreamer(db_ctx).run_pass() == 1
    assert len(await _events(db, "dream.legacy_superseded", "s1")) == 1
    assert (await dream_row(db, "s1"))["legacy_digested"] == 0
    assert not (await legacy_retirement(db))["retired"]  # zero, but not yet for a full window
    frozen_clock.advance(LEGACY_RETIREMENT_WINDOW_MS)
    assert (await legacy_retirement(db))["retired"]


@pytest.mark.parametrize("point", ["dream.mid_graph", "dream.before_attest"])
async def test_a_raised_fault_counts_as_a_failure_and_a_rerun_is_idempotent(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    from backend.core import faults

    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS * 4)
    rev = await publish(db, "s1")
    monkeypatch.setenv("REM_FAULTS", f"{point}=raise")
    faults.reset()
    assert await Dreamer(db_ctx, chunk_rows=5).run_pass() == 1
    row = await dream_row(db, "s1")
    assert (row["digest_state"], row["digest_attempts"], row["completed_revision"]) == ("deferred", 1, None)
    partial = await graph_snapshot(db)
    assert partial[0]  # part of the graph was written before the fault
    monkeypatch.delenv("REM_FAULTS")
    faults.reset()
    async with db.tx() as conn:
        await conn.execute("UPDATE dream_state SET next_attempt_at = 1")
    assert await Dreamer(db_ctx, chunk_rows=5).run_pass() == 1
    assert (await dream_row(db, "s1"))["completed_revision"] == rev
    rerun = await graph_snapshot(db)
    # the reference: the same revision digested on a clean graph (revision stamps included)
    assert await digested_from_scratch(db_ctx, "s1", chunk_rows=5) == rerun


class BlockingExtractor:
    """Stands in for a slow extraction model call: blocks until released."""

    def __init__(self) -> None:
        import threading

        self.entered, self.release = threading.Event(), threading.Event()

    def extract(self, turns: Sequence[Mapping[str, Any]]) -> Extraction:
        self.entered.set()
        assert self.release.wait(30)
        return KeywordExtractor().extract(turns)


async def test_the_heartbeat_renews_the_lease_of_a_slow_digestion(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    import asyncio

    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev = await publish(db, "s1")
    extractor = BlockingExtractor()
    dreamer, other = Dreamer(db_ctx, extractor=extractor, lease_ms=5_000), Dreamer(db_ctx, lease_ms=5_000)
    task = asyncio.create_task(dreamer.run_pass())
    try:
        await asyncio.to_thread(extractor.entered.wait, 30)
        for _ in range(3):  # 12 s of model time on a 5 s lease, renewed every 4 s
            frozen_clock.advance(4_000)
            await dreamer.on_heartbeat()
            row = await dream_row(db, "s1")
            assert row["lease_expires_at"] == frozen_clock.now + 5_000
            assert await other.run_pass() == 0  # never taken over while renewed
    finally:
        extractor.release.set()
        assert await task == 1
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["epoch"]) == (rev, 1)


async def test_an_operator_release_lets_another_worker_take_over_at_once(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    from backend.ops.lease_release import release_lease

    db = await db_ctx.db()
    await add_session_with_turns(db, "s1", TEXTS)
    rev = await publish(db, "s1")
    stuck, other = Dreamer(db_ctx), Dreamer(db_ctx)
    claim = await claim_session(db, "s1", stuck.owner_id, frozen_clock.now)
    assert claim is not None
    prepared = await stuck.prepare(claim)
    assert prepared is not None
    assert await other.run_pass() == 0  # the lease is live (30 s)
    async with db.tx() as conn:
        await release_lease(
            conn,
            "dream",
            "s1",
            expected_epoch=claim.epoch,
            force=False,
            actor="operator",
            now=frozen_clock.now,
        )
    assert await other.run_pass() == 1  # no wait for the old expiry
    assert await stuck.complete(prepared) == "lost"
    row = await dream_row(db, "s1")
    assert (row["completed_revision"], row["digest_state"], row["epoch"]) == (rev, "digested", 3)
    assert len(await _events(db, "dream.taken_over", "s1")) == 1
