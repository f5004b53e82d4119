"""The execution family: admitted inputs, the replies that answer them, the executions in flight.

Invariant 1 (every admitted input promoted exactly once, no sequence number
used twice), invariant 3 (a write after a lost lease changes nothing: one
completed reply per step, one answer per input) and the executions part of
invariant 2 (executions and recoveries still in progress).
"""

from __future__ import annotations

from backend.ops.checks.family import Family, Moment
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn

# -- invariant 1: every admitted input promoted exactly once, no seq collision --
# Every query below reads the sessions of one batch, (:lo, :hi] in id order, through the
# session_id-leading index of each table it touches.
SQL_PROMOTED_WITHOUT_MESSAGE = """
SELECT i.session_id, i.id AS input_id, i.promoted_seq FROM session_input AS i
LEFT JOIN session_message AS m ON m.id = i.id
WHERE i.session_id > :lo AND i.session_id <= :hi AND i.promoted_seq IS NOT NULL
  AND (m.id IS NULL OR m.type != 'user' OR m.seq != i.promoted_seq OR m.session_id != i.session_id)
"""
SQL_USER_WITHOUT_INPUT = """
SELECT m.session_id, m.id AS message_id, m.seq FROM session_message AS m
LEFT JOIN session_input AS i ON i.id = m.id
WHERE m.session_id > :lo AND m.session_id <= :hi AND m.type = 'user'
  AND (i.id IS NULL OR i.promoted_seq IS NULL)
  AND json_extract(m.data, '$.imported') IS NULL
"""
# each session's highest seq in use, from three index seeks (never a scan of its rows)
SQL_SEQ_AHEAD_OF_SEQUENCE = """
SELECT * FROM (
  SELECT s.id AS session_id, s.last_seq,
         max(coalesce((SELECT max(seq) FROM session_message WHERE session_id = s.id), 0),
             coalesce((SELECT max(admitted_seq) FROM session_input WHERE session_id = s.id), 0),
             coalesce((SELECT max(promoted_seq) FROM session_input WHERE session_id = s.id), 0)) AS max_seq
  FROM session AS s WHERE s.id > :lo AND s.id <= :hi)
WHERE max_seq > last_seq
"""
SQL_SEQ_SHARED = """
SELECT session_id, seq, count(*) AS users FROM (
  SELECT session_id, admitted_seq AS seq FROM session_input WHERE session_id > :lo AND session_id <= :hi
  UNION ALL SELECT session_id, promoted_seq FROM session_input
            WHERE session_id > :lo AND session_id <= :hi AND promoted_seq IS NOT NULL
  UNION ALL SELECT session_id, seq FROM session_message
            WHERE session_id > :lo AND session_id <= :hi AND type != 'user')
GROUP BY session_id, seq HAVING count(*) > 1
"""
SQL_UNPROMOTED = """
SELECT i.session_id, i.id AS input_id, i.wake_pending, i.wake_attempts, i.time_created,
       e.id AS execution_id FROM session_input AS i
LEFT JOIN session_execution AS e ON e.session_id = i.session_id
WHERE i.session_id > :lo AND i.session_id <= :hi AND i.promoted_seq IS NULL
"""


