"""The receipts family: summaries reach the current raw turns (invariant 2), every acknowledged
receipt matches its Chroma row (invariant 2), and no envelope is corrupt (invariant 5).

The Chroma side is a dry-run recovery pass (the same decode and
ownership-aware predicate the summarizer uses): it reads only.
"""

from __future__ import annotations

from typing import Any

from backend.core.errors import ReceiptNotFound
from backend.ops.checks.family import Family, Moment
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn


def check_summaries_settled_sync(conn: Conn, report: Report, moment: Moment) -> None:
    """Invariant 2, summaries: every session's summary at its current raw turns, once settled."""
    report.mark("progress")
    jobs = rows_sync(
        conn,
        "SELECT session_id, status, dirty_seq, clean_seq, attempts, last_error "
        "FROM summary_job WHERE status != 'completed' OR dirty_seq > clean_seq",
    )
    report.add(report.unsettled, "2", "summaries not at the current raw turns", jobs)


# how many times a receipt that differs from its row is looked at again, with its current receipt
RECEIPT_RECHECKS = 2


async def check_receipts(ctx: Any, db: Any, report: Report) -> None:
    """Invariants 2 and 5 against Chroma: a dry-run recovery pass over every staged receipt."""
    # import time: recovery's modules; the worker processes, which never read Chroma, start without them
    from backend.summaries.receipt_replay import ReplayOutcome

    rows = await _receipts_as_they_are(ctx, db)
    unacked = {
        r["session_id"]
        for r in await db.fetchall(
            "SELECT session_id FROM summary_job WHERE result_staged_at IS NOT NULL "
            "AND result_acknowledged_at IS NULL"
        )
    }
    differs = [r for r in rows if r["outcome"] == ReplayOutcome.WOULD_REPLAY]
    report.add(
        report.violations,
        "2",
        "acknowledged receipts whose Chroma row does not match",
        [r for r in differs if r["session_id"] not in unacked],
    )
    report.add(
        report.unsettled,
        "2",
        "staged receipts not acknowledged yet (recovery replays them)",
        [r for r in differs if r["session_id"] in unacked],
    )
    report.add(
        report.violations,
        "5",
        "corrupt receipt envelopes (quarantined for the operator)",
        [r for r in rows if r["outcome"] in (ReplayOutcome.QUARANTINED, ReplayOutcome.WOULD_QUARANTINE)],
    )
    report.add(
        report.unsettled,
        "2",
        "receipts leased by a running synthesis or replay",
        [r for r in rows if r["outcome"] == ReplayOutcome.SKIPPED_ACTIVE],
    )


async def _receipts_as_they_are(ctx: Any, db: Any) -> list[Any]:
    """The dry-run pass's rows, each receipt that differs looked at again with the session's current one."""
    # import time: recovery's modules, as above
    from backend.summaries.receipt_replay import Recovery, ReplayOutcome, all_batches, in_batches, named_jobs

    def dry_run() -> Recovery:
        return Recovery(db, ctx.store(), actor="rem check", dry_run=True)

    result = await dry_run().run(all_batches(db))
    rows = list(result.rows)
    # On a live system a synthesis can stage, write and acknowledge a newer summary between the
    # pass reading a receipt and reading its row: the row is then newer than the receipt it was
    # compared with, and that receipt is no longer the session's. Each receipt that differs is
    # compared again with the session's receipt as it is now; one that still differs is real.
    for _ in range(RECEIPT_RECHECKS):
        differing = {r["summary_id"] for r in rows if r["outcome"] == ReplayOutcome.WOULD_REPLAY}
        if not differing:
            break
        try:
            jobs = await named_jobs(db, sorted(differing))
        except ReceiptNotFound:  # a receipt gone meanwhile: keep what the first look found
            break
        again = await dry_run().run(in_batches(jobs))
        # the second look reports what is still wrong; a receipt its row now matches is not listed
        rows = [r for r in rows if r["summary_id"] not in differing] + list(again.rows)
    return rows


FAMILY = Family(
    name="receipts",
    findings=(
        "summaries not at the current raw turns",
        "acknowledged receipts whose Chroma row does not match",
        "staged receipts not acknowledged yet (recovery replays them)",
        "corrupt receipt envelopes (quarantined for the operator)",
        "receipts leased by a running synthesis or replay",
    ),
    state=(check_summaries_settled_sync,),
    chroma=(check_receipts,),
)
