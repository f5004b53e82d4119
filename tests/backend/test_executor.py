"""The executor in-process: turns, steer vs queue, recovery, projection, the attempt budget, drain."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.core.errors import LeaseLost
from backend.execution import leases, projection, recovery, sessions
from backend.execution.agent import OfflineResponder, StepRequest
from backend.execution.executor import WAKE_SQL, Executor, TurnState
from backend.ops.lease_release import release_lease
from backend.runtime.context import Context
from backend.store import workers
from backend.store.db import Database
from tests.helpers import await_until

# the lease and turn paths are the store's hot paths: both engines run them
pytestmark = pytest.mark.both_stores

LEASE = 2_000


def _executor(
    ctx: Context, *, delay_ms: int = 0, owner: str | None = None, once: bool = True, agent: Any = None
) -> Executor:
    return Executor(
        ctx, once=once, owner_id=owner, agent=agent or OfflineResponder(delay_ms=delay_ms), lease_ms=LEASE
    )


async def _messages(db: Database, sid: str) -> list[dict[str, Any]]:
    rows = await db.fetchall(
        "SELECT id, type, seq, data FROM session_message WHERE session_id = ? ORDER BY seq", (sid,)
    )
    return [{"id": r["id"], "type": r["type"], "seq": r["seq"], **json.loads(r["data"])} for r in rows]


async def _violations(db: Database) -> list[dict[str, Any]]:
    return await db.read_in_thread(projection.transcript_violations_sync)


async def _parts_text(db: Database, message_id: str) -> str:
    rows = await db.fetchall("SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (message_id,))
    return "".join(json.loads(r[0])["text"] for r in rows)


async def test_one_turn_projects_the_user_message_and_a_streamed_reply(db_ctx: Context) -> None:
    db = await db_ctx.db()
    text = "Why did the nightly export stall? Check the ledger and the export window."
    await sessions.admit(db, "s1", text, input_id="in-1")
    executor = _executor(db_ctx)
    await executor.run()
    user, assistant = await _messages(db, "s1")
    promoted = await db.fetchone("SELECT promoted_seq, wake_pending FROM session_input WHERE id = 'in-1'")
    assert (user["id"], user["type"], user["seq"]) == ("in-1", "user", promoted["promoted_seq"])
    assert promoted["wake_pending"] == 0
    assert (user["text"], user["delivery"], user["input_id"]) == (text, "queue", "in-1")
    expected = "".join(OfflineResponder().compose(StepRequest("s1", [text], step=1)))
    assert assistant["type"] == "assistant" and assistant["status"] == "completed"
    assert assistant["text"] == expected and await _parts_text(db, assistant["id"]) == expected
    assert "export" in expected and "You asked" in expected  # derived from the prompt, not a constant
    assert assistant["parent_id"] == "in-1" and assistant["execution_id"] == user["execution_id"]
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await db.scalar("SELECT turn_count FROM session WHERE id = 's1'") == 1
    assert await db.scalar("SELECT dirty_seq FROM summary_job WHERE session_id = 's1'") >= 2
    kinds = [r[0] for r in await db.fetchall("SELECT kind FROM event WHERE session_id = 's1' ORDER BY id")]
    parts = await db.scalar("SELECT count(*) FROM session_part WHERE message_id = ?", (assistant["id"],))
    # every streamed part is journaled as it is written (schema v13: the API's event streams)
    assert kinds == [
        "input.admitted",
        "execution.claimed",
        "input.promoted",
        *["message.part"] * parts,
        "execution.step",
        "execution.completed",
    ]
    assert await _violations(db) == []


async def test_a_steer_joins_the_running_turn_and_a_queue_input_waits(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "First question about billing?", input_id="q1")
    executor = _executor(db_ctx, delay_ms=60, once=False)
    task = asyncio.create_task(executor.run())
    await await_until(lambda: db.scalar("SELECT count(*) FROM session_part"), message="streaming")
    await sessions.admit(db, "s1", "Second, separate question?", input_id="q2")
    await sessions.admit(db, "s1", "Actually, focus on refunds.", delivery="steer", input_id="s3")
    await await_until(
        lambda: db.scalar(
            "SELECT count(*) = 0 FROM session_input WHERE promoted_seq IS NULL "
            "OR EXISTS (SELECT 1 FROM session_execution)"
        ),
        message="all turns",
    )
    executor.request_stop()
    await task
    seqs = {r[0]: r[1] for r in await db.fetchall("SELECT id, promoted_seq FROM session_input")}
    assert seqs["q1"] < seqs["s3"] < seqs["q2"]  # the steer jumped the queue
    msgs = await _messages(db, "s1")
    users = {m["id"]: m for m in msgs if m["type"] == "user"}
    replies = [m for m in msgs if m["type"] == "assistant"]
    assert users["q1"]["execution_id"] == users["s3"]["execution_id"] != users["q2"]["execution_id"]
    assert [r["answers"] for r in replies] == [["q1"], ["s3"], ["q2"]]
    assert [r["step"] for r in replies] == [1, 2, 1]
    assert all(r["status"] == "completed" for r in replies)
    assert [m["id"] for m in msgs] == ["q1", replies[0]["id"], "s3", replies[1]["id"], "q2", replies[2]["id"]]
    assert await _violations(db) == []
    report = await ops.check(db_ctx, settled=True, verify_chroma=False)
    assert [v for v in report["violations"] if v["invariant"] in ("1", "3")] == []


async def test_a_steer_waiting_at_a_turn_start_joins_that_turn(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "queued first", input_id="q1")
    await sessions.admit(db, "s1", "queued second", input_id="q2")
    await sessions.admit(db, "s1", "steer me", delivery="steer", input_id="s3")
    await _executor(db_ctx).run()
    replies = [m for m in await _messages(db, "s1") if m["type"] == "assistant"]
    assert [r["answers"] for r in replies] == [["q1", "s3"], ["q2"]]


async def _dead_executor_mid_step(ctx: Context, parts: int) -> tuple[Executor, TurnState, str]:
    """Run a turn by hand up to `parts` streamed parts, then abandon it (as a SIGKILL would)."""
    db = await ctx.db()
    dead = _executor(ctx, owner="executor-dead")
    dead.db = db
    lease = await dead._claim("s1")
    assert lease is not None
    state = TurnState(lease)
    step = await db.write_in_thread(lambda conn: dead.steps.begin_step_sync(conn, state, clock.now_ms()))
    assert step is not None
    step.parts = OfflineResponder().compose(step.request)[:parts]
    if parts:
        await db.write_in_thread(lambda conn: dead.steps.flush_sync(conn, state, step, "".join(step.parts)))
    return dead, state, step.assistant_id


async def test_takeover_of_a_step_in_flight_supersedes_it_and_reruns_it(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Is the Frankfurt region late again?", input_id="in-1")
    dead, state, stale_id = await _dead_executor_mid_step(db_ctx, parts=2)
    eid = state.lease.execution_id
    assert (await db.fetchone("SELECT phase FROM session_execution"))[0] == "unknown"
    await _executor(db_ctx).run()  # lease not expired yet: nothing to do
    assert await db.scalar("SELECT count(*) FROM session_recovery") == 0
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    msgs = await _messages(db, "s1")
    assert [m["type"] for m in msgs] == ["user", "assistant", "synthetic", "assistant"]
    user, stale, cont, fresh = msgs
    assert stale["id"] == stale_id and stale["status"] == "superseded"
    assert stale["superseded_by"] == f"recovery:{eid}" and await _parts_text(db, stale_id) == stale["text"]
    assert (cont["id"], cont["key"], cont["interrupted_phase"]) == (f"recovery:{eid}",) * 2 + ("unknown",)
    assert fresh["status"] == "completed" and fresh["answers"] == ["in-1"] and fresh["execution_id"] == eid
    assert fresh["text"].startswith(f"(Resuming after execution {eid}")
    rec = await db.fetchone("SELECT * FROM session_recovery")
    assert (rec["execution_id"], rec["phase"], rec["wake_pending"], rec["wake_attempts"]) == (
        eid,
        "continue",
        0,
        1,
    )
    assert (rec["assistant_message_id"], rec["continuation_message_id"]) == (stale_id, cont["id"])
    taken = await db.fetchone("SELECT data FROM event WHERE kind = 'execution.taken_over'")
    assert json.loads(taken[0])["interrupted_phase"] == "unknown"
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await _violations(db) == []
    # the dead owner wakes up: its fence fails and the closed row can never reopen
    with pytest.raises(LeaseLost):
        await db.write_in_thread(lambda conn: leases.guard_sync(conn, state.lease, now=clock.now_ms()))
    with pytest.raises(LeaseLost):
        await db.write_in_thread(
            lambda conn: projection.update_owned_assistant_sync(
                conn, stale_id, {"status": "completed", "text": "late"}, clock.now_ms()
            )
        )
    assert (await _messages(db, "s1"))[1]["status"] == "superseded"


async def test_takeover_before_any_promotion_is_phase_ready(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "hello there", input_id="in-1")
    dead = _executor(db_ctx, owner="executor-dead")
    dead.db = db
    lease = await dead._claim("s1")  # then killed before promoting
    assert lease is not None
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    msgs = await _messages(db, "s1")
    assert [m["type"] for m in msgs] == ["synthetic", "user", "assistant"]
    assert msgs[0]["interrupted_phase"] == "ready" and msgs[2]["answers"] == ["in-1"]
    assert await db.scalar("SELECT phase FROM session_recovery") == "continue"
    assert await _violations(db) == []


async def test_takeover_after_a_safe_step_continues_with_the_waiting_steer(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "first", input_id="q1")
    dead, state, first_id = await _dead_executor_mid_step(db_ctx, parts=0)
    await sessions.admit(db, "s1", "and steer", delivery="steer", input_id="s2")
    step = projection.assistant_id(state.lease.execution_id, 1)
    from backend.execution.executor import Step

    done = Step(
        number=1,
        assistant_id=step,
        data=(await _messages(db, "s1"))[1],
        request=StepRequest("s1", ["first"]),
        parts=["ok"],
    )
    assert await db.write_in_thread(
        lambda conn: dead.steps.finish_step_sync(conn, state, done, ["ok"])
    )  # steer waits
    assert await db.scalar("SELECT phase FROM session_execution") == "safe"
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    msgs = await _messages(db, "s1")
    assert [m["type"] for m in msgs] == ["user", "assistant", "synthetic", "user", "assistant"]
    assert msgs[1]["id"] == first_id and msgs[1]["status"] == "completed"  # a safe step is kept
    assert msgs[2]["interrupted_phase"] == "ready" and msgs[4]["answers"] == ["s2"]
    assert await _violations(db) == []


async def test_the_attempt_budget_parks_and_release_retries(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "poison pill", input_id="in-1")
    _, state, _ = await _dead_executor_mid_step(db_ctx, parts=1)
    eid = state.lease.execution_id
    for attempt in range(1, recovery.RECOVERY_BUDGET + 1):
        frozen_clock.advance(LEASE)
        # each taker dies right after its takeover: the attempt is counted before any work
        taken = await db.write_in_thread(
            lambda conn, a=attempt: recovery.take_over_sync(
                conn,
                eid,
                f"executor-{a}",
                now=clock.now_ms(),
                budget=recovery.RECOVERY_BUDGET,
                length_ms=LEASE,
            )
        )
        assert taken is not None and taken.attempt == attempt
    assert await db.scalar("SELECT wake_attempts FROM session_recovery") == recovery.RECOVERY_BUDGET
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()  # the 11th attempt parks instead of running
    rec = await db.fetchone("SELECT recovery_error, wake_attempts FROM session_recovery")
    assert "parked after 10 recovery attempts" in rec[0] and rec[1] == recovery.RECOVERY_BUDGET
    assert "rem release" in await db.scalar("SELECT recovery_error FROM session_execution")
    cont = (await _messages(db, "s1"))[2]
    assert cont["type"] == "synthetic" and cont["status"] == "error" and "parked" in cont["error"]
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'recovery.parked'") == 1
    assert (
        await db.read_in_thread(lambda conn: recovery.recoverable_sync(conn, clock.now_ms() + 10**9, 10))
        == []
    )
    frozen_clock.advance(10 * LEASE)
    await _executor(db_ctx).run()  # parked rows are never retried in a loop
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'recovery.parked'") == 1
    async with db.tx() as conn:
        released = await release_lease(conn, "execution", eid, actor="op", now=clock.now_ms())
    assert released["unparked"]
    await _executor(db_ctx).run()
    assert await db.scalar("SELECT wake_attempts FROM session_recovery") == 1
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    msgs = await _messages(db, "s1")
    assert sum(m["type"] == "synthetic" for m in msgs) == 1 and msgs[-1]["status"] == "completed"
    assert await _violations(db) == []


async def test_an_injected_fault_is_a_crash_not_an_agent_error(
    db_ctx: Context, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend.core import faults

    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Interrupt me in the middle.", input_id="q1")
    monkeypatch.setenv("REM_FAULTS", "executor.mid_stream=raise")
    faults.reset()
    await _executor(db_ctx, delay_ms=60).run()
    row = await db.fetchone("SELECT phase, assistant_message_id FROM session_execution")
    assert row is not None and row["phase"] == "unknown"  # left for recovery, like a kill
    stale = (await _messages(db, "s1"))[1]
    assert stale["status"] == "streaming" and await _parts_text(db, stale["id"])
    monkeypatch.delenv("REM_FAULTS")
    faults.reset()
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    assert [m["status"] for m in await _messages(db, "s1") if m["type"] == "assistant"] == [
        "superseded",
        "completed",
    ]
    assert await _violations(db) == []


async def test_a_failed_write_of_rem_s_own_is_a_crash_not_an_agent_error(
    db_ctx: Context, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part write failing with the engine's own error (a constraint, say) is not the agent's failure:
    no error reply is written for the user; the turn is left for recovery, like a crash."""
    from backend.execution import streaming

    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Write my parts, please.", input_id="q1")

    def broken_write(conn: Any, rows: Any) -> Any:
        conn.execute("INSERT INTO session (id) SELECT id FROM session")  # a duplicate key: the engine's error
        raise AssertionError("unreachable")

    monkeypatch.setattr(streaming, "_write_parts_sync", broken_write)
    await _executor(db_ctx, delay_ms=60).run()
    row = await db.fetchone("SELECT phase FROM session_execution")
    assert row is not None and row["phase"] == "unknown"  # left for recovery
    assert [m["status"] for m in await _messages(db, "s1") if m["type"] == "assistant"] == ["streaming"]
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.failed'") == 0
    monkeypatch.undo()
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    replies = [m for m in await _messages(db, "s1") if m["type"] == "assistant"]
    assert [r["status"] for r in replies] == ["superseded", "completed"] and replies[1]["answers"] == ["q1"]
    assert await _violations(db) == []