def check_inputs_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Invariant 1: every admitted input promoted exactly once, no sequence number used twice."""
    report.mark("inputs")
    batch = {"lo": lo, "hi": hi}
    report.add(
        report.violations,
        "1",
        "promoted inputs whose user message is missing or wrong",
        rows_sync(conn, SQL_PROMOTED_WITHOUT_MESSAGE, batch),
    )
    report.add(
        report.violations,
        "1",
        "user messages that no admitted input produced",
        rows_sync(conn, SQL_USER_WITHOUT_INPUT, batch),
    )
    report.add(
        report.violations,
        "1",
        "sequence numbers ahead of their session's sequence",
        rows_sync(conn, SQL_SEQ_AHEAD_OF_SEQUENCE, batch),
    )
    report.add(
        report.violations,
        "1",
        "one sequence number used twice in a session",
        rows_sync(conn, SQL_SEQ_SHARED, batch),
    )
    unpromoted = rows_sync(conn, SQL_UNPROMOTED, batch)
    stranded = [r for r in unpromoted if not r["wake_pending"] and r["execution_id"] is None]
    report.add(
        report.violations, "1", "admitted inputs nobody will wake (wake_pending=0, no execution)", stranded
    )
    report.add(
        report.unsettled,
        "1",
        "admitted inputs not promoted yet",
        [r for r in unpromoted if r not in stranded],
    )


# -- invariant 3: a write after a lost lease changes nothing ----------------
# one reply per step: a steer adds a step (and a reply) to the running execution
SQL_DOUBLE_REPLY = """
SELECT json_extract(data, '$.execution_id') AS execution_id, CAST(json_extract(data, '$.step') AS BIGINT) AS step,
       group_concat(id) AS messages, count(*) AS replies
FROM session_message
WHERE session_id > :lo AND session_id <= :hi AND type = 'assistant'
  AND json_extract(data, '$.status') = 'completed' AND json_extract(data, '$.execution_id') IS NOT NULL
GROUP BY 1, 2 HAVING count(*) > 1
"""
# rows still streaming: few, found through the partial index of open assistant rows
SQL_OPEN_ASSISTANTS = """
SELECT session_id, id AS message_id, seq, json_extract(data, '$.execution_id') AS execution_id,
       CAST(json_extract(data, '$.step') AS BIGINT) AS step, json_extract(data, '$.status') AS status
FROM session_message INDEXED BY session_message_open_assistant_idx
WHERE session_id > :lo AND session_id <= :hi
  AND type = 'assistant' AND json_extract(data, '$.status') = 'streaming'
"""
# exactly-once replies: the inputs a completed (or failed) reply answers, counted once per
# batch; the inputs answered twice, and the promoted (user) messages nobody answered
SQL_ANSWERS = """
WITH answered AS MATERIALIZED (
  SELECT m.session_id, j.value AS input_id, count(*) AS replies, group_concat(m.id) AS messages
  FROM session_message AS m, json_each(m.data, '$.answers') AS j
  WHERE m.session_id > :lo AND m.session_id <= :hi
    AND m.type = 'assistant' AND json_extract(m.data, '$.status') IN ('completed', 'error')
  GROUP BY m.session_id, j.value)
SELECT 'twice' AS finding, session_id, input_id, replies, messages, NULL AS seq, NULL AS execution_id
FROM answered WHERE replies > 1
UNION ALL
SELECT 'unanswered', u.session_id, u.id, NULL, NULL, u.seq, e.id
FROM session_message AS u
LEFT JOIN answered AS a ON a.session_id = u.session_id AND a.input_id = u.id
LEFT JOIN session_execution AS e ON e.session_id = u.session_id
WHERE u.session_id > :lo AND u.session_id <= :hi AND u.type = 'user' AND a.input_id IS NULL
  -- imported conversations (`rem import`) were never inputs: no reply is owed
  AND json_extract(u.data, '$.imported') IS NULL
"""
SQL_DOUBLE_CONTINUATION = """
SELECT session_id, json_extract(data, '$.execution_id') AS execution_id, count(*) AS continuations
FROM session_message
WHERE session_id > :lo AND session_id <= :hi
  AND type = 'synthetic' AND json_extract(data, '$.execution_id') IS NOT NULL
