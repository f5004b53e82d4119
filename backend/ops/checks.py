"""`rem check`: verify the invariants of DESIGN section 5 on a live data dir.

Findings come in two kinds:

* **violations**: wrong whatever the timing (an input promoted twice, a
  completed reply published twice, a receipt that does not match its Chroma
  row while nobody holds its lease, Dream-owned metadata deleted).
* **unsettled**: work still in flight (a lease held, an input not promoted
  yet, a Dream revision pending). Normal on a busy system; with
  `settled=True` (what the drills use once load has stopped) each one is a
  violation too, because a settled system has none.

The state.db part runs in one read transaction; the Chroma part reads the
summary rows in batches and compares them with the receipts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core import clock
from backend.store.db import Conn
from backend.store.events import verify_operator_chain_sync

ROW_CAP = 20  # rows listed per finding; counts are always complete


@dataclass(kw_only=True)
class Finding:
    invariant: str
    what: str
    rows: Sequence[Mapping[str, Any]] = field(default_factory=list)
    count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "what": self.what,
            "count": self.count,
            "rows": self.rows[:ROW_CAP],
        }


@dataclass
class Report:
    violations: list[Finding] = field(default_factory=list)
    unsettled: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def add(
        self, bucket: list[Finding], invariant: str, what: str, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        if rows:
            bucket.append(Finding(invariant=invariant, what=what, rows=rows[:ROW_CAP], count=len(rows)))


def _rows_sync(conn: Conn, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    cursor.row_factory = None
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


# -- invariant 0: the database itself ---------------------------------------
def check_structure_sync(conn: Conn, report: Report) -> None:
    report.checked.append("structure")
    problems = [
        r["quick_check"] for r in conn.execute("PRAGMA quick_check").fetchall() if r["quick_check"] != "ok"
    ]
    report.add(
        report.violations,
        "structure",
        "state.db fails PRAGMA quick_check",
        [{"problem": p} for p in problems],
    )
    orphans = _rows_sync(conn, "PRAGMA foreign_key_check")
    report.add(report.violations, "structure", "rows whose foreign key points at nothing", orphans)


# -- invariant 1: every admitted input promoted exactly once, no seq collision --
SQL_PROMOTED_WITHOUT_MESSAGE = """
SELECT i.session_id, i.id AS input_id, i.promoted_seq FROM session_input AS i
LEFT JOIN session_message AS m ON m.id = i.id
WHERE i.promoted_seq IS NOT NULL
  AND (m.id IS NULL OR m.type != 'user' OR m.seq != i.promoted_seq OR m.session_id != i.session_id)
"""
SQL_USER_WITHOUT_INPUT = """
SELECT m.session_id, m.id AS message_id, m.seq FROM session_message AS m
LEFT JOIN session_input AS i ON i.id = m.id
WHERE m.type = 'user' AND (i.id IS NULL OR i.promoted_seq IS NULL)
"""
SQL_SEQ_AHEAD_OF_SEQUENCE = """
SELECT s.id AS session_id, s.last_seq, max(x.seq) AS max_seq FROM session AS s
JOIN (SELECT session_id, seq FROM session_message
      UNION ALL SELECT session_id, admitted_seq FROM session_input
      UNION ALL SELECT session_id, promoted_seq FROM session_input WHERE promoted_seq IS NOT NULL) AS x
  ON x.session_id = s.id
GROUP BY s.id HAVING max(x.seq) > s.last_seq
"""
SQL_SEQ_SHARED = """
SELECT session_id, seq, count(*) AS users FROM (
  SELECT session_id, admitted_seq AS seq FROM session_input
  UNION ALL SELECT session_id, promoted_seq FROM session_input WHERE promoted_seq IS NOT NULL
  UNION ALL SELECT session_id, seq FROM session_message WHERE type != 'user')
GROUP BY session_id, seq HAVING count(*) > 1
"""
SQL_UNPROMOTED = """
SELECT i.session_id, i.id AS input_id, i.wake_pending, i.wake_attempts, i.time_created,
       e.id AS execution_id FROM session_input AS i
LEFT JOIN session_execution AS e ON e.session_id = i.session_id
WHERE i.promoted_seq IS NULL
"""


def check_inputs_sync(conn: Conn, report: Report) -> None:
    report.checked.append("inputs")
    report.add(
        report.violations,
        "1",
        "promoted inputs whose user message is missing or wrong",
        _rows_sync(conn, SQL_PROMOTED_WITHOUT_MESSAGE),
    )
    report.add(
        report.violations,
        "1",
        "user messages that no admitted input produced",
        _rows_sync(conn, SQL_USER_WITHOUT_INPUT),
    )
    report.add(
        report.violations,
        "1",
        "sequence numbers ahead of their session's sequence",
        _rows_sync(conn, SQL_SEQ_AHEAD_OF_SEQUENCE),
    )
    report.add(
        report.violations,
        "1",
        "one sequence number used twice in a session",
        _rows_sync(conn, SQL_SEQ_SHARED),
    )
    unpromoted = _rows_sync(conn, SQL_UNPROMOTED)
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
SQL_ASSISTANTS = """
SELECT session_id, id AS message_id, seq, json_extract(data, '$.execution_id') AS execution_id,
       json_extract(data, '$.step') AS step,
       json_extract(data, '$.status') AS status FROM session_message WHERE type = 'assistant'
