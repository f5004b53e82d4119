"""`rem check` catches each invariant violation it claims to, and passes clean data."""

from __future__ import annotations

import json

import pytest

from backend import ops
from backend.runtime.context import Context

# every operator action and invariant below runs on state.db and on PostgreSQL
pytestmark = pytest.mark.both_stores


async def _exec(ctx: Context, *statements: tuple[str, tuple]) -> None:  # type: ignore[type-arg]
    db = await ctx.db()
    async with db.tx() as conn:
        for sql, params in statements:
            await conn.execute(sql, params)


def _msg(mid: str, seq: int, kind: str, data: dict) -> tuple[str, tuple]:  # type: ignore[type-arg]
    return (
        "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
        "VALUES (?, 's1', ?, ?, ?, ?, ?)",
        (mid, kind, seq, seq, seq, json.dumps(data)),
    )


def _input(iid: str, admitted: int, promoted: int | None, wake: int = 0) -> tuple[str, tuple]:  # type: ignore[type-arg]
    return (
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, promoted_seq, "
        "wake_pending, time_created) VALUES (?, 's1', '{}', 'queue', ?, ?, ?, 1)",
        (iid, admitted, promoted, wake),
    )


SESSION = ("INSERT INTO session (id, last_seq, time_created, time_updated) VALUES ('s1', 10, 1, 1)", ())


async def _clean_turn(ctx: Context) -> None:
    await _exec(
        ctx,
        SESSION,
        _input("u1", 1, 2),
        _msg("u1", 2, "user", {"text": "hi"}),
        _msg(
            "a1",
            3,
            "assistant",
            {"text": "hello", "status": "completed", "execution_id": "e1", "step": 1, "answers": ["u1"]},
        ),
    )


def _whats(result: dict) -> list[str]:  # type: ignore[type-arg]
    return [f["what"] for f in result["violations"]]


async def test_clean_data_passes_even_settled(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    result = await ops.check(db_ctx, settled=True)
    assert result["ok"], result
    assert result["counts"] == {"violations": 0, "unsettled": 0}


async def test_promoted_input_without_its_message(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(db_ctx, _input("u2", 4, 5))
    result = await ops.check(db_ctx)
    assert not result["ok"]
    assert "promoted inputs whose user message is missing or wrong" in _whats(result)


async def test_user_message_nobody_admitted(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(db_ctx, _msg("u9", 4, "user", {"text": "forged"}))
    assert "user messages that no admitted input produced" in _whats(await ops.check(db_ctx))


async def test_reply_published_twice(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(
        db_ctx,
        _msg("a2", 4, "assistant", {"text": "again", "status": "completed", "execution_id": "e1", "step": 1}),
    )
    assert "executions that published more than one completed reply" in _whats(await ops.check(db_ctx))


async def test_input_answered_twice(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(
        db_ctx,
        _msg(
            "a2",
            4,
            "assistant",
            {"text": "late", "status": "completed", "execution_id": "e1", "step": 2, "answers": ["u1"]},
        ),
    )
    assert "inputs answered by more than one reply (a late write landed)" in _whats(await ops.check(db_ctx))


async def test_promoted_input_never_answered(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(db_ctx, _input("u2", 4, 5), _msg("u2", 5, "user", {"text": "anyone?"}))
    assert "promoted inputs no reply answers and no execution will" in _whats(await ops.check(db_ctx))


async def test_sequence_reuse_and_overrun(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(
        db_ctx,
        _msg("a3", 1, "assistant", {"text": "x", "status": "completed", "execution_id": "e3"}),
        _msg("a4", 11, "assistant", {"text": "y", "status": "completed", "execution_id": "e4"}),
    )
    whats = _whats(await ops.check(db_ctx))
    assert "one sequence number used twice in a session" in whats
    assert "sequence numbers ahead of their session's sequence" in whats


async def test_stranded_input_is_a_violation_and_pending_one_is_in_flight(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(db_ctx, _input("u3", 6, None, wake=0), _input("u4", 7, None, wake=1))
    result = await ops.check(db_ctx)
    assert "admitted inputs nobody will wake (wake_pending=0, no execution)" in _whats(result)
    (in_flight,) = [f for f in result["unsettled"] if f["what"] == "admitted inputs not promoted yet"]
    assert [r["input_id"] for r in in_flight["rows"]] == ["u4"]


async def test_settled_mode_turns_in_flight_work_into_violations(db_ctx: Context) -> None:
    await _clean_turn(db_ctx)
    await _exec(
        db_ctx,
        (
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, "
            "time_created, time_renewed, expires_at) VALUES ('e9','s1','o',1,'safe',1,1,1)",
            (),
        ),
    )
    relaxed = await ops.check(db_ctx)
    assert relaxed["ok"] and relaxed["counts"]["unsettled"] == 1
    strict = await ops.check(db_ctx, settled=True)
    assert not strict["ok"]
    assert strict["violations"][0]["what"].startswith("not settled: executions")
