"""The status snapshot's SQL and how its lists are read: every query checked against its plan.

`LIST_QUERIES` are the snapshot's lists, each in the order its panel shows it
from an index, up to a cap; `STATUS_QUERIES` adds the totals', the model
health's, the tool calls' and the API servers' (tests/backend/test_status.py checks that no
plan scans a large table, on an empty and on an ANALYZEd populated
database; `benchmarks/scale.py --plans` prints them). `Window` reads a
panel's lists one after another: each up to its own cap (`rem status`), or
together up to the rows a console's panel shows.
"""

from __future__ import annotations

from typing import Any

from backend.ops import api_status, model_health, tool_status
from backend.ops.totals import TOTALS_QUERIES
from backend.store import counters
from backend.store.db import Conn
from backend.store.events import OPERATOR_KINDS_SQL
from backend.summaries.receipts import MISMATCHES

# rows listed per panel: a maximized panel on a 60-line terminal shows ~55, so this is
# three to four pages of scrolling; the panel's filter and sort work on these rows, its
# title and the totals count every row
LIST_CAP = 200
EVENT_TAIL = 100
RECENT_ACTIONS = 20
FAILED_SUMMARIES = 50

_INPUT_SESSION_IDX = "session_input_session_promoted_delivery_admitted_idx"