class FailingAgent(OfflineResponder):
    """Fails mid-reply on prompts that say "boom"."""

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        async for part in super().stream(request):
            yield part
            if "boom" in request.prompts[0]:
                raise RuntimeError("model exploded")


async def test_an_agent_failure_closes_the_step_as_an_error_and_the_session_goes_on(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "boom goes the model", input_id="q1")
    await sessions.admit(db, "s1", "a calm follow-up", input_id="q2")
    await _executor(db_ctx, agent=FailingAgent(delay_ms=0)).run()
    replies = [m for m in await _messages(db, "s1") if m["type"] == "assistant"]
    assert [r["status"] for r in replies] == ["error", "completed"]
    assert "model exploded" in replies[0]["error"] and replies[1]["answers"] == ["q2"]
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.failed'") == 1
    assert await _violations(db) == []


async def test_draining_finishes_the_turn_in_flight_and_leaves_the_rest_waiting(db_ctx: Context) -> None:
    db = await db_ctx.db()
    for i in range(3):
        await sessions.admit(db, "s1", f"question {i}", input_id=f"q{i}")
    executor = _executor(db_ctx, delay_ms=40, once=False)
    task = asyncio.create_task(executor.run())
    await await_until(lambda: db.scalar("SELECT count(*) FROM session_part"), message="streaming")
    executor.request_stop()
    await task
    states = {
        r[0]: (r[1], r[2])
        for r in await db.fetchall("SELECT id, promoted_seq IS NOT NULL, wake_pending FROM session_input")
    }
    assert states == {"q0": (1, 0), "q1": (0, 1), "q2": (0, 1)}
    assert [m["status"] for m in await _messages(db, "s1") if m["type"] == "assistant"] == ["completed"]
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await db.scalar("SELECT count(*) FROM session_recovery") == 0  # draining never needs recovery
    assert await db.scalar("SELECT state FROM worker") == "stopped"


