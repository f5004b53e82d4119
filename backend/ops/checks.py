"""`rem check`: verify the invariants of DESIGN section 5 on a live data dir.

Findings come in two kinds:

* **violations**: wrong whatever the timing (an input promoted twice, a
  completed reply published twice, a receipt that does not match its Chroma
  row while nobody holds its lease, Dream-owned metadata deleted).
* **unsettled**: work still in flight (a lease held, an input not promoted
  yet, a Dream revision pending). Normal on a busy system; with
  `settled=True` (what the drills use once load has stopped) each one is a
  violation too, because a settled system has none.

The state.db part visits every session's rows in bounded batches of
sessions (`CHECK_BATCH_SESSIONS`, in id order), each batch in its own short
read transaction: every invariant here is about one session's rows, so a
batch sees each of its sessions whole and consistent, and no read
transaction lives long enough to hold back a WAL checkpoint (a 10-million
message state.db is checked in thousands of reads of a few milliseconds,
not one of a minute). Findings are merged across batches in a fixed order,
counts whole and rows capped. From `PARALLEL_MIN_SESSIONS` sessions on,
state.db's sessions are checked by one worker process per core (at most 4),
each over a range of ids with a read-only connection of its own, the same
batches, merged in id order: the same report, in about half the time on two
cores (10 000 000 messages: 81 s -> 37 s). The structure checks (`quick_check`, foreign
keys) are one statement per table; state.db is first read ahead in file order
(`warm_page_cache`), since `quick_check` walks pages in b-tree order, which from a
cold page cache is random reads. The Chroma part reads the summary rows
in batches and compares them with the receipts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from backend.core import clock, processes
from backend.core.settings import Settings, settings
from backend.memory.text import FTS_TABLES_SQL, fts_table
from backend.store import counters
from backend.store.db import Conn, engine_of
from backend.store.events import journal_key, verify_operator_chain_sync
from backend.store.journal_head import Head, extends
from backend.store.maintenance import warm_page_cache

log = logging.getLogger("rem.checks")

ROW_CAP = 20  # rows listed per finding; counts are always complete
CHECK_BATCH_SESSIONS = 2_000
# the sessions phase runs in processes from this many sessions on (below, starting one, ~0.5 s
# of imports, costs more than it saves; REM_CHECK_PARALLEL_SESSIONS), one per core, at most 4,
# each over one range of ids
PARALLEL_MIN_SESSIONS = Settings.check_parallel_sessions.default
CHECK_WORKERS = max(1, min(4, os.cpu_count() or 1))
Progress = Callable[[str, int, int], None]


@dataclass(kw_only=True)
class Finding:
    invariant: str
    what: str
    rows: list[Mapping[str, Any]] = field(default_factory=list)
    count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "what": self.what,
            "count": self.count,
            "rows": [_plain_row(row) for row in self.rows[:ROW_CAP]],
        }


def _plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A finding's row with enum members as their values (`would_replay`, not `<ReplayOutcome...>`)."""
    return {key: value.value if isinstance(value, Enum) else value for key, value in row.items()}


