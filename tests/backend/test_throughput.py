"""The journal tally behind the throughput counters: real turns, incremental folds, bounded reads."""

from __future__ import annotations

from backend import ops
from backend.core import clock
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.ops import throughput
from backend.ops.throughput import JournalTally
from backend.runtime.context import Context


async def test_a_real_turn_journals_its_latency_from_admission_to_reply(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "how long did this take", input_id="in-1")
    frozen_clock.advance(1_500)  # the input waits 1.5 s before an executor picks it up
    await Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=2_000).run()
    status = await ops.status(db_ctx)
    tally = status["throughput"]
    assert tally["counters"]["turns_completed"] == 1
    latency = tally["turn_latency"]
    assert latency["count"] == 1 and latency["sum_s"] == 1.5
    # 1.5 s falls in the 2.5 s bucket, not the 1 s one
    bounds = dict(zip(latency["buckets_s"], latency["cumulative"], strict=False))
    assert bounds[1.0] == 0 and bounds[2.5] == 1


async def test_a_long_lived_reader_folds_only_the_events_since_its_last_call(
    db_ctx: Context, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    db = await db_ctx.db()
    for i in range(25):
        await sessions.admit(db, f"s{i}", "hello", input_id=f"in-{i}")
    await Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=2_000).run()
    monkeypatch.setattr(throughput, "FOLD_ID_RANGE", 10)  # small ranges: several bounded reads
    first = await ops.status(db_ctx)
    tally = db_ctx.memo["journal_tally"]
    assert isinstance(tally, JournalTally)
    assert first["throughput"]["counters"]["turns_completed"] == 25
    last_id = await db.scalar("SELECT max(id) FROM event")
    assert tally.through_id == last_id
    await sessions.admit(db, "s0", "again", input_id="in-again")
    await Executor(db_ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=2_000).run()
    new_events = await db.scalar("SELECT count(*) FROM event WHERE id > ?", (last_id,))
    ranges = await db.run_in_thread(lambda conn: JournalTally(through_id=last_id).fold_sync(conn))
    assert ranges == -(-new_events // 10)  # the new events only, ten ids per read
    second = await ops.status(db_ctx)
    assert second["throughput"]["counters"]["turns_completed"] == 26


def test_a_tally_survives_its_dict_form() -> None:
    tally = JournalTally(through_id=41, since=5)
    tally.counters["turns_completed"] = 7
    tally.actions[("release", "forced")] = 2
    tally.latency[3] = 4
    tally.latency_sum_ms = 2_500.0
    again = JournalTally.from_dict(tally.as_dict())
    assert again == tally