"""
# exactly-once replies: every input a completed (or failed) reply answers, counted
SQL_ANSWER_COUNTS = """
SELECT m.session_id, j.value AS input_id, count(*) AS replies,
       group_concat(m.id) AS messages
FROM session_message AS m, json_each(m.data, '$.answers') AS j
WHERE m.type = 'assistant' AND json_extract(m.data, '$.status') IN ('completed', 'error')
GROUP BY m.session_id, j.value
"""
SQL_DOUBLE_CONTINUATION = """
SELECT session_id, json_extract(data, '$.execution_id') AS execution_id, count(*) AS continuations
FROM session_message WHERE type = 'synthetic' AND json_extract(data, '$.execution_id') IS NOT NULL
GROUP BY session_id, execution_id HAVING count(*) > 1
"""


def check_projection_sync(conn: Conn, report: Report) -> None:
    report.checked.append("projection")
    assistants = _rows_sync(conn, SQL_ASSISTANTS)
    live = {r["id"] for r in conn.execute("SELECT id FROM session_execution").fetchall()}
    completed: dict[Any, list[dict[str, Any]]] = {}
    for row in assistants:
        # one reply per step: a steer adds a step (and a reply) to the running execution
        if row["status"] == "completed" and row["execution_id"] is not None:
            completed.setdefault((row["execution_id"], row["step"]), []).append(row)
    report.add(
        report.violations,
        "3",
        "executions that published more than one completed reply",
        [
            {"execution_id": k[0], "step": k[1], "messages": [r["message_id"] for r in v]}
            for k, v in completed.items()
            if len(v) > 1
        ],
    )
    open_rows = [r for r in assistants if r["status"] == "streaming"]
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
        _rows_sync(conn, SQL_DOUBLE_CONTINUATION),
    )
    counts = _rows_sync(conn, SQL_ANSWER_COUNTS)
    report.add(
        report.violations,
        "3",
        "inputs answered by more than one reply (a late write landed)",
        [r for r in counts if r["replies"] > 1],
    )
    answered = {r["input_id"] for r in counts}
    users = _rows_sync(
        conn,
        "SELECT m.session_id, m.id AS input_id, m.seq, e.id AS execution_id "
        "FROM session_message AS m LEFT JOIN session_execution AS e "
        "ON e.session_id = m.session_id WHERE m.type = 'user'",
    )
    unanswered = [r for r in users if r["input_id"] not in answered]
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


def check_progress_sync(conn: Conn, report: Report, now: int) -> None:
    report.checked.append("progress")
    executions = _rows_sync(
        conn,
        "SELECT id AS execution_id, session_id, owner_id, epoch, phase, expires_at FROM session_execution",
    )
    report.add(report.unsettled, "2", "executions in progress or awaiting takeover", executions)
    recoveries = _rows_sync(
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
    jobs = _rows_sync(
        conn,
        "SELECT session_id, status, dirty_seq, clean_seq, attempts, last_error "
        "FROM summary_job WHERE status != 'completed' OR dirty_seq > clean_seq",
    )
    report.add(report.unsettled, "2", "summaries not at the current raw turns", jobs)
    dream = _rows_sync(
        conn,
        "SELECT session_id, input_revision, completed_revision, digest_state, "
        "digest_attempts, defer_reason FROM dream_state "
        "WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision",
    )
    report.add(report.unsettled, "2", "Dream not at the published input revision", dream)


# -- invariant 8: operator events are hash-chained ---------------------------


def check_audit_sync(conn: Conn, report: Report) -> None:
    """Walk the operator events' hash chain; name the first broken link."""
    report.checked.append("audit")
    result = verify_operator_chain_sync(conn)
    broken = result["broken"]
    if broken is not None:
        report.add(
            report.violations,
            "8",
            f"operator event chain broken at event {broken['event_id']} ({broken['kind']}): "
            f"it {broken['why']}",
            [broken],
        )