@dataclass
class Report:
    violations: list[Finding] = field(default_factory=list)
    unsettled: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def add(
        self, bucket: list[Finding], invariant: str, what: str, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """Add rows to a finding, merging with the same finding from an earlier batch."""
        self._add(bucket, invariant, what, rows, len(rows))

    @staticmethod
    def _add(
        bucket: list[Finding], invariant: str, what: str, rows: Sequence[Mapping[str, Any]], count: int
    ) -> None:
        if not count:
            return
        for finding in bucket:
            if (finding.invariant, finding.what) == (invariant, what):
                finding.rows.extend(rows[: max(0, ROW_CAP - len(finding.rows))])
                finding.count += count
                return
        bucket.append(Finding(invariant=invariant, what=what, rows=list(rows[:ROW_CAP]), count=count))

    def merge(self, other: Report) -> None:
        """`other`'s findings after this one's, as if its batches had come next (rows capped, counts whole)."""
        for mine, theirs in ((self.violations, other.violations), (self.unsettled, other.unsettled)):
            for finding in theirs:
                self._add(mine, finding.invariant, finding.what, finding.rows, finding.count)
        self.checked += [name for name in other.checked if name not in self.checked]

    def ordered(self) -> None:
        """Findings in the order the checks declare them (batches find them in any order)."""
        for bucket in (self.violations, self.unsettled):
            bucket.sort(
                key=lambda f: FINDING_ORDER.index(f.what) if f.what in FINDING_ORDER else len(FINDING_ORDER)
            )


def _rows_sync(conn: Conn, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    cursor.row_factory = None
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


# -- invariant 0: the database itself ---------------------------------------
STRUCTURE_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)


def structure_tables_sync(conn: Conn) -> list[str]:
    if engine_of(conn) == "postgresql":
        return []
    return [r["name"] for r in conn.execute(STRUCTURE_TABLES_SQL).fetchall()]


def check_structure_sync(conn: Conn, report: Report, table: str | None = None) -> None:
    """`quick_check` and the foreign keys, of one table (and its indexes) or of the whole file."""
    if "structure" not in report.checked:
        report.checked.append("structure")
    if engine_of(conn) == "postgresql":
        return  # PostgreSQL enforces every foreign key on every write and checks its own pages
    target = f"({json.dumps(table)})" if table else ""
    problems = [
        r["quick_check"]
        for r in conn.execute(f"PRAGMA quick_check{target}").fetchall()
        if r["quick_check"] != "ok"
    ]
    report.add(
        report.violations,
        "structure",
        "state.db fails PRAGMA quick_check",
        [{"problem": p} for p in problems],
    )
    orphans = _rows_sync(conn, f"PRAGMA foreign_key_check{target}")
    report.add(report.violations, "structure", "rows whose foreign key points at nothing", orphans)


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
    if "inputs" not in report.checked:
        report.checked.append("inputs")
    batch = {"lo": lo, "hi": hi}
    report.add(
        report.violations,
        "1",
        "promoted inputs whose user message is missing or wrong",
        _rows_sync(conn, SQL_PROMOTED_WITHOUT_MESSAGE, batch),
    )
    report.add(
        report.violations,
        "1",
        "user messages that no admitted input produced",
        _rows_sync(conn, SQL_USER_WITHOUT_INPUT, batch),
    )
    report.add(
        report.violations,
        "1",
        "sequence numbers ahead of their session's sequence",
        _rows_sync(conn, SQL_SEQ_AHEAD_OF_SEQUENCE, batch),
    )
    report.add(
        report.violations,
        "1",
        "one sequence number used twice in a session",
        _rows_sync(conn, SQL_SEQ_SHARED, batch),
    )
    unpromoted = _rows_sync(conn, SQL_UNPROMOTED, batch)
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
    if "projection" not in report.checked:
        report.checked.append("projection")
    batch = {"lo": lo, "hi": hi}
    report.add(
        report.violations,
        "3",
        "executions that published more than one completed reply",
        [
            {"execution_id": r["execution_id"], "step": r["step"], "messages": r["messages"].split(",")}
            for r in _rows_sync(conn, SQL_DOUBLE_REPLY, batch)
        ],
    )
    live = {r["id"] for r in conn.execute(SQL_LIVE_EXECUTIONS, batch).fetchall()}
    open_rows = _rows_sync(conn, SQL_OPEN_ASSISTANTS, batch)
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
        _rows_sync(conn, SQL_DOUBLE_CONTINUATION, batch),
    )
    answers = _rows_sync(conn, SQL_ANSWERS, batch)
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
    check_inputs_sync(conn, report, lo, hi)
    check_projection_sync(conn, report, lo, hi)
    check_usage_sync(conn, report, lo, hi)
    check_recall_index_sync(conn, report, lo, str(hi))
    return str(hi), int(n)


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


def check_audit_sync(conn: Conn, report: Report, recorded: Head | None = None) -> None:
    """Walk the operator events' hash chain; name the first broken link, and a journal that does
    not extend the head `rem up` recorded (`backend.store.journal_head`)."""
    report.checked.append("audit")
    result = verify_operator_chain_sync(conn, journal_key(), at=recorded.count if recorded else None)
    broken = result["broken"]
    if broken is not None:
        report.add(
            report.violations,
            "8",
            f"operator event chain broken at event {broken['event_id']} ({broken['kind']}): "
            f"it {broken['why']}",
            [broken],
        )
        return
    problem = extends(result, recorded)
    if problem is not None and recorded is not None:
        report.add(
            report.violations,
            "8",
            f"operator journal {problem}",
            [{"recorded_count": recorded.count, "recorded_head": recorded.head, "count": result["count"]}],
        )