# name -> SQL; each is checked against EXPLAIN QUERY PLAN in
# the tests, on an empty database and on an ANALYZEd populated one. INDEXED BY pins
# plans where the planner, given statistics, would walk a big index in GROUP BY order.
LIST_QUERIES: dict[str, str] = {
    # the :scan oldest waiting inputs, in order from the partial index of waiting inputs
    # (it holds their session: no table row read)
    "inputs_oldest": """
        SELECT session_id, time_created AS created
        FROM session_input INDEXED BY session_input_waiting_idx
        WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL
        ORDER BY created, session_id LIMIT :scan""",
    # then each listed session's waiting inputs, one index seek per session
    "inputs": f"""
        SELECT session_id, count(*) AS pending, min(time_created) AS oldest_at
        FROM session_input INDEXED BY {_INPUT_SESSION_IDX}
        WHERE session_id IN (SELECT value FROM json_each(:sessions))
          AND promoted_seq IS NULL AND wake_pending IN (0, 1)
        GROUP BY session_id""",
    # PostgreSQL's first read: the same rows, each with its session's waiting inputs counted (an
    # index seek a row), so that the listed sessions need no second round trip; correlated, so
    # that it seeks (as a join with json_each, the planner guesses 200 sessions and walks the
    # whole backlog: 2.4 ms at 30 000 waiting inputs)
    "inputs_oldest_counted": f"""
        SELECT o.session_id, o.created,
               (SELECT count(*) FROM session_input INDEXED BY {_INPUT_SESSION_IDX}
                WHERE session_id = o.session_id AND promoted_seq IS NULL AND wake_pending IN (0, 1)) AS pending
        FROM (SELECT session_id, time_created AS created
              FROM session_input INDEXED BY session_input_waiting_idx
              WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL
              ORDER BY created, session_id LIMIT :scan) AS o
        ORDER BY o.created, o.session_id""",
    "counters": f"SELECT name, key, n FROM {counters.TABLE}",
    "recoveries": """
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created
        FROM session_recovery WHERE wake_pending = 1
        UNION
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created
        FROM session_recovery WHERE wake_pending IN (0, 1) AND recovery_error IS NOT NULL
        ORDER BY time_created LIMIT :cap""",
    # the same, parked first (as the Backlog panel shows them): a console's window of them
    "recoveries_parked_first": """
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created,
               recovery_error IS NULL AS unparked
        FROM session_recovery WHERE wake_pending = 1
        UNION
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created,
               recovery_error IS NULL AS unparked
        FROM session_recovery WHERE wake_pending IN (0, 1) AND recovery_error IS NOT NULL
        ORDER BY unparked, time_created LIMIT :cap""",
    "held_count": """
        SELECT count(*) AS n FROM session INDEXED BY session_held_idx WHERE held_at IS NOT NULL""",
    "summary_failed": """
        SELECT session_id, attempts, last_error, time_updated FROM summary_job
        WHERE status = 'failed' ORDER BY time_updated DESC LIMIT :cap""",
    "leases": """
        SELECT 'execution' AS kind, e.id AS id, e.session_id, e.owner_id, e.epoch, e.phase,
               e.expires_at, w.state AS owner_state, w.heartbeat_at, w.exited_at, e.parked
        FROM session_execution AS e LEFT JOIN worker AS w ON w.owner_id = e.owner_id
        UNION ALL
        SELECT 'summary_job', j.session_id, j.session_id, j.owner_id, j.epoch, NULL,
               j.lease_expires_at, w.state, w.heartbeat_at, w.exited_at, NULL
        FROM summary_job AS j LEFT JOIN worker AS w ON w.owner_id = j.owner_id
        WHERE j.lease_expires_at IS NOT NULL AND j.status = 'in_progress'
        UNION ALL
        SELECT 'dream', d.session_id, d.session_id, d.owner_id, d.epoch, NULL,
               d.lease_expires_at, w.state, w.heartbeat_at, w.exited_at, NULL
        FROM dream_state AS d LEFT JOIN worker AS w ON w.owner_id = d.owner_id
        WHERE d.lease_expires_at IS NOT NULL AND d.digest_state = 'in_progress'
        ORDER BY expires_at LIMIT :cap""",
    "receipt_mismatched": f"""
        SELECT session_id, verdict, verdict_detail, verdict_checked_at, quarantine_reason
        FROM summary_job INDEXED BY summary_job_mismatch_idx
        WHERE verdict IN ({", ".join(f"'{v}'" for v in MISMATCHES)})
        ORDER BY verdict_checked_at DESC LIMIT :cap""",
    "dream_drift": """
        SELECT session_id, input_revision, completed_revision, digest_state, digest_attempts,
               defer_reason, time_published AS since
        FROM dream_state
        WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision
        ORDER BY next_attempt_at, time_published LIMIT :cap""",
    "dream_legacy": """
        SELECT session_id, input_revision, completed_revision, digest_state, digest_attempts,
               defer_reason, time_updated AS since
        FROM dream_state INDEXED BY dream_state_digest_state_idx
        WHERE digest_state = 'legacy' ORDER BY session_id LIMIT :cap""",
    "summary_stale_rows": """
        SELECT session_id, time_updated AS since FROM summary_job
        WHERE dirty_seq > clean_seq ORDER BY time_updated, session_id LIMIT :cap""",
    "workers": """
        SELECT owner_id, role, pid, host, state, started_at, heartbeat_at, exited_at
        FROM worker INDEXED BY worker_state_heartbeat_idx WHERE state IN ('running', 'draining')
        UNION ALL
        SELECT owner_id, role, pid, host, state, started_at, heartbeat_at, exited_at
        FROM worker INDEXED BY worker_state_heartbeat_idx
        WHERE state = 'stopped' AND heartbeat_at > :recent
        ORDER BY role, started_at LIMIT :cap""",
    "recent_actions": f"""
        SELECT id, time, kind, actor, session_id, target, data FROM event INDEXED BY event_operator_idx
        WHERE kind IN ({OPERATOR_KINDS_SQL})
        ORDER BY id DESC LIMIT :cap""",
    # the journal's tail without the streamed parts (schema v13 journals each one for the API's
    # streams; on an operator's screen they would bury everything else while replies stream)
    "events": """
        SELECT id, time, kind, actor, session_id, target, data FROM event
        WHERE kind <> 'message.part' ORDER BY id DESC LIMIT :tail""",
}
STATUS_QUERIES: dict[str, str] = {
    **LIST_QUERIES,
    **TOTALS_QUERIES,
    **model_health.QUERIES,
    **tool_status.QUERIES,
    **api_status.QUERIES,
}
# a value for every named parameter of the status queries, to EXPLAIN QUERY PLAN any of
# them (the plan tests and `benchmarks/scale.py --plans`); sqlite ignores the unused ones
PLAN_PARAMS: dict[str, Any] = {
    "cap": 10,
    "recent": 0,
    "tail": 5,
    "now": 0,
    "fresh": 0,
    "sessions": "[]",
    "scan": 10,
    "since": 0,
    "upto": 1,
}


def rows_sync(conn: Conn, name: str, **params: Any) -> list[dict[str, Any]]:
    cursor = conn.execute(LIST_QUERIES[name], params)
    cursor.row_factory = None  # plain tuples: zip into dicts is ~3x cheaper than Row
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class Window:
    """A panel's rows read list after list: each list up to its own cap, or (`rows`) all of them
    together up to `rows`, in the panel's order."""

    def __init__(self, rows: int | None) -> None:
        self.left = rows
        self.taken: dict[str, int] = {}  # the rows each named list took (what the next read guesses)

    def cap(self, default: int) -> int:
        return default if self.left is None else min(default, max(0, self.left))

    def took(self, n: int, name: str | None = None) -> None:
        if name is not None:
            self.taken[name] = n
        if self.left is not None:
            self.left -= n

    def rows(self, conn: Conn, name: str, default: int, **params: Any) -> list[dict[str, Any]]:
        cap = self.cap(default)
        out = rows_sync(conn, name, cap=cap, **params) if cap > 0 else []
        self.took(len(out), name)
        return out
