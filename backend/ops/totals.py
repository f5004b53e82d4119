"""The totals `status()` carries beside its lists: what a metric or an alert needs, never capped.

The snapshot's lists stop at what a panel can show; an operator (and
Prometheus) still needs the whole picture: how many leases of each kind are
held, how many have expired and how long ago the oldest did, how many belong
to a dead worker, how old the oldest piece of each backlog is, how many
recoveries wait and how many are parked. Every figure here is a counter
the snapshot read (`status_count`: leases held per owner, the backlogs'
sizes) or one indexed query (tests/backend/test_status.py checks their
plans), run inside the snapshot's read transaction so they agree with its
lists. The oldest of each backlog is the first entry of an index in age
order; what is counted by a range is what an incident is made of (expired
leases, leases in progress, recoveries).
"""

from __future__ import annotations

from typing import Any

from backend.ops.records import LeaseTotals, RecoveryTotals, Totals
from backend.store import workers
from backend.store.db import Conn
from backend.store.states import TOOL_HOLDS

LEASE_KINDS = ("execution", "summary_job", "dream")
BACKLOG_KINDS = ("input", "recovery", "summary", "dream")


_RECOVERY_IDX = "session_recovery_wake_pending_error_attempts_created_execution_idx"

# a turn parked for a person (`states.TOOL_HOLDS`) is held and renewed by nobody: its row's expiry is no lateness
_NOT_PARKED = f" AND (parked IS NULL OR parked NOT IN ({', '.join(repr(h) for h in TOOL_HOLDS)}))"

# name -> SQL; each is checked against EXPLAIN QUERY PLAN with the snapshot's queries
TOTALS_QUERIES: dict[str, str] = {
    # two reads of the expiry index: the oldest is its first entry (a seek); together in one
    # aggregate, min() would walk the whole range with the count
    "execution_expired": f"""
        SELECT (SELECT count(*) FROM session_execution WHERE expires_at <= :now{_NOT_PARKED}) AS expired,
               (SELECT min(expires_at) FROM session_execution WHERE expires_at <= :now{_NOT_PARKED}) AS oldest""",
    "summary_job_by_owner": """
        SELECT owner_id, count(*) AS held, sum(lease_expires_at <= :now) AS expired,
               min(lease_expires_at) AS oldest
        FROM summary_job INDEXED BY summary_job_lease_idx
        WHERE lease_expires_at IS NOT NULL AND status = 'in_progress' GROUP BY owner_id""",
    "dream_by_owner": """
        SELECT owner_id, count(*) AS held, sum(lease_expires_at <= :now) AS expired,
               min(lease_expires_at) AS oldest
        FROM dream_state INDEXED BY dream_state_lease_idx
        WHERE lease_expires_at IS NOT NULL AND digest_state = 'in_progress' GROUP BY owner_id""",
    "alive_owners": """
        SELECT owner_id FROM worker INDEXED BY worker_state_heartbeat_idx
        WHERE state IN ('running', 'draining') AND heartbeat_at >= :fresh AND exited_at IS NULL""",
    "oldest_input": """
        SELECT min(time_created) FROM session_input INDEXED BY session_input_waiting_idx
        WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL""",
    "recoveries": f"""
        SELECT (SELECT count(*) FROM session_recovery INDEXED BY {_RECOVERY_IDX}
                WHERE wake_pending = 1 AND recovery_error IS NULL) AS waiting,
               (SELECT min(time_created) FROM session_recovery INDEXED BY {_RECOVERY_IDX}
                WHERE wake_pending = 1 AND recovery_error IS NULL) AS oldest,
               (SELECT count(*) FROM session_recovery INDEXED BY {_RECOVERY_IDX}
                WHERE wake_pending IN (0, 1) AND recovery_error IS NOT NULL) AS parked""",
    # a drifted job keeps `time_updated` = when it first drifted (backend/store/handoffs.py)
    "oldest_summary": """
        SELECT min(time_updated) FROM summary_job INDEXED BY summary_job_drift_idx
        WHERE dirty_seq > clean_seq""",
    "oldest_dream": """
        SELECT min(time_published) FROM dream_state INDEXED BY dream_state_drift_age_idx
        WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision""",
}