# -- invariant 9: every raw turn up to a session's current revision is in the recall index --
# (one batch of sessions at a time, like the other per-session invariants: each read holds
# a batch's raw turns, Dream rows and index rows, never the whole index)
SQL_RAW_TURNS = """
SELECT session_id, id, type, time_created, data FROM session_message
WHERE session_id > :lo AND session_id <= :hi AND type IN ('user', 'assistant') ORDER BY session_id
"""
SQL_INDEX_ROWS = """
SELECT id, project, session_id, message_id, digest, vector_digest FROM memory_turn
WHERE session_id > :lo AND session_id <= :hi
"""
SQL_PUBLISHED = """
SELECT session_id, input_revision, indexed_revision FROM dream_state WHERE session_id > :lo AND session_id <= :hi
"""


def _fts_rowids_sync(conn: Conn, ids_by_project: Mapping[str, set[int]]) -> set[tuple[str, int]]:
    """(project, rowid) of the given index rows that have their row in the project's FTS5 table.

    PostgreSQL: their `memory_fts` row, under the same project.
    """
    if engine_of(conn) == "postgresql":
        wanted = sorted(set().union(*ids_by_project.values())) if ids_by_project else []
        if not wanted:
            return set()
        if wanted[-1] - wanted[0] < 4 * len(wanted):
            found = conn.execute(
                "SELECT project, id FROM memory_fts WHERE id BETWEEN ? AND ?", (wanted[0], wanted[-1])
            )
        else:
            found = conn.execute("SELECT project, id FROM memory_fts WHERE id = ANY(?)", (wanted,))
        return {(r[0], r[1]) for r in found if r[1] in ids_by_project.get(r[0], ())}
    tables = {r[0] for r in conn.execute(FTS_TABLES_SQL)}
    held: set[tuple[str, int]] = set()
    for project, ids in sorted(ids_by_project.items()):
        table = fts_table(project)
        if table not in tables or not ids:
            continue  # a missing table holds none
        lo, hi = min(ids), max(ids)
        if hi - lo < 4 * len(ids):  # the batch's rows are close together: one range of rowids
            found = conn.execute(f"SELECT rowid FROM {table} WHERE rowid BETWEEN ? AND ?", (lo, hi))
        else:  # spread out: one rowid lookup each
            found = conn.execute(
                f"SELECT rowid FROM {table} WHERE rowid IN (SELECT value FROM json_each(?))",
                (json.dumps(sorted(ids)),),
            )
        held.update((project, r[0]) for r in found if r[0] in ids)
    return held


def _raw_turns_by_session(conn: Conn, lo: str, hi: str) -> dict[str, list[dict[str, Any]]]:
    """Each session's raw turn records (the ones its revision covers), for sessions `lo` < id <= `hi`."""
    from backend.store.revision import turn_record

    records: dict[str, list[dict[str, Any]]] = {}
    for sid, mid, kind, created, data in conn.execute(SQL_RAW_TURNS, {"lo": lo, "hi": hi}):
        parsed = json.loads(data)
        record = turn_record(mid, kind, created, parsed if isinstance(parsed, dict) else {})
        if record is not None:
            records.setdefault(sid, []).append(record)
    return records


