"""The tools family: an agent's tool calls, one durable row each (`tool_call`), invariant 10.

* No call both completed and running: a call not finished holds no result, a finished one
  holds one (a tool error, a denial and an operator's failure hold the text the model was
  told), and one step index has one row.
* Every result fenced: each row records the execution lease it last moved under (owner and
  epoch), and state.db's lease history agrees as far as it goes: the epoch was granted (the
  session's `lease_epoch` counter reached it), and while the execution still holds its lease
  at that epoch, the owner is the one holding it.
* No effect started twice without a person: an `effect` call's `starts` is at most one plus
  the operator's retries the hash-chained journal holds for it (`operator.resolve`, decision
  `retry`); the row's own `retries` is not trusted for this, the journal is.

Calls still open (pending, running) and calls waiting for a person (awaiting approval, an
unknown outcome) are unsettled: a settled system has none.
"""

from __future__ import annotations

from backend.ops.checks.family import Family
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn

INVARIANT = "10"
# every query reads the sessions (:lo, :hi] of one batch through tool_call_session_created_idx
SQL_RESULT_WHILE_OPEN = """
SELECT session_id, id AS call_id, tool, state, length(result) AS result_chars FROM tool_call
WHERE session_id > :lo AND session_id <= :hi
  AND state IN ('pending', 'awaiting_approval', 'running', 'unknown') AND result IS NOT NULL
"""
SQL_FINISHED_WITHOUT_RESULT = """
SELECT session_id, id AS call_id, tool, state FROM tool_call
WHERE session_id > :lo AND session_id <= :hi
  AND ((state = 'completed' AND result IS NULL)
       OR (state IN ('error', 'denied') AND result IS NULL AND reason IS NULL))
"""
SQL_TWO_ROWS_ONE_STEP_INDEX = """
SELECT session_id, execution_id, step, idx, group_concat(id) AS calls, count(*) AS rows FROM tool_call
WHERE session_id > :lo AND session_id <= :hi
GROUP BY session_id, execution_id, step, idx HAVING count(*) > 1
"""
# the epoch a row records must have been granted: the session's counter only grows
SQL_UNFENCED = """
SELECT c.session_id, c.id AS call_id, c.tool, c.state, c.owner_id, c.epoch,
       s.lease_epoch AS session_epoch, e.owner_id AS holder, e.epoch AS held_epoch
FROM tool_call AS c JOIN session AS s ON s.id = c.session_id
LEFT JOIN session_execution AS e ON e.id = c.execution_id
WHERE c.session_id > :lo AND c.session_id <= :hi
  AND (c.owner_id IS NULL OR c.epoch IS NULL OR c.epoch > s.lease_epoch OR c.epoch > e.epoch
       OR (c.epoch = e.epoch AND c.owner_id != e.owner_id))
"""
SQL_EFFECT_STARTED_TWICE = """
SELECT * FROM (
  SELECT c.session_id, c.id AS call_id, c.tool, c.state, c.starts, c.retries,
         (SELECT count(*) FROM event AS v
          WHERE v.session_id = c.session_id AND v.kind = 'operator.resolve' AND v.target = c.id
            AND json_extract(v.data, '$.decision') = 'retry') AS retries_journaled
  FROM tool_call AS c
  WHERE c.session_id > :lo AND c.session_id <= :hi AND c.effect = 'effect' AND c.starts > 1)
WHERE starts > 1 + retries_journaled
"""
SQL_OPEN = """
SELECT c.session_id, c.id AS call_id, c.tool, c.effect, c.state, c.owner_id, c.epoch, c.time_created
FROM tool_call AS c
WHERE c.session_id > :lo AND c.session_id <= :hi
  AND c.state IN ('pending', 'awaiting_approval', 'running', 'unknown')
"""

RESULT_WHILE_OPEN = "tool calls not finished that hold a result"
FINISHED_WITHOUT_RESULT = "finished tool calls without a result"
TWO_ROWS_ONE_STEP_INDEX = "two tool calls for one step index"
UNFENCED = "tool call results not fenced by a lease their execution held"
EFFECT_STARTED_TWICE = "effect tool calls started more often than the journal's retries allow"
WAITING = "tool calls waiting for an operator"
IN_FLIGHT = "tool calls in flight"


def check_tool_calls_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Invariant 10: no call both completed and running, every result fenced, no effect started twice."""
    report.mark("tool calls")
    batch = {"lo": lo, "hi": hi}
    wrong = report.violations
    report.add(wrong, INVARIANT, RESULT_WHILE_OPEN, rows_sync(conn, SQL_RESULT_WHILE_OPEN, batch))
    report.add(wrong, INVARIANT, FINISHED_WITHOUT_RESULT, rows_sync(conn, SQL_FINISHED_WITHOUT_RESULT, batch))
    report.add(wrong, INVARIANT, TWO_ROWS_ONE_STEP_INDEX, rows_sync(conn, SQL_TWO_ROWS_ONE_STEP_INDEX, batch))
    report.add(wrong, INVARIANT, UNFENCED, rows_sync(conn, SQL_UNFENCED, batch))
    report.add(wrong, INVARIANT, EFFECT_STARTED_TWICE, rows_sync(conn, SQL_EFFECT_STARTED_TWICE, batch))
    open_calls = rows_sync(conn, SQL_OPEN, batch)
    waiting = [r for r in open_calls if r["state"] in ("awaiting_approval", "unknown")]
    report.add(report.unsettled, INVARIANT, WAITING, waiting)
    report.add(report.unsettled, INVARIANT, IN_FLIGHT, [r for r in open_calls if r not in waiting])


FAMILY = Family(
    name="tools",
    findings=(
        RESULT_WHILE_OPEN,
        FINISHED_WITHOUT_RESULT,
        TWO_ROWS_ONE_STEP_INDEX,
        UNFENCED,
        EFFECT_STARTED_TWICE,
        WAITING,
        IN_FLIGHT,
    ),
    sessions=(check_tool_calls_sync,),
)
