"""The Dream family: Dream reaches the published input revision (invariant 2), and the keys it owns
on a summary row survive every other write to that row (invariant 4)."""

from __future__ import annotations

from typing import Any

from backend.chroma.ownership import summary_row_id
from backend.ops.checks.family import Family, Moment
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn


def check_dream_settled_sync(conn: Conn, report: Report, moment: Moment) -> None:
    """Invariant 2, Dream: every session's Dream state at its published input revision, once settled."""
    report.mark("progress")
    dream = rows_sync(
        conn,
        "SELECT session_id, input_revision, completed_revision, digest_state, "
        "digest_attempts, defer_reason FROM dream_state "
        "WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision",
    )
    report.add(report.unsettled, "2", "Dream not at the published input revision", dream)


DREAM_DONE_SQL = """
SELECT session_id, completed_revision, overlay_pending FROM dream_state
WHERE completed_revision IS NOT NULL AND session_id > :sid ORDER BY session_id LIMIT :n
"""


def _dream_keys_lost(settled: list[Any], live: dict[str, Any]) -> list[dict[str, Any]]:
    """The settled sessions whose Chroma summary row has a `dreamCompletedRevision` other than state.db's."""
    lost = []
    for r in settled:
        row = live.get(summary_row_id(r["session_id"]))
        stored = row.metadata.get("dreamCompletedRevision") if row else None
        if row is not None and stored != r["completed_revision"]:
            lost.append(
                {
                    "session_id": r["session_id"],
                    "expected": r["completed_revision"],
                    "chroma": stored,
                    "graphDigested": row.metadata.get("graphDigested"),
                }
            )
    return lost


async def check_dream_overlay(ctx: Any, db: Any, report: Report, batch: int = 500) -> None:
    """Invariant 4 against Chroma: `dreamCompletedRevision` on each summary row equals state.db's,
    wherever no overlay write is pending."""
    lost, pending, sid = [], [], ""
    while rows := await db.fetchall(DREAM_DONE_SQL, {"sid": sid, "n": batch}):
        sid = rows[-1]["session_id"]
        settled = [r for r in rows if not r["overlay_pending"]]
        pending += [{"session_id": r["session_id"]} for r in rows if r["overlay_pending"]]
        live = await ctx.store().get([summary_row_id(r["session_id"]) for r in settled])
        lost += _dream_keys_lost(settled, live)
    report.add(report.violations, "4", "Dream-owned keys lost or stale on the Chroma row", lost)
    report.add(report.unsettled, "4", "Dream overlays not written to Chroma yet", pending)


FAMILY = Family(
    name="dream",
    findings=(
        "Dream not at the published input revision",
        "Dream-owned keys lost or stale on the Chroma row",
        "Dream overlays not written to Chroma yet",
    ),
    state=(check_dream_settled_sync,),
    chroma=(check_dream_overlay,),
)
