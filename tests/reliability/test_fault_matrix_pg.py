"""The fault matrix on PostgreSQL: every fault point, SIGKILL there, restart, settle, `rem check --settled`.

The same cases as test_fault_matrix.py (on state.db), with the daemons and the
check on the test's PostgreSQL database (`rem --db URL daemon ...`). A file of
its own so the suite's workers (`--dist loadfile`) can run the two halves of
the matrix side by side: each is ~15 cases of 6 to 18 s. The four executor
points overlap test_execution_crash.py's PostgreSQL cases, which run
executors alone and check each recovery in detail; here all three daemons run
and the verdict is the operators' invariant checker, so they stay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.runtime.context import Context
from tests.reliability.test_fault_matrix import CASES, sigkill_at_the_point_then_check


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
@pytest.mark.parametrize("point", list(CASES))
async def test_sigkill_at_the_point_on_postgresql_then_rem_check_settled_passes(
    ctx: Context, chroma_url: str, tmp_path: Path, point: str
) -> None:
    assert ctx.db_url, "this half of the matrix runs on PostgreSQL"
    await sigkill_at_the_point_then_check(ctx, chroma_url, tmp_path, point)
