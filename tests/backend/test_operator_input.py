"""What an operator hands `backend.ops` is bounded before anything is journaled: a 3 MB id, a control
character in an id, a 1 MB reason are refused in one line with nothing written (a refused decision on
a 3 MB call id left a permanent 6 MB operator event), and a refusal that is journaled never holds
more than a bounded target and reason, whatever the door (the CLI, the console, rem mcp, the API)."""

from __future__ import annotations

import pytest

from backend import ops
from backend.core.errors import BadInput, NotFound
from backend.ops.operator_input import ID_MAX, JOURNAL_TEXT_MAX
from backend.runtime.context import Context

pytestmark = pytest.mark.both_stores

HUGE = "call_" + "x" * (3 << 20)


async def test_huge_or_hostile_ids_and_reasons_are_refused_before_the_journal(db_ctx: Context) -> None:
    db = await db_ctx.db()
    before = await db.scalar("SELECT count(*) FROM event")
    attempts = [
        ops.approve(db_ctx, HUGE),
        ops.deny(db_ctx, HUGE, "no"),
        ops.resolve(db_ctx, HUGE, "fail", "no"),
        ops.deny(db_ctx, "call_0123456789abcdef", "because " * 200_000),
        ops.approve(db_ctx, "call_\x1b]0;pwned\x07"),
        ops.release(db_ctx, HUGE),
        ops.drain(db_ctx, HUGE),
        ops.resume(db_ctx, [HUGE]),
        ops.replay(db_ctx, [HUGE]),
    ]
    for attempt in attempts:
        with pytest.raises(BadInput) as refused:
            await attempt
        assert len(str(refused.value)) < 300 and "\n" not in str(refused.value), str(refused.value)[:300]
    assert await db.scalar("SELECT count(*) FROM event") == before  # nothing journaled, not even a refusal

    # a well-formed id that names nothing is refused and journaled as before, bounded
    with pytest.raises(NotFound):
        await ops.approve(db_ctx, "call_" + "y" * (ID_MAX - 5))
    many = [f"s-{i:03d}-" + "z" * 150 for i in range(40)]  # 40 ids of 156 characters: 6 KB joined
    with pytest.raises(NotFound):
        await ops.resume(db_ctx, many)
    rows = await db.fetchall("SELECT target, data FROM event WHERE kind = 'operator.refused' ORDER BY id")
    assert [len(r[0]) for r in rows] == [ID_MAX, JOURNAL_TEXT_MAX]
    assert all(len(r[1]) < 3 * JOURNAL_TEXT_MAX for r in rows), [len(r[1]) for r in rows]
