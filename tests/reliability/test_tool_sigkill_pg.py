"""The SIGKILL matrix's read and idempotent columns on PostgreSQL (see test_tool_sigkill.py): a call
killed at each point of its life runs again with the same key, without an operator, and completes.

Apart from the SQLite columns so the columns spread over the test workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.runtime.context import Context
from tests.reliability.test_tool_sigkill import sigkill_a_column


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
@pytest.mark.parametrize("effect", ["read", "idempotent"])
async def test_sigkill_at_each_point_of_a_call_on_postgresql(
    ctx: Context, tmp_path: Path, effect: str
) -> None:
    assert ctx.db_url
    await sigkill_a_column(ctx, tmp_path, effect)
