"""The sessions phase's batches: the next `CHECK_BATCH_SESSIONS` sessions in id order, every
family's per-session checks over them, in the caller's one read transaction."""

from __future__ import annotations

from backend.ops.checks.registry import sessions_checks
from backend.ops.checks.report import Report
from backend.store.db import Conn

CHECK_BATCH_SESSIONS = 2_000
SQL_NEXT_BATCH = (
    "SELECT max(id) AS hi, count(*) AS n FROM (SELECT id FROM session WHERE id > :lo ORDER BY id LIMIT :n)"
)
SQL_NEXT_BATCH_UNTIL = (
    "SELECT max(id) AS hi, count(*) AS n FROM "
    "(SELECT id FROM session WHERE id > :lo AND id <= :until ORDER BY id LIMIT :n)"
)


def check_sessions_sync(
    conn: Conn, report: Report, lo: str, batch: int = CHECK_BATCH_SESSIONS, until: str | None = None
) -> tuple[str | None, int]:
    """Check the next `batch` sessions after `lo` (at most up to `until`), in the caller's read transaction.

    Returns the last session id checked (None: no session after `lo`) and how many.
    """
    if until is None:
        row = conn.execute(SQL_NEXT_BATCH, {"lo": lo, "n": batch}).fetchone()
    else:
        row = conn.execute(SQL_NEXT_BATCH_UNTIL, {"lo": lo, "until": until, "n": batch}).fetchone()
    hi, n = row["hi"], row["n"]
    if hi is None:
        return None, 0
    for check in sessions_checks():
        check(conn, report, lo, str(hi))
    return str(hi), int(n)