async def test_a_turn_that_outlives_the_drain_grace_is_handed_back(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_EXECUTOR_DRAIN_MS", "50")
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "a slow one", input_id="q1")
    executor = _executor(db_ctx, delay_ms=300, once=False)
    task = asyncio.create_task(executor.run())
    await await_until(lambda: db.scalar("SELECT count(*) FROM session_part"), message="streaming")
    executor.request_stop()
    await task
    row = await db.fetchone("SELECT epoch, expires_at FROM session_execution")
    assert row is not None and row["expires_at"] <= clock.now_ms() and row["epoch"] == 2
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.handed_back'") == 1
    await _executor(db_ctx).run()  # any executor takes it over at once
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await _violations(db) == []


async def test_a_released_lease_stops_its_owner_mid_stream(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Stream this slowly, please.", input_id="q1")
    first = _executor(db_ctx, delay_ms=150, once=False, owner="executor-first")
    task = asyncio.create_task(first.run())
    await await_until(lambda: db.scalar("SELECT count(*) FROM session_part"), message="streaming")
    eid, stale_id = tuple(await db.fetchone("SELECT id, assistant_message_id FROM session_execution"))
    async with db.tx() as conn:
        await release_lease(conn, "execution", eid, expected_epoch=1, actor="op", now=clock.now_ms())
    stale_parts = await _parts_text(db, stale_id)
    await await_until(
        lambda: db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.lease_lost'"),
        message="the first owner noticed",
    )
    # the released execution is open to any executor, this one included (a new epoch)
    await await_until(lambda: db.scalar("SELECT count(*) = 0 FROM session_execution"), message="recovered")
    first.request_stop()
    await task
    stale, fresh = [m for m in await _messages(db, "s1") if m["type"] == "assistant"]
    assert stale["id"] == stale_id and stale["status"] == "superseded"
    assert await _parts_text(db, stale_id) == stale_parts  # nothing the old lease wrote landed after
    assert fresh["status"] == "completed" and fresh["epoch"] == 3 and fresh["answers"] == ["q1"]
    lost = await db.fetchone("SELECT data FROM event WHERE kind = 'execution.lease_lost'")
    assert json.loads(lost[0])["epoch"] == 1
    assert await _violations(db) == []


async def test_the_context_epoch_is_created_once_and_only_moves_forward(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "one", input_id="q1")
    await _executor(db_ctx).run()
    first = await db.fetchone("SELECT baseline, snapshot, baseline_seq FROM session_context_epoch")
    q1_seq = await db.scalar("SELECT promoted_seq FROM session_input WHERE id = 'q1'")
    assert first["baseline_seq"] == q1_seq and json.loads(first["snapshot"])["agent"] == "offline-responder"
    await sessions.admit(db, "s1", "two", input_id="q2")
    await _executor(db_ctx).run()
    assert tuple(
        await db.fetchone("SELECT baseline, snapshot, baseline_seq FROM session_context_epoch")
    ) == tuple(first)

    class NewAgent(OfflineResponder):
        version = "2"

    await sessions.admit(db, "s1", "three", input_id="q3")
    await _executor(db_ctx, agent=NewAgent(delay_ms=0)).run()
    moved = await db.fetchone("SELECT snapshot, baseline_seq FROM session_context_epoch")
    q3_seq = await db.scalar("SELECT promoted_seq FROM session_input WHERE id = 'q3'")
    assert moved["baseline_seq"] == q3_seq and json.loads(moved["snapshot"])["version"] == "2"
    assert not await db.write_in_thread(
        lambda conn: projection.record_context_baseline_sync(
            conn, "s1", "older", {"agent": "x"}, 1, clock.now_ms()
        )
    )
    assert await db.scalar("SELECT baseline_seq FROM session_context_epoch") == q3_seq


async def _record_stopped(db: Database, host: str) -> None:
    """What a supervisor on `host` records when it sees the dead executor's process exit."""
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES ('executor-dead', 'executor', 1, ?, ?, ?, 'stopped')",
            (host, clock.now_ms(), clock.now_ms()),
        )