def check_recall_index_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Invariant 9, on state.db, for sessions `lo` < id <= `hi`: the FTS5 side covers each
    session's indexed revision exactly (rows merged into the report's findings)."""
    from backend.store.revision import compute_revision

    if "recall_index" not in report.checked:
        report.checked.append("recall_index")
    bounds = {"lo": lo, "hi": hi}
    raw = _raw_turns_by_session(conn, lo, hi)
    published = {r[0]: (r[1], r[2]) for r in conn.execute(SQL_PUBLISHED, bounds)}
    rows: dict[str, list[dict[str, Any]]] = {}
    no_fts, vectors_pending = [], []
    index_rows = _rows_sync(conn, SQL_INDEX_ROWS, bounds)
    ids_by_project: dict[str, set[int]] = {}
    for r in index_rows:
        ids_by_project.setdefault(r["project"], set()).add(r["id"])
    fts_rows = _fts_rowids_sync(conn, ids_by_project)
    for r in index_rows:
        rows.setdefault(r["session_id"], []).append(r)
        if (r["project"], r["id"]) not in fts_rows:
            no_fts.append({"session_id": r["session_id"], "message_id": r["message_id"]})
        if r["vector_digest"] != r["digest"]:
            vectors_pending.append({"session_id": r["session_id"], "message_id": r["message_id"]})
    missing, extra, behind = [], [], []
    for sid, records in raw.items():
        current, indexed = published.get(sid, (None, None))
        if current is not None and indexed != current:
            behind.append({"session_id": sid, "published": current, "indexed": indexed})
        # never indexed: nothing to compare (and no revision to hash)
        if indexed is None or indexed != compute_revision(records):
            continue  # the raw turns moved on (or were never published): coverage is checked at the revision
        turn_ids = {r["id"] for r in records}
        held = {r["message_id"] for r in rows.get(sid, [])}
        missing += [{"session_id": sid, "message_id": m} for m in sorted(turn_ids - held)]
        extra += [{"session_id": sid, "message_id": m} for m in sorted(held - turn_ids)]
    report.add(report.violations, "9", "raw turns missing from the recall index at its revision", missing)
    report.add(report.violations, "9", "recall index rows for turns that are not raw turns", extra)
    report.add(report.violations, "9", "recall index rows without their FTS5 row", no_fts)
    report.add(report.unsettled, "9", "recall index behind the session's published revision", behind)
    report.add(report.unsettled, "9", "turn vectors not written to Chroma yet", vectors_pending)


# -- usage: a reply's tokens are counted with it, exactly once ---------------
# (the sessions a model answered, from their partial index; each reply's usage is
# written in the same transaction as its completion, so the totals always agree)
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
        AND type = 'assistant' AND json_extract(data, '$.status') = 'completed'
      GROUP BY session_id) AS r ON r.session_id = s.id
WHERE s.id > :lo AND s.id <= :hi AND (s.tokens_input > 0 OR s.tokens_output > 0 OR s.model_error IS NOT NULL)
  AND (s.tokens_input != r.input OR s.tokens_output != r.output OR s.tokens_reasoning != r.reasoning
       OR s.tokens_cache_read != r.cache_read OR s.tokens_cache_write != r.cache_write)
"""


def check_usage_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """The sessions `lo` < id <= `hi` (one batch; rows merged into the report's finding)."""
    if "usage" not in report.checked:
        report.checked.append("usage")
    report.add(
        report.violations,
        "usage",
        "session token totals that differ from the sum of their replies' usage",
        _rows_sync(conn, SQL_USAGE_MISMATCH, {"lo": lo, "hi": hi}),
    )


# -- the status counters: each equals the count it keeps (backend/store/counters.py) --------


def check_counter_sync(conn: Conn, report: Report, counter: counters.Counter) -> None:
    """One counter against a real count of its rows, inside one read transaction (both agree)."""
    if "counters" not in report.checked:
        report.checked.append("counters")
    report.add(
        report.violations,
        "counters",
        "status counters that differ from a count of their rows (a write bypassed the triggers)",
        counters.drift_sync(conn, counter),
    )


def check_database_sync(conn: Conn, now: int | None = None) -> Report:
    """All state.db invariants inside the caller's one read transaction (small data dirs, tests)."""
    report = Report()
    now = clock.now_ms() if now is None else now
    check_structure_sync(conn, report)
    lo: str | None = ""
    while lo is not None:
        lo, _ = check_sessions_sync(conn, report, lo)
    check_progress_sync(conn, report, now)
    check_audit_sync(conn, report)
    for counter in counters.COUNTERS:
        check_counter_sync(conn, report, counter)
    report.ordered()
    return report


