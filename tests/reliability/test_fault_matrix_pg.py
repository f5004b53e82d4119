"""The fault matrix on PostgreSQL: every fault point, SIGKILL there, restart, settle, `rem check --settled`.

The same cases as test_fault_matrix.py (on state.db), with the daemons and the
check on the test's PostgreSQL database (`rem --db URL daemon ...`). A file of
its own so the suite's workers (`--dist loadfile`) can run the two halves of
the matrix side by side: each is ~15 cases of 6 to 18 s. The four executor
points overlap test_execution_crash.py's PostgreSQL cases, which run
executors alone and check each recovery in detail; here all three daemons run
and the verdict is the operators' invariant checker, so they stay.

Three cases also run on PostgreSQL 15 (tests/pg.py OLDEST_TESTED: a lean set, not the
matrix twice): one per daemon, each a takeover or a replay end to end (claims with
`FOR UPDATE SKIP LOCKED`, fenced writes, receipts, Dream's graph and recall rows), then
`rem check --settled` on 15.
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


OLDEST_CASES = ["executor.mid_stream", "summarizer.after_chroma_write", "index.mid_rows"]


@pytest.mark.parametrize("store", ["postgres15"], indirect=True)
@pytest.mark.parametrize("point", OLDEST_CASES)
async def test_sigkill_at_the_point_on_postgresql_15_then_rem_check_settled_passes(
    ctx: Context, chroma_url: str, tmp_path: Path, point: str
) -> None:
    assert ctx.db_url and point in CASES
    await sigkill_at_the_point_then_check(ctx, chroma_url, tmp_path, point)
