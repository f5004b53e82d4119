"""Admission: `sessions.admit` and `ops.send` (idempotence, sequence, bad input writes nothing)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend import ops
from backend.core.datadir import DataDir
from backend.core.errors import BadInput
from backend.execution import sessions
from backend.runtime.context import Context

TABLES = ("session", "session_input", "session_message", "event")


async def _counts(ctx: Context) -> dict[str, Any]:
    db = await ctx.db()
    return {t: await db.scalar(f"SELECT count(*) FROM {t}") for t in TABLES}


async def test_admit_creates_the_session_and_draws_seqs_from_it(db_ctx: Context) -> None:
    db = await db_ctx.db()
    first = await sessions.admit(db, "s1", "hello", input_id="a1", now=100)
    second = await sessions.admit(db, "s1", "more", delivery="steer", input_id="a2", now=200)
    other = await sessions.admit(db, "s2", "elsewhere", now=300)
    assert first["session_created"] and not second["session_created"] and other["session_created"]
    assert (first["admitted_seq"], second["admitted_seq"], other["admitted_seq"]) == (1, 2, 1)
    rows = await db.fetchall(
        "SELECT id, delivery, admitted_seq, promoted_seq, wake_pending, wake_attempts, "
        "prompt FROM session_input WHERE session_id = 's1' ORDER BY admitted_seq"
    )
    assert [tuple(r)[:6] for r in rows] == [("a1", "queue", 1, None, 1, 0), ("a2", "steer", 2, None, 1, 0)]
    assert json.loads(rows[0]["prompt"]) == {"text": "hello"}
    session = await db.fetchone("SELECT last_seq, input_count, time_created FROM session WHERE id = 's1'")
    assert tuple(session) == (2, 2, 100)
    events = await db.fetchall(
        "SELECT kind, session_id, target FROM event WHERE kind = 'input.admitted' ORDER BY id"
    )
    assert [tuple(e) for e in events] == [
        ("input.admitted", "s1", "a1"),
        ("input.admitted", "s1", "a2"),
        ("input.admitted", "s2", other["input_id"]),
    ]


async def test_readmitting_the_same_id_is_idempotent(db_ctx: Context) -> None:
    db = await db_ctx.db()
    first = await sessions.admit(db, "s1", "hello", input_id="same-1")
    before = await _counts(db_ctx)
    again = await sessions.admit(db, "s1", "hello", input_id="same-1")
    assert again["duplicate"] and again["admitted_seq"] == first["admitted_seq"]
    assert await _counts(db_ctx) == before
    assert await db.scalar("SELECT last_seq FROM session WHERE id = 's1'") == 1


@pytest.mark.parametrize(
    "change",
    [
        {"text": "different"},
        {"delivery": "steer"},
        {"session_id": "s2"},
    ],
)
async def test_reusing_an_id_for_a_different_input_is_refused(
    db_ctx: Context, change: dict[str, str]
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "hello", input_id="dup")
    before = await _counts(db_ctx)
    args = {"session_id": "s1", "text": "hello", "delivery": "queue", **change}
    with pytest.raises(BadInput, match="already taken by an input of session .* use a new id"):
        await sessions.admit(db, args["session_id"], args["text"], delivery=args["delivery"], input_id="dup")
    assert await _counts(db_ctx) == before


BAD = [
    ({"delivery": "later"}, "unknown delivery 'later'"),
    ({"delivery": "Queue"}, "unknown delivery"),
    ({"text": ""}, "text is empty"),
    ({"text": " \n\t "}, "text is empty"),
    ({"text": "x" * (sessions.MAX_TEXT_BYTES + 1)}, "over the 262144 byte"),
    ({"text": "é" * (sessions.MAX_TEXT_BYTES // 2 + 1)}, "over the 262144 byte"),
    ({"input_id": "has space"}, "malformed input id"),
    ({"input_id": "recovery:exe_1"}, "malformed input id"),
    ({"input_id": "-leading-dash"}, "malformed input id"),
    ({"input_id": "x" * 101}, "malformed input id"),
    ({"input_id": ""}, "malformed input id"),
    ({"session_id": "a/b"}, "malformed session id"),
    ({"session_id": ""}, "malformed session id"),
]


@pytest.mark.parametrize(("change", "needle"), BAD, ids=[n for _, n in BAD])
async def test_bad_input_is_refused_and_writes_nothing(
    db_ctx: Context, change: dict[str, Any], needle: str
) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "baseline", input_id="ok-1")
    before = await _counts(db_ctx)
    args = {"session_id": "s1", "text": "hello", "delivery": "queue", "input_id": None, **change}
    with pytest.raises(BadInput, match=needle):
        await sessions.admit(
            db, args["session_id"], args["text"], delivery=args["delivery"], input_id=args["input_id"]
        )
    assert await _counts(db_ctx) == before


async def test_the_size_limit_is_inclusive(db_ctx: Context) -> None:
    db = await db_ctx.db()
    result = await sessions.admit(db, "s1", "y" * sessions.MAX_TEXT_BYTES)
    assert result["admitted_seq"] == 1


async def test_an_id_that_already_names_a_message_is_refused(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "hello")
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session_message (id, session_id, type, seq, time_created, "
            "time_updated, data) VALUES ('taken', 's1', 'assistant', 99, 1, 1, '{}')"
        )
    with pytest.raises(BadInput, match="already names a message"):
        await sessions.admit(db, "s1", "hello", input_id="taken")


async def test_send_with_bad_input_does_not_even_create_the_data_dir(data_dir: DataDir) -> None:
    ctx = Context(data_dir, start_chroma=False)
    with pytest.raises(BadInput):
        await ops.send(ctx, "s1", "", delivery="queue")
    assert not data_dir.root.exists()
    result = await ops.send(ctx, "s1", "hi", delivery="steer", input_id="i-1")
    await ctx.close()
    assert result["input_id"] == "i-1" and result["delivery"] == "steer"
    assert data_dir.state_db.is_file()


async def test_send_refuses_a_read_only_context(db_ctx: Context) -> None:
    from backend.core.errors import ReadOnly

    ro = Context(db_ctx.data, read_only=True, start_chroma=False)
    with pytest.raises(ReadOnly, match="send"):
        await ops.send(ro, "s1", "hi")
    await ro.close()