async def test_an_execution_whose_owner_is_recorded_stopped_is_taken_over_before_expiry(
    db_ctx: Context, frozen_clock: clock.FrozenClock
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Is anyone still there?", input_id="in-1")
    _, state, _ = await _dead_executor_mid_step(db_ctx, parts=1)
    await _executor(db_ctx).run()
    assert await db.scalar("SELECT count(*) FROM session_recovery") == 0  # alive as far as anyone knows
    await _record_stopped(db, workers.host_name())  # the owner ran on this host
    await _executor(db_ctx).run()  # the clock has not moved: the lease is still unexpired
    taken = json.loads(await db.scalar("SELECT data FROM event WHERE kind = 'execution.taken_over'"))
    assert taken["reason"] == "owner_stopped" and taken["from_owner"] == "executor-dead"
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await _violations(db) == []


async def test_a_stopped_owner_of_another_host_is_waited_out_until_its_lease_expires(
    db_ctx: Context, frozen_clock: clock.FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Is anyone still there?", input_id="in-1")
    _, state, _ = await _dead_executor_mid_step(db_ctx, parts=1)
    await _record_stopped(db, "host-a")
    monkeypatch.setenv("REM_HOST", "host-b")
    await _executor(db_ctx).run()  # host-b cannot see host-a's pids: the record alone is not enough
    assert await db.scalar("SELECT count(*) FROM event WHERE kind = 'execution.taken_over'") == 0
    assert await db.scalar("SELECT owner_id FROM session_execution") == "executor-dead"
    frozen_clock.advance(LEASE)
    await _executor(db_ctx).run()
    taken = json.loads(await db.scalar("SELECT data FROM event WHERE kind = 'execution.taken_over'"))
    assert taken["reason"] == "expired" and taken["from_owner"] == "executor-dead"
    assert await db.scalar("SELECT count(*) FROM session_execution") == 0
    assert await _violations(db) == []


@pytest.mark.sqlite_only  # SQLite's EXPLAIN QUERY PLAN
@pytest.mark.parametrize(
    ("sql", "index"),
    [
        (WAKE_SQL, "session_input_wake_pending_promoted_attempts_created_id_idx"),
        (recovery.RECOVERY_WAKE_SQL, "session_recovery_wake_pending_error_attempts_created_execution_idx"),
        (recovery.EXPIRED_SQL, "session_execution_expires_idx"),
        (recovery.ORPHANED_SQL, "worker_state_heartbeat_idx"),
        (recovery.ORPHANED_SQL, "session_execution_owner_idx"),
    ],
)
async def test_the_wake_scans_use_the_seed_indexes(db_ctx: Context, sql: str, index: str) -> None:
    db = await db_ctx.db()
    plan = await db.fetchall(f"EXPLAIN QUERY PLAN {sql}", {"limit": 10, "now": 0, "since": 0, "host": "h"})
    assert any(index in row[3] for row in plan), [row[3] for row in plan]
