"""The SIGKILL matrix's effect column (see test_tool_sigkill.py): an effect tool killed at each point
of its call's life is never started twice without an operator's retry, on SQLite and PostgreSQL; the
unknown outcomes the kills leave are resolved by `rem drill sigkill --tools`'s own operator.

Apart from the read and idempotent columns so the columns spread over the test workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.runtime.context import Context
from tests.reliability.test_tool_sigkill import sigkill_a_column


async def test_sigkill_at_each_point_of_an_effect(ctx: Context, tmp_path: Path) -> None:
    await sigkill_a_column(ctx, tmp_path, "effect")


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_sigkill_at_each_point_of_an_effect_on_postgresql(ctx: Context, tmp_path: Path) -> None:
    assert ctx.db_url
    await sigkill_a_column(ctx, tmp_path, "effect")