# -- usage: a reply's tokens are counted with it, exactly once ---------------
# (the sessions a model answered, from their partial index; each reply's usage is
# written in the same transaction as its completion, so the totals always agree)
SQL_USAGE_MISMATCH = """
SELECT s.id AS session_id, s.tokens_input, s.tokens_output, s.tokens_reasoning, s.tokens_cache_read,
       s.tokens_cache_write, r.input, r.output, r.reasoning, r.cache_read, r.cache_write
FROM session AS s INDEXED BY session_usage_idx
JOIN (SELECT session_id,
             total(json_extract(data, '$.usage.input')) AS input,
             total(json_extract(data, '$.usage.output')) AS output,
             total(json_extract(data, '$.usage.reasoning')) AS reasoning,
             total(json_extract(data, '$.usage.cache_read')) AS cache_read,
             total(json_extract(data, '$.usage.cache_write')) AS cache_write
      FROM session_message WHERE type = 'assistant' AND json_extract(data, '$.status') = 'completed'
      GROUP BY session_id) AS r ON r.session_id = s.id
WHERE (s.tokens_input > 0 OR s.tokens_output > 0 OR s.model_error IS NOT NULL)
  AND (s.tokens_input != r.input OR s.tokens_output != r.output OR s.tokens_reasoning != r.reasoning
       OR s.tokens_cache_read != r.cache_read OR s.tokens_cache_write != r.cache_write)
"""


def check_usage_sync(conn: Conn, report: Report) -> None:
    report.checked.append("usage")
    report.add(
        report.violations,
        "usage",
        "session token totals that differ from the sum of their replies' usage",
        _rows_sync(conn, SQL_USAGE_MISMATCH),
    )


def check_database_sync(conn: Conn, now: int | None = None) -> Report:
    """All state.db invariants, inside the caller's read transaction."""
    report = Report()
    now = clock.now_ms() if now is None else now
    check_structure_sync(conn, report)
    check_inputs_sync(conn, report)
    check_projection_sync(conn, report)
    check_usage_sync(conn, report)
    check_progress_sync(conn, report, now)
    check_audit_sync(conn, report)
    return report


async def check_chroma(ctx: Any, db: Any, report: Report) -> None:
    """Invariants 2 and 4 against Chroma: receipts match their rows, Dream's keys survive.

    Reads only: the receipt side is a dry-run recovery pass (the same decode
    and ownership-aware predicate the summarizer uses), the Dream side compares
    `dreamCompletedRevision` with state.db wherever no overlay write is pending.
    """
    from backend.core.errors import ChromaUnreachable

    try:
        await _check_receipts(ctx, db, report)
        await _check_dream_overlay(ctx, db, report)
    except ChromaUnreachable as exc:
        report.add(
            report.violations,
            "2",
            "could not verify receipts and Dream keys against Chroma",
            [{"error": str(exc)}],
        )
        return
    report.checked.append("chroma")


async def _check_receipts(ctx: Any, db: Any, report: Report) -> None:
    from backend.summaries.receipt_replay import Recovery, ReplayOutcome, all_batches

    result = await Recovery(db, ctx.store(), actor="rem check", dry_run=True).run(all_batches(db))
    unacked = {
        r["session_id"]
        for r in await db.fetchall(
            "SELECT session_id FROM summary_job WHERE result_staged_at IS NOT NULL "
            "AND result_acknowledged_at IS NULL"
        )
    }
    differs = [r for r in result.rows if r["outcome"] == ReplayOutcome.WOULD_REPLAY]
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
        [
            r
            for r in result.rows
            if r["outcome"] in (ReplayOutcome.QUARANTINED, ReplayOutcome.WOULD_QUARANTINE)
        ],
    )
    report.add(
        report.unsettled,
        "2",
        "receipts leased by a running synthesis or replay",
        [r for r in result.rows if r["outcome"] == ReplayOutcome.SKIPPED_ACTIVE],
    )


DREAM_DONE_SQL = """
SELECT session_id, completed_revision, overlay_pending FROM dream_state
WHERE completed_revision IS NOT NULL AND session_id > :sid ORDER BY session_id LIMIT :n
"""


async def _check_dream_overlay(ctx: Any, db: Any, report: Report, batch: int = 500) -> None:
    from backend.chroma.ownership import summary_row_id

    lost, pending, sid = [], [], ""
    while rows := await db.fetchall(DREAM_DONE_SQL, {"sid": sid, "n": batch}):
        sid = rows[-1]["session_id"]
        settled = [r for r in rows if not r["overlay_pending"]]
        pending += [{"session_id": r["session_id"]} for r in rows if r["overlay_pending"]]
        live = await ctx.store().get([summary_row_id(r["session_id"]) for r in settled])
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
    report.add(report.violations, "4", "Dream-owned keys lost or stale on the Chroma row", lost)
    report.add(report.unsettled, "4", "Dream overlays not written to Chroma yet", pending)


def summarize(report: Report, *, settled: bool) -> dict[str, Any]:
    violations = [f.as_dict() for f in report.violations]
    unsettled = [f.as_dict() for f in report.unsettled]
    if settled:
        violations += [
            {**f, "invariant": f["invariant"], "what": "not settled: " + f["what"]} for f in unsettled
        ]
    return {
        "ok": not violations,
        "settled_mode": settled,
        "checked": report.checked,
        "violations": violations,
        "unsettled": unsettled,
        "counts": {
            "violations": sum(f["count"] for f in violations),
            "unsettled": sum(f["count"] for f in unsettled),
        },
    }


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=str)