GROUP BY session_id, execution_id HAVING count(*) > 1
"""
SQL_LIVE_EXECUTIONS = "SELECT id FROM session_execution WHERE session_id > :lo AND session_id <= :hi"


def check_projection_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Invariant 3: one completed reply per step, one continuation per execution, no row left streaming."""
    report.mark("projection")
    batch = {"lo": lo, "hi": hi}
    report.add(
        report.violations,
        "3",
        "executions that published more than one completed reply",
        [
            {"execution_id": r["execution_id"], "step": r["step"], "messages": r["messages"].split(",")}
            for r in rows_sync(conn, SQL_DOUBLE_REPLY, batch)
        ],
    )
    live = {r["id"] for r in conn.execute(SQL_LIVE_EXECUTIONS, batch).fetchall()}
    open_rows = rows_sync(conn, SQL_OPEN_ASSISTANTS, batch)
    report.add(
        report.unsettled,
        "3",
        "assistant rows still streaming under a live execution",
        [r for r in open_rows if r["execution_id"] in live],
    )
    report.add(
        report.unsettled,
        "3",
        "stale assistant rows not closed yet (their execution is gone)",
        [r for r in open_rows if r["execution_id"] not in live],
    )
    report.add(
        report.violations,
        "3",
        "more than one continuation message for one execution",
        rows_sync(conn, SQL_DOUBLE_CONTINUATION, batch),
    )


def check_answers_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Exactly-once replies: no input answered twice, and every promoted input answered or about to be."""
    report.mark("projection")
    answers = rows_sync(conn, SQL_ANSWERS, {"lo": lo, "hi": hi})
    report.add(
        report.violations,
        "3",
        "inputs answered by more than one reply (a late write landed)",
        [
            {k: r[k] for k in ("session_id", "input_id", "replies", "messages")}
            for r in answers
            if r["finding"] == "twice"
        ],
    )
    unanswered = [
        {k: r[k] for k in ("session_id", "input_id", "seq", "execution_id")}
        for r in answers
        if r["finding"] == "unanswered"
    ]
    report.add(
        report.unsettled,
        "2",
        "promoted inputs not answered yet",
        [r for r in unanswered if r["execution_id"] is not None],
    )
    report.add(
        report.violations,
        "2",
        "promoted inputs no reply answers and no execution will",
        [r for r in unanswered if r["execution_id"] is None],
    )


# -- invariant 2: after settling, everything reaches its current state -------


def check_executions_settled_sync(conn: Conn, report: Report, moment: Moment) -> None:
    """Invariant 2, executions: none in progress and no recovery waiting, once the system settled."""
    report.mark("progress")
    executions = rows_sync(
        conn,
        "SELECT id AS execution_id, session_id, owner_id, epoch, phase, expires_at FROM session_execution",
    )
    report.add(report.unsettled, "2", "executions in progress or awaiting takeover", executions)
    recoveries = rows_sync(
        conn,
        "SELECT execution_id, session_id, phase, wake_attempts, recovery_error "
        "FROM session_recovery WHERE wake_pending = 1 OR recovery_error IS NOT NULL",
    )
    report.add(
        report.unsettled, "2", "recoveries waiting", [r for r in recoveries if r["recovery_error"] is None]
    )
    report.add(
        report.unsettled,
        "2",
        "recoveries parked for the operator (attempt budget spent)",
        [r for r in recoveries if r["recovery_error"] is not None],
    )


FAMILY = Family(
    name="execution",
    findings=(
        "promoted inputs whose user message is missing or wrong",
        "user messages that no admitted input produced",
        "sequence numbers ahead of their session's sequence",
        "one sequence number used twice in a session",
        "admitted inputs nobody will wake (wake_pending=0, no execution)",
        "admitted inputs not promoted yet",
        "executions that published more than one completed reply",
        "assistant rows still streaming under a live execution",
        "stale assistant rows not closed yet (their execution is gone)",
        "more than one continuation message for one execution",
        "inputs answered by more than one reply (a late write landed)",
        "promoted inputs not answered yet",
        "promoted inputs no reply answers and no execution will",
        "executions in progress or awaiting takeover",
        "recoveries waiting",
        "recoveries parked for the operator (attempt budget spent)",
    ),
    sessions=(check_inputs_sync, check_projection_sync, check_answers_sync),
    state=(check_executions_settled_sync,),
)
