"""The status snapshot: what the console renders and `rem status --json` prints.

Every query here is served by an index (see `STATUS_QUERIES` and
tests/backend/test_status.py, which asserts no query plan scans a large
table), and all of them run inside one short read transaction so the
snapshot is consistent. Lists are capped and sorted most urgent first.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import aiosqlite

from backend import clock, workers
from backend.ownership import summary_row_id

LIST_CAP = 500
EVENT_TAIL = 100
OPERATOR_KINDS = ("operator.replay", "operator.drain", "operator.release")
DRIFT_CLASSES = ("summary_stale", "dream_pending", "stale_completion", "deferred",
                 "undigestible", "legacy_only")
RECEIPT_VERDICTS = ("present", "missing", "document_differs", "keys_differ", "quarantined")

# name -> SQL; each is checked against EXPLAIN QUERY PLAN in the tests.
STATUS_QUERIES: dict[str, str] = {
    "inputs": """
        SELECT session_id, count(*) AS pending, min(time_created) AS oldest_at
        FROM session_input WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL
        GROUP BY session_id ORDER BY oldest_at LIMIT :cap""",
    "inputs_total": """
        SELECT count(*) FROM session_input WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL""",
    "recoveries": """
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created
        FROM session_recovery WHERE wake_pending = 1
        UNION
        SELECT execution_id, session_id, phase, wake_attempts, recovery_error, time_created
        FROM session_recovery WHERE wake_pending IN (0, 1) AND recovery_error IS NOT NULL
        ORDER BY time_created LIMIT :cap""",
    "summary_status_count": "SELECT count(*) FROM summary_job WHERE status = :status",
    "summary_stale": "SELECT count(*) FROM summary_job WHERE dirty_seq > clean_seq",
    "summary_failed": """
        SELECT session_id, attempts, last_error, time_updated FROM summary_job
        WHERE status = 'failed' ORDER BY time_updated DESC LIMIT :cap""",
    "dream_pending": """
        SELECT count(*) FROM dream_state
        WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision""",
    "dream_state_count": "SELECT count(*) FROM dream_state WHERE digest_state = :state",
    "execution_leases": """
        SELECT e.id, e.session_id, e.owner_id, e.epoch, e.phase, e.expires_at,
               w.state AS owner_state, w.heartbeat_at
        FROM session_execution AS e LEFT JOIN worker AS w ON w.owner_id = e.owner_id
        ORDER BY e.expires_at LIMIT :cap""",
    "summary_leases": """
        SELECT j.session_id, j.owner_id, j.epoch, j.lease_expires_at, w.state AS owner_state,
               w.heartbeat_at
        FROM summary_job AS j LEFT JOIN worker AS w ON w.owner_id = j.owner_id
        WHERE j.lease_expires_at IS NOT NULL AND j.status = 'in_progress'
        ORDER BY j.lease_expires_at LIMIT :cap""",
    "dream_leases": """
        SELECT d.session_id, d.owner_id, d.epoch, d.lease_expires_at, w.state AS owner_state,
               w.heartbeat_at
        FROM dream_state AS d LEFT JOIN worker AS w ON w.owner_id = d.owner_id
        WHERE d.lease_expires_at IS NOT NULL AND d.digest_state = 'in_progress'
        ORDER BY d.lease_expires_at LIMIT :cap""",
    "receipt_count": "SELECT count(*) FROM summary_job WHERE verdict = :verdict",
    "receipt_unchecked": """
        SELECT count(*) FROM summary_job WHERE verdict IS NULL AND result_staged_at IS NOT NULL""",
    "receipt_mismatched": """
        SELECT session_id, verdict, verdict_detail, verdict_checked_at, quarantine_reason
        FROM summary_job WHERE verdict IN ('missing', 'document_differs', 'keys_differ', 'quarantined')
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
        FROM dream_state WHERE digest_state = 'legacy' ORDER BY session_id LIMIT :cap""",
    "summary_stale_rows": """
        SELECT session_id, time_updated AS since FROM summary_job
        WHERE dirty_seq > clean_seq ORDER BY time_updated, session_id LIMIT :cap""",
    "workers": """
        SELECT owner_id, role, pid, host, state, started_at, heartbeat_at FROM worker
        WHERE state IN ('running', 'draining')
        UNION ALL
        SELECT owner_id, role, pid, host, state, started_at, heartbeat_at FROM worker
        WHERE state = 'stopped' AND heartbeat_at > :recent
        ORDER BY role, started_at LIMIT :cap""",
    "recent_actions": """
        SELECT id, time, kind, actor, session_id, target, data FROM event
        WHERE kind IN ('operator.replay', 'operator.drain', 'operator.release')
        ORDER BY id DESC LIMIT 20""",
    "events": """
        SELECT id, time, kind, actor, session_id, target, data FROM event
        ORDER BY id DESC LIMIT :tail""",
    "sessions": "SELECT count(*) FROM session",
}

# Workers stopped within this window still show (so a SIGKILLed daemon is visible).
RECENT_STOPPED_MS = 10 * 60_000


async def _rows(conn: aiosqlite.Connection, name: str, **params: Any) -> list[sqlite3.Row]:
    return list(await conn.execute_fetchall(STATUS_QUERIES[name], params))


async def _count(conn: aiosqlite.Connection, name: str, **params: Any) -> int:
    rows = await _rows(conn, name, **params)
    return int(rows[0][0]) if rows else 0


def _event(row: sqlite3.Row) -> dict[str, Any]:
    event = dict(row)
    try:
        event["data"] = json.loads(event["data"] or "{}")
    except ValueError:
        event["data"] = {"raw": event["data"]}
    return event


async def backlog(conn: aiosqlite.Connection, now: int) -> dict[str, Any]:
    inputs = [
        {**dict(r), "oldest_age_ms": now - r["oldest_at"]}
        for r in await _rows(conn, "inputs", cap=LIST_CAP)
    ]
    recoveries = [
        {**dict(r), "parked": r["recovery_error"] is not None}
        for r in await _rows(conn, "recoveries", cap=LIST_CAP)
    ]
    summary = {
        status: await _count(conn, "summary_status_count", status=status)
        for status in ("pending", "in_progress", "failed")
    }
    summary["stale"] = await _count(conn, "summary_stale")
    summary["failed_rows"] = [dict(r) for r in await _rows(conn, "summary_failed", cap=50)]
    by_state = {
        state: await _count(conn, "dream_state_count", state=state)
        for state in ("pending", "in_progress", "deferred", "undigestible")
    }
    return {
        "inputs": inputs,
        "inputs_total": await _count(conn, "inputs_total"),
        "recoveries": recoveries,
        "summary_jobs": summary,
        "dream": {"pending": await _count(conn, "dream_pending"), "by_state": by_state},
    }


def _lease(kind: str, row: sqlite3.Row, lease_id: str, expires_at: int, phase: str | None,
           now: int) -> dict[str, Any]:
    alive = row["owner_state"] in ("running", "draining") and workers.heartbeat_alive(
        row["heartbeat_at"], now)
    return {
        "kind": kind, "id": lease_id, "session_id": row["session_id"],
        "owner_id": row["owner_id"], "epoch": row["epoch"], "phase": phase,
        "expires_at": expires_at, "time_left_ms": expires_at - now,
        "expired": expires_at <= now, "owner_alive": alive, "owner_state": row["owner_state"],
    }


async def leases(conn: aiosqlite.Connection, now: int) -> list[dict[str, Any]]:
    result = [
        _lease("execution", r, r["id"], r["expires_at"], r["phase"], now)
        for r in await _rows(conn, "execution_leases", cap=LIST_CAP * 4)
    ]
    for kind, query in (("summary_job", "summary_leases"), ("dream", "dream_leases")):
        result += [
            _lease(kind, r, r["session_id"], r["lease_expires_at"], None, now)
            for r in await _rows(conn, query, cap=LIST_CAP)
        ]
    result.sort(key=lambda lease: lease["expires_at"])
    return result


def receipt_keys(detail: Any) -> list[dict[str, Any]]:
    """The differing owned keys a verdict names, in one shape whatever wrote it."""
    if not isinstance(detail, dict):
        return []
    keys = detail.get("keys") or detail.get("differences") or []
    out = []
    for item in keys if isinstance(keys, list) else []:
        if isinstance(item, dict):
            out.append({k: item.get(k) for k in ("key", "expected", "actual", "reason")})
        else:
            out.append({"key": str(item), "expected": None, "actual": None, "reason": None})
    return out


async def receipts(conn: aiosqlite.Connection) -> dict[str, Any]:
    counts = {v: await _count(conn, "receipt_count", verdict=v) for v in RECEIPT_VERDICTS}
    counts["unchecked"] = await _count(conn, "receipt_unchecked")
    mismatched = []
    for r in await _rows(conn, "receipt_mismatched", cap=LIST_CAP):
        try:
            detail = json.loads(r["verdict_detail"]) if r["verdict_detail"] else {}
        except ValueError:
            detail = {}
        mismatched.append({
            "summary_id": summary_row_id(r["session_id"]), "session_id": r["session_id"],
            "verdict": r["verdict"], "keys": receipt_keys(detail), "detail": detail,
            "checked_at": r["verdict_checked_at"], "quarantine_reason": r["quarantine_reason"],
        })
    return {"counts": counts, "mismatched": mismatched}


def classify_drift(row: dict[str, Any]) -> str:
    """The class of one dream_state row that is not at its published revision."""
    state = row.get("digest_state")
    if state == "legacy":
        return "legacy_only"
    if state in ("deferred", "undigestible"):
        return str(state)
    if row.get("completed_revision") is not None:
        return "stale_completion"
    return "dream_pending"


async def dream_drift(conn: aiosqlite.Connection) -> tuple[list[dict[str, Any]], dict[str, int], int]:
    rows = [dict(r) for r in await _rows(conn, "dream_drift", cap=LIST_CAP)]
    rows += [dict(r) for r in await _rows(conn, "dream_legacy", cap=LIST_CAP)]
    drift = [{**r, "class": classify_drift(r)} for r in rows]
    seen = {d["session_id"] for d in drift}
    for r in await _rows(conn, "summary_stale_rows", cap=LIST_CAP):
        if r["session_id"] not in seen:
            drift.append({"session_id": r["session_id"], "class": "summary_stale",
                          "input_revision": None, "completed_revision": None,
                          "digest_state": None, "digest_attempts": 0, "defer_reason": None,
                          "since": r["since"]})
    counts = dict.fromkeys(DRIFT_CLASSES, 0)
    for d in drift:
        counts[d["class"]] += 1
    counts["summary_stale"] = await _count(conn, "summary_stale")
    counts["legacy_only"] = await _count(conn, "dream_state_count", state="legacy")
    return drift, counts, counts["legacy_only"]


async def worker_rows(conn: aiosqlite.Connection, now: int) -> list[dict[str, Any]]:
    rows = await _rows(conn, "workers", recent=now - RECENT_STOPPED_MS, cap=LIST_CAP)
    return [
        {**dict(r), "heartbeat_age_ms": now - r["heartbeat_at"],
         "alive": r["state"] != "stopped" and workers.heartbeat_alive(r["heartbeat_at"], now)}
        for r in rows
    ]


async def snapshot(conn: aiosqlite.Connection, now: int | None = None) -> dict[str, Any]:
    """Everything but Chroma health and identity, from one read transaction."""
    now = clock.now_ms() if now is None else now
    drift, drift_counts, legacy = await dream_drift(conn)
    lease_rows = await leases(conn, now)
    receipt_view = await receipts(conn)
    worker_view = await worker_rows(conn, now)
    back = await backlog(conn, now)
    snap = {
        "generated_at": now,
        "backlog": back,
        "leases": lease_rows,
        "receipts": receipt_view,
        "dream_drift": drift,
        "dream_counts": drift_counts,
        "legacy_only": legacy,
        "workers": worker_view,
        "recent_actions": [_event(r) for r in await _rows(conn, "recent_actions")],
        "events": [_event(r) for r in await _rows(conn, "events", tail=EVENT_TAIL)],
    }
    snap["counts"] = {
        "backlog": back["inputs_total"] + sum(1 for r in back["recoveries"] if not r["parked"])
        + back["summary_jobs"]["pending"] + back["dream"]["pending"],
        "expired_leases": sum(1 for lease in lease_rows if lease["expired"]),
        "mismatches": sum(v for k, v in receipt_view["counts"].items()
                          if k not in ("present", "unchecked")),
        "dream_pending": back["dream"]["pending"],
        "sessions": await _count(conn, "sessions"),
        "workers_alive": sum(1 for w in worker_view if w["alive"]),
    }
    return snap