async def check_database_in_batches(
    db: Any,
    *,
    now: int | None = None,
    batch: int = CHECK_BATCH_SESSIONS,
    progress: Progress | None = None,
    workers: int | None = None,
    parallel_min: int | None = None,
    recorded: Head | None = None,
) -> Report:
    """All state.db invariants, one short read transaction per table or per batch of sessions.

    On state.db with at least `parallel_min` (REM_CHECK_PARALLEL_SESSIONS) sessions, the sessions are checked by `workers`
    processes (`CHECK_WORKERS`: one per core, at most 4), each over its own range of session
    ids with a read-only connection of its own, in the same batches, and the findings merged
    in id order: the same report as one process gives, in about 1/workers of the time.
    `recorded`: the operator journal's head `rem up` recorded for this store, if any.
    """
    report = Report()
    now = clock.now_ms() if now is None else now
    tell = progress or (lambda _phase, _done, _total: None)
    if not db.postgres:  # every page is read below: from a cold cache, in file order first
        await asyncio.to_thread(warm_page_cache, Path(db.path))
    tables = await db.read_in_thread(structure_tables_sync)
    for i, table in enumerate(tables):
        tell("structure", i, len(tables))
        await db.read_in_thread(lambda conn, t=table: check_structure_sync(conn, report, t))
    if not tables:  # PostgreSQL checks its own pages and keys: listed as checked, as a whole read lists it
        await db.read_in_thread(lambda conn: check_structure_sync(conn, report))
    tell("structure", len(tables), len(tables))
    total = int(await db.scalar("SELECT count(*) FROM session"))
    workers = CHECK_WORKERS if workers is None else workers
    parallel_min = settings.check_parallel_sessions if parallel_min is None else parallel_min
    if not db.postgres and workers > 1 and total >= parallel_min:
        done = await _check_sessions_in_processes(db, report, total, batch, workers, tell)
    else:
        lo: str | None = ""
        done = 0
        while lo is not None:
            tell("sessions", done, total)
            lo, n = await db.read_in_thread(
                lambda conn, after=lo: check_sessions_sync(conn, report, after, batch)
            )
            done += n
    tell("sessions", done, max(done, total))
    await db.read_in_thread(lambda conn: check_progress_sync(conn, report, now))
    # invariant 8 walks the operator events' chain in order (they are few: operator actions only)
    await db.read_in_thread(lambda conn: check_audit_sync(conn, report, recorded))
    # each counter and its real count in one short read (a count walks an index of one table)
    for i, counter in enumerate(counters.COUNTERS):
        tell("counters", i, len(counters.COUNTERS))
        await db.read_in_thread(lambda conn, c=counter: check_counter_sync(conn, report, c))
    tell("counters", len(counters.COUNTERS), len(counters.COUNTERS))
    report.ordered()
    return report