# the queries whose answer does not depend on the clock: kept in `memo` until a commit
CLOCKLESS = frozenset(("oldest_input", "recoveries", "oldest_summary", "oldest_dream"))


def _rows_sync(
    conn: Conn, name: str, memo: dict[str, list[tuple[Any, ...]]] | None, **params: object
) -> list[tuple[Any, ...]]:
    """A totals query's rows; a clockless one's come from `memo` when it has them."""
    if memo is not None and name in memo:
        return memo[name]
    rows = [tuple(r) for r in conn.execute(TOTALS_QUERIES[name], params).fetchall()]
    if memo is not None and name in CLOCKLESS:
        memo[name] = rows
    return rows


def _scalar_sync(conn: Conn, name: str, memo: dict[str, list[tuple[Any, ...]]] | None = None) -> int | None:
    rows = _rows_sync(conn, name, memo)
    return None if not rows or rows[0][0] is None else int(rows[0][0])


def _age(now: int, since: int | None) -> int:
    return max(0, now - since) if since is not None else 0


def lease_totals_sync(conn: Conn, now: int, execution_held: dict[str, int]) -> dict[str, LeaseTotals]:
    """Held, expired and dead-owner leases of every kind, and the longest expiry overrun.

    `execution_held` is the execution leases held per owner (the `execution_held` counter).
    """
    fresh = now - workers.WORKER_DEAD_AFTER_MS
    alive = {r[0] for r in conn.execute(TOTALS_QUERIES["alive_owners"], {"fresh": fresh})}
    out: dict[str, LeaseTotals] = {}
    expired, oldest = conn.execute(TOTALS_QUERIES["execution_expired"], {"now": now}).fetchone()
    out["execution"] = LeaseTotals(
        held=sum(execution_held.values()),
        expired=int(expired or 0),
        dead_owner=sum(n for owner, n in execution_held.items() if owner not in alive),
        expired_max_ms=_age(now, oldest),
    )
    for kind, query in (("summary_job", "summary_job_by_owner"), ("dream", "dream_by_owner")):
        out[kind] = _job_lease_totals(
            conn.execute(TOTALS_QUERIES[query], {"now": now}).fetchall(), now, alive
        )
    return out


def _job_lease_totals(rows: list[Any], now: int, alive: set[str]) -> LeaseTotals:
    """One job kind's totals from its rows per owner: (owner, held, expired, oldest expiry)."""
    expired_at = [r[3] for r in rows if r[2]]
    return LeaseTotals(
        held=sum(r[1] for r in rows),
        expired=sum(int(r[2] or 0) for r in rows),
        dead_owner=sum(r[1] for r in rows if r[0] not in alive),
        expired_max_ms=_age(now, min(expired_at)) if expired_at else 0,
    )


def totals_sync(
    conn: Conn,
    now: int,
    counts: dict[str, Any],
    memo: dict[str, list[tuple[Any, ...]]] | None = None,
) -> Totals:
    """Every total of the snapshot; `counts` are the snapshot's counters, read in the same tx.

    `memo` (emptied by the caller whenever something was committed) keeps the
    answers that do not depend on the clock between snapshots.
    """
    ((waiting, oldest_recovery, parked),) = _rows_sync(conn, "recoveries", memo)
    return Totals(
        leases=lease_totals_sync(conn, now, counts["execution_held"]),
        backlog={
            "input": counts["inputs_total"],
            "recovery": int(waiting),
            # the summarizer's queue: every session whose summary lags its raw turns (new ones too)
            "summary": counts["summary_stale"],
            "dream": counts["dream_pending"],
        },
        backlog_oldest_ms={
            "input": _age(now, _scalar_sync(conn, "oldest_input", memo)),
            "recovery": _age(now, oldest_recovery),
            "summary": _age(now, _scalar_sync(conn, "oldest_summary", memo)),
            "dream": _age(now, _scalar_sync(conn, "oldest_dream", memo)),
        },
        recoveries=RecoveryTotals(waiting=int(waiting), parked=int(parked)),
    )
