"""The counters family: the counts rem keeps beside the rows they count.

A session's token totals equal the sum of its replies' usage (final replies and
the steps that asked for tools), and each
status counter (`backend/store/counters.py`) equals a real count of its rows.
"""

from __future__ import annotations

from backend.ops.checks.family import Family, Sweep
from backend.ops.checks.report import Report, rows_sync
from backend.store import counters
from backend.store.db import Conn

# -- usage: a reply's tokens are counted with it, exactly once ---------------
# (the sessions a model answered, from their partial index; each reply's usage is
# written in the same transaction as its completion, so the totals always agree).
# A step that asked for tools closes as `tool_calls`, its usage counted like a final
# reply's: both are summed (summing only `completed` failed every tool-using turn).
SQL_USAGE_MISMATCH = """
SELECT s.id AS session_id, s.tokens_input, s.tokens_output, s.tokens_reasoning, s.tokens_cache_read,
       s.tokens_cache_write, r.input, r.output, r.reasoning, r.cache_read, r.cache_write
FROM session AS s
JOIN (SELECT session_id,
             total(CAST(json_extract(data, '$.usage.input') AS DOUBLE PRECISION)) AS input,
             total(CAST(json_extract(data, '$.usage.output') AS DOUBLE PRECISION)) AS output,
             total(CAST(json_extract(data, '$.usage.reasoning') AS DOUBLE PRECISION)) AS reasoning,
             total(CAST(json_extract(data, '$.usage.cache_read') AS DOUBLE PRECISION)) AS cache_read,
             total(CAST(json_extract(data, '$.usage.cache_write') AS DOUBLE PRECISION)) AS cache_write
      FROM session_message
      WHERE session_id > :lo AND session_id <= :hi
        AND type = 'assistant' AND json_extract(data, '$.status') IN ('completed', 'tool_calls')
      GROUP BY session_id) AS r ON r.session_id = s.id
WHERE s.id > :lo AND s.id <= :hi AND (s.tokens_input > 0 OR s.tokens_output > 0 OR s.model_error IS NOT NULL)
  AND (s.tokens_input != r.input OR s.tokens_output != r.output OR s.tokens_reasoning != r.reasoning
       OR s.tokens_cache_read != r.cache_read OR s.tokens_cache_write != r.cache_write)
"""


def check_usage_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """The sessions `lo` < id <= `hi` (one batch; rows merged into the report's finding)."""
    report.mark("usage")
    report.add(
        report.violations,
        "usage",
        "session token totals that differ from the sum of their replies' usage",
        rows_sync(conn, SQL_USAGE_MISMATCH, {"lo": lo, "hi": hi}),
    )


# -- the status counters: each equals the count it keeps (backend/store/counters.py) --------


def check_counter_sync(conn: Conn, report: Report, counter: counters.Counter) -> None:
    """One counter against a real count of its rows, inside one read transaction (both agree)."""
    report.mark("counters")
    report.add(
        report.violations,
        "counters",
        "status counters that differ from a count of their rows (a write bypassed the triggers)",
        counters.drift_sync(conn, counter),
    )


FAMILY = Family(
    name="counters",
    findings=(
        "session token totals that differ from the sum of their replies' usage",
        "status counters that differ from a count of their rows (a write bypassed the triggers)",
    ),
    sessions=(check_usage_sync,),
    # each counter and its real count in one short read (a count walks an index of one table)
    sweeps=(Sweep("counters", lambda _conn: counters.COUNTERS, check_counter_sync),),
)
