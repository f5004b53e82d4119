"""SIGKILL a real `rem daemon --role summarizer` at every step of a synthesis, then restart it.

Every session must end completed with a receipt matching its Chroma row, and
the model (a counting synthesizer, the only fake) must not be called again
for any session whose output was already durable when the process died.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.core import clock
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from backend.store.revision import raw_revision
from backend.summaries import receipts
from tests.counting_synthesizer import calls_in
from tests.helpers import await_until, rem_env, run_rem
from tests.summaries import all_jobs, row_id, seed_session

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ["s1", "s2", "s3"]
# where the second session's synthesis stands when the process dies at each point
STATE_AT_DEATH = {
    "summarizer.after_synthesis": ("not staged", False),
    "summarizer.after_receipt": ("staged", False),
    "summarizer.before_chroma_write": ("staged", False),
    "summarizer.after_chroma_write": ("staged", True),
    "summarizer.before_acknowledge": ("staged", True),
    "summarizer.after_acknowledge": ("acknowledged", True),
}


def _daemon(data: DataDir, chroma_url: str, collection: str, count_file: Path, faults: str = "") -> int:
    env = rem_env(
        REM_SYNTHESIZER="tests.counting_synthesizer:factory",
        REM_SYNTH_COUNT_FILE=str(count_file),
        REM_SUMMARY_LEASE_MS="1500",
        REM_CHROMA_COLLECTION=collection,
        PYTHONPATH=str(ROOT),
    )
    if faults:
        env["REM_FAULTS"] = faults
    proc = run_rem(
        "daemon",
        "--role",
        "summarizer",
        "--once",
        "--data",
        str(data.root),
        "--chroma-url",
        chroma_url,
        env=env,
    )
    assert proc.returncode in (0, -9), proc.stderr
    return proc.returncode


@pytest.mark.parametrize("point", list(STATE_AT_DEATH))
async def test_sigkill_at_each_step_recovers_without_the_model(
    ctx: Context, chroma_url: str, collection: str, tmp_path: Path, point: str
) -> None:
    db = await ctx.db()
    for sid in SESSIONS:
        await seed_session(db, sid)
    count_file = tmp_path / "synth-calls"

    rc = await asyncio.to_thread(_daemon, ctx.data, chroma_url, collection, count_file, f"{point}@2")

    assert rc == -9, "the fault point did not kill the summarizer"
    staged, written = STATE_AT_DEATH[point]
    s2 = {j["session_id"]: j for j in await all_jobs(db)}["s2"]
    assert (s2["result_envelope"] is not None) == (staged != "not staged")
    assert (s2["result_acknowledged_at"] is not None) == (staged == "acknowledged")
    assert (row_id("s2") in await ctx.store().get([row_id("s2")])) == written
    assert calls_in(str(count_file)) == {"s1": 1, "s2": 1}

    leases = [j["lease_expires_at"] for j in await all_jobs(db) if j["lease_expires_at"]]
    await await_until(lambda: _after(max(leases, default=0)), timeout=10, message="the dead lease to expire")
    rc = await asyncio.to_thread(_daemon, ctx.data, chroma_url, collection, count_file)
    assert rc == 0

    expected_calls = {"s1": 1, "s2": 2 if staged == "not staged" else 1, "s3": 1}
    assert calls_in(str(count_file)) == expected_calls
    chroma = await ctx.store().get([row_id(s) for s in SESSIONS])
    for j in await all_jobs(db):
        sid = j["session_id"]
        receipt = receipts.decode(j["result_envelope"], j["result_encoding"])
        async with db.snapshot() as conn:
            revision, _ = await raw_revision(conn, sid)
        assert (j["status"], j["verdict"], j["owner_id"]) == ("completed", "present", None), sid
        assert receipts.is_present(receipt, chroma.get(row_id(sid))), sid
        assert receipt.revision == j["summarized_revision"] == revision
        assert (
            await db.scalar("SELECT input_revision FROM dream_state WHERE session_id = ?", (sid,)) == revision
        )


async def _after(ms: int) -> bool:
    return clock.now_ms() > ms