async def _check_sessions_in_processes(
    db: Any, report: Report, total: int, batch: int, workers: int, tell: Progress
) -> int:
    """The sessions phase over `workers` processes, each a range of ids; merged in id order.

    Workers are `python -m backend.ops.check_worker` processes, not multiprocessing's: a library
    call must not depend on its caller's main module being import-safe (spawn re-imports it).
    """
    step = max(batch, -(-total // workers))
    bounds = await db.read_in_thread(lambda conn: _range_bounds_sync(conn, step, total))
    ranges = list(zip(["", *bounds], [*bounds, None], strict=True))  # the last open: sessions added meanwhile
    log.info("checking %d sessions in %d worker process%s", total, len(ranges), "es" * (len(ranges) > 1))
    done = 0
    tell("sessions", done, total)

    def checked(n: int) -> None:
        nonlocal done
        done += n
        tell("sessions", done, max(done, total))

    tasks = [
        asyncio.ensure_future(_check_range_in_worker(str(db.path), lo, hi, batch, checked))
        for lo, hi in ranges
    ]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:  # one failed (or Ctrl-C): stop the others' processes too, then say why
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for part, _ in results:  # merged in id order: the same rows as one process lists
        report.merge(part)
    return sum(n for _, n in results)


async def _check_range_in_worker(
    path: str, lo: str, hi: str | None, batch: int, checked: Callable[[int], None]
) -> tuple[Report, int]:
    from backend.core.errors import RemError

    worker = processes.python_child(
        "backend.ops.check_worker", path, lo, hi or "", str(batch), cwd=Path(path).parent
    )
    proc = await worker.spawn(stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        out = asyncio.ensure_future(proc.stdout.read())  # read alongside stderr: neither pipe fills
        errors: list[str] = []
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").strip()
            if line.startswith("checked "):
                checked(int(line.split()[1]))
            elif line:
                errors.append(line)
        result, code = await out, await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if code != 0:
        detail = errors[-1] if errors else f"it exited with code {code}"
        raise RemError(f"checking the sessions after {lo!r} of {path}: {detail}")
    report, n = pickle.loads(result)
    assert isinstance(report, Report)
    return report, int(n)


def _range_bounds_sync(conn: Conn, step: int, total: int) -> list[str]:
    """The id of every `step`-th session before the last: the upper bounds of ranges of `step` sessions."""
    rows = conn.execute(
        "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM session) "
        "WHERE n % ? = 0 AND n < ?",
        (step, total),
    ).fetchall()
    return [r[0] for r in rows]


def check_range_in_process(
    path: str, lo: str, hi: str | None, batch: int, checked: Callable[[int], None] = lambda n: None
) -> tuple[Report, int]:
    """A worker's part: sessions `lo` < id <= `hi` (None: to the end) of the state.db at `path`,
    read-only, in batches of `batch`, each in its own short read transaction."""
    import sqlite3

    from backend.store.db import BUSY_TIMEOUT_MS, _target, sqlite_errors

    database, uri = _target(Path(path), True)
    with sqlite_errors(path):
        conn = sqlite3.connect(database, uri=uri, isolation_level=None)
        conn.row_factory = sqlite3.Row
        report, done, after = Report(), 0, lo
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
            while True:
                conn.execute("BEGIN")
                try:
                    last, n = check_sessions_sync(conn, report, after, batch, until=hi)
                finally:
                    conn.execute("ROLLBACK")
                done += n
                if last is None:
                    return report, done
                checked(n)
                after = last
        finally:
            conn.close()


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
        await _check_turn_vectors(ctx, db, report)
    except ChromaUnreachable as exc:
        report.add(
            report.violations,
            "2",
            "could not verify receipts and Dream keys against Chroma",
            [{"error": str(exc)}],
        )
        return
    report.checked.append("chroma")


# how many times a receipt that differs from its row is looked at again, with its current receipt
RECEIPT_RECHECKS = 2


async def _check_receipts(ctx: Any, db: Any, report: Report) -> None:
    from backend.core.errors import ReceiptNotFound
    from backend.summaries.receipt_replay import (
        Recovery,
        ReplayOutcome,
        all_batches,
        in_batches,
        named_jobs,
    )

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


async def _check_turn_vectors(ctx: Any, db: Any, report: Report) -> None:
    """Invariant 9, Chroma side: every turn row state.db marks as written is in its collection, as
    written (its digest, and its document and vector against the record kept at writing)."""
    from backend.memory import turn_vectors

    missing: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    after = 0
    while rows := await turn_vectors.marked_batch(db, after):
        after = rows[-1].id
        differing = await turn_vectors.compare(rows, ctx.turn_store)
        # On a live system Dream can re-index a row and flush its new vector between this reading
        # the row and reading Chroma: Chroma then holds a newer digest than the one read. Each row
        # that differs is read again (still marked? which digest now?) and compared again; one
        # that still differs is real.
        for _ in range(RECHECKS):
            if not differing:
                break
            again = await turn_vectors.marked_again(db, [row for row, _ in differing])
            differing = await turn_vectors.compare(again, ctx.turn_store)
        for row, why in differing:
            found = {"session_id": row.session_id, "message_id": row.message_id}
            if why == "missing":
                missing.append(found)
            else:
                changed.append({**found, "differs": why})
    report.add(report.violations, "9", "turn vectors marked written but missing from Chroma", missing)
    report.add(report.violations, "9", TURN_ROWS_CHANGED, changed)


# how many times a turn row that differs from Chroma's is looked at again, as it is now
RECHECKS = 2
TURN_ROWS_CHANGED = "turn rows whose document, vector or digest in Chroma differs from what was written"


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


# the order findings are listed in (the order the checks above declare them)
FINDING_ORDER = (
    "state.db fails PRAGMA quick_check",
    "rows whose foreign key points at nothing",
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
    "session token totals that differ from the sum of their replies' usage",
    "status counters that differ from a count of their rows (a write bypassed the triggers)",
    "executions in progress or awaiting takeover",
    "recoveries waiting",
    "recoveries parked for the operator (attempt budget spent)",
    "summaries not at the current raw turns",
    "Dream not at the published input revision",
    # invariant 9, checked batch by batch with the sessions, listed last as before it was
    "raw turns missing from the recall index at its revision",
    "recall index rows for turns that are not raw turns",
    "recall index rows without their FTS5 row",
    "recall index behind the session's published revision",
    "turn vectors not written to Chroma yet",
    "turn vectors marked written but missing from Chroma",
    TURN_ROWS_CHANGED,
)
