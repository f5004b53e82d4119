"""The status snapshot: what the console renders and `rem status --json` prints.

Every query here is served by an index (see `status_queries.STATUS_QUERIES` and
tests/backend/test_status.py, which asserts no query plan scans a large
table), and all of them run inside one short read transaction so the
snapshot is consistent. Lists are capped at what a panel can show
(`LIST_CAP` rows, most urgent first), so a snapshot's cost follows the
screen, not the size of the fleet.

Incremental: a `SnapshotCache` (one per `Database`, see `ops.status`) keeps
what the last snapshot read, keyed by `PRAGMA data_version` and the
connection's own `total_changes`. While neither moved (nothing committed
since), the rows are reused and only what depends on the clock (ages, time
left, expiry, liveness, the totals) is computed again.

A console asks for fewer rows (`ListLimits`): what its panels show, so its
refresh reads a screenful of each list that grows with the data (the
backlog, mismatched receipts, drift, the journal, sessions by cost); the
lists that grow with the fleet (leases, workers) are read whole up to
`LIST_CAP`.

On PostgreSQL the read transaction is REPEATABLE READ READ ONLY (one
snapshot, as SQLite's), and its statements, known before it runs
(`snapshot_reads.snapshot_reads_sync`), go out in one round trip with its BEGIN
(`db.read_ahead_sync`); a statement not read ahead is sent on its own in the
same transaction.

After a commit, what is read again costs the same at any size: every count
is a `status_count` counter, kept by triggers in the transaction that
changed the rows (backend/store/counters.py; one read of a small table),
and every list is read in the order its panel shows it from an index, up to
`LIST_CAP` rows. What still grows is what an incident is made of: expired
leases are counted by a range of the expiry index, recoveries and leases in
progress by theirs.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, cast

from backend.chroma.ownership import summary_row_id
from backend.core import clock
from backend.execution.leases import ExecutionPhase
from backend.memory.index import IndexLag, index_lag_sync
from backend.ops import api_status, model_health, tool_status
from backend.ops.records import (
    Backlog,
    DreamBacklog,
    DriftRecord,
    EventRecord,
    FailedSummary,
    InputBacklog,
    KeyDiff,
    LeaseRecord,
    ReceiptMismatch,
    Receipts,
    RecoveryBacklog,
    Snapshot,
    SummaryJobs,
    WorkerRecord,
)
from backend.ops.status_queries import (
    EVENT_TAIL,
    FAILED_SUMMARIES,
    LIST_CAP,
    LIST_QUERIES,
    RECENT_ACTIONS,
    Window,
    rows_sync,
)
from backend.ops.totals import totals_sync
from backend.store import counters, workers
from backend.store.db import Conn, engine_of
from backend.store.states import DRIFT_CLASSES, TOOL_HOLDS, DigestState, DriftClass, JobStatus, classify_drift
from backend.store.workers import LeaseKind, WorkerRole, WorkerState
from backend.summaries.receipts import MISMATCHES, ReceiptVerdict


@dataclass(frozen=True)
class ListLimits:
    """The rows a snapshot reads of each list that grows with the data (`rem status`: the defaults).

    A console asks for what its panels show, so its refresh reads a screenful at any size;
    what it counts comes from the counters and totals. `backlog` is the Backlog panel's
    rows in its order (tool calls waiting, then running, held sessions, recoveries parked first, failed
    summaries, inputs), read in that order until there are `backlog` of them; None keeps
    `rem status`'s cap of each.
    """

    backlog: int | None = None
    mismatched: int = LIST_CAP
    drift: int = LIST_CAP
    events: int = EVENT_TAIL
    actions: int = RECENT_ACTIONS
    sessions: int = model_health.USAGE_CAP


# the summary-job and Dream states counted one by one
JOB_COUNTED: tuple[JobStatus, ...] = (JobStatus.PENDING, JobStatus.IN_PROGRESS, JobStatus.FAILED)
DREAM_COUNTED: tuple[DigestState, ...] = (
    DigestState.PENDING,
    DigestState.IN_PROGRESS,
    DigestState.DEFERRED,
    DigestState.UNDIGESTIBLE,
    DigestState.LEGACY,
)

# Workers stopped within this window still show (so a SIGKILLed daemon is visible).
RECENT_STOPPED_MS = 10 * 60_000


def _counts_sync(conn: Conn) -> dict[str, Any]:
    """Every count of the snapshot: the counters (one read of `status_count`)."""
    plain, keyed = counters.counts_sync(conn)
    return {**plain, "execution_held": keyed["execution_held"], "tool_calls": keyed["tool_calls"]}


E = TypeVar("E", bound=StrEnum)


def _members(enum: type[E]) -> dict[Any, E]:
    """Value -> member: a dict lookup, ~10x cheaper than `enum(value)` over thousands of rows.

    (Per-row code here also avoids `Enum.MEMBER` attribute access, ~0.5 us on Python 3.11.)
    """
    return {member.value: member for member in enum}


_KIND, _PHASE = _members(LeaseKind), _members(ExecutionPhase)
_ROLE, _STATE = _members(WorkerRole), _members(WorkerState)
_DIGEST, _VERDICT = _members(DigestState), _members(ReceiptVerdict)


def _event(row: dict[str, Any]) -> EventRecord:
    try:
        data = json.loads(row["data"] or "{}")
    except ValueError:
        data = {"raw": row["data"]}
    return {
        "id": row["id"],
        "time": row["time"],
        "kind": row["kind"],
        "actor": row["actor"],
        "session_id": row["session_id"],
        "target": row["target"],
        "data": data,
    }


def _inputs_rows_sync(conn: Conn, cap: int = LIST_CAP) -> list[dict[str, Any]]:
    """The `cap` sessions whose oldest waiting input is oldest, with their waiting inputs."""
    if cap <= 0:
        return []
    # PostgreSQL: each row comes with its session's count (`inputs_oldest_counted`): no second
    # round trip, and the first is read ahead; SQLite reads the counts after, only when needed
    counted = engine_of(conn) == "postgresql"
    scan = cap  # one input per session (the usual case): exactly the rows listed
    while True:
        rows = conn.execute(LIST_QUERIES[OLDEST_INPUTS[counted]], {"scan": scan}).fetchall()
        seen: dict[str, list[int]] = {}  # session -> [waiting read, oldest, waiting], in order of oldest
        for row in rows:
            entry = seen.get(row[0])
            if entry is None:
                seen[row[0]] = [1, row[1], row[2] if counted else 0]
            else:
                entry[0] += 1
        complete = len(rows) < scan  # every waiting input was read
        # enough sessions, or all of them (a few sessions with many inputs: read wider)
        if complete or len(seen) >= cap:
            break
        scan *= 4
    sessions = list(seen)[:cap]
    if complete or counted:  # the counts are whole already
        return [
            {"session_id": s, "pending": seen[s][2 if counted else 0], "oldest_at": seen[s][1]}
            for s in sessions
        ]
    if not sessions:
        return []
    by_session = {r["session_id"]: r for r in rows_sync(conn, "inputs", sessions=json.dumps(sessions))}
    return [by_session[s] for s in sessions]


# the first read of the waiting inputs, by whether each row carries its session's count
OLDEST_INPUTS = {False: "inputs_oldest", True: "inputs_oldest_counted"}


def _index_lag_sync(conn: Conn, cache: SnapshotCache, now: int) -> IndexLag:
    """The recall index's lag: read with the rows (until a commit), its age moved with the clock."""
    read = cache.rows.get("index_lag")
    if read is None:
        counts = cache.counts
        lag = index_lag_sync(conn, now, counts["index_behind"], counts["vectors_pending"])
        read = cache.rows["index_lag"] = (lag, now)
    lag, at = read
    return {**lag, "oldest_ms": lag["oldest_ms"] + (now - at) if lag["oldest_ms"] else 0}


def backlog_sync(conn: Conn, cache: SnapshotCache, counts: dict[str, int], now: int) -> Backlog:
    inputs: list[InputBacklog] = [
        {
            "session_id": r["session_id"],
            "pending": r["pending"],
            "oldest_at": r["oldest_at"],
            "oldest_age_ms": now - r["oldest_at"],
        }
        for r in cache.rows["inputs"]
    ]
    recoveries: list[RecoveryBacklog] = [
        {
            "execution_id": r["execution_id"],
            "session_id": r["session_id"],
            "phase": _PHASE[r["phase"]],
            "wake_attempts": r["wake_attempts"],
            "recovery_error": r["recovery_error"],
            "time_created": r["time_created"],
            "parked": r["recovery_error"] is not None,
        }
        for r in cache.rows["recoveries"]
    ]
    summary = SummaryJobs(
        pending=counts["summary_pending"],
        in_progress=counts["summary_in_progress"],
        failed=counts["summary_failed"],
        stale=counts["summary_stale"],
        failed_rows=[cast(FailedSummary, dict(r)) for r in cache.rows["summary_failed"]],
    )
    by_state: dict[DigestState, int] = {
        s: counts[f"dream_state_{s}"] for s in DREAM_COUNTED if s is not DigestState.LEGACY
    }
    return Backlog(
        inputs=inputs,
        inputs_total=counts["inputs_total"],
        # sessions a model error holds for an operator (`rem resume`); their inputs wait asleep
        held=model_health.held_records(cache.rows["held"], now),
        recoveries=recoveries,
        summary_jobs=summary,
        dream=DreamBacklog(pending=counts["dream_pending"], by_state=by_state),
        index=_index_lag_sync(conn, cache, now),
    )


def leases_sync(rows: list[dict[str, Any]], now: int) -> list[LeaseRecord]:
    """The listed execution, summary-job and Dream leases (soonest expiry first), as of `now`."""
    kinds, phases, states, alive = _KIND, _PHASE.get, _STATE.get, workers.worker_alive
    out: list[LeaseRecord] = []
    for r in rows:
        expires_at = r["expires_at"]
        owner_state = states(r["owner_state"])
        parked = r["parked"] if r["parked"] in TOOL_HOLDS else None
        out.append(
            {
                "kind": kinds[r["kind"]],
                "id": r["id"],
                "session_id": r["session_id"],
                "owner_id": r["owner_id"],
                "epoch": r["epoch"],
                "phase": phases(r["phase"]),
                "expires_at": expires_at,
                "owner_state": owner_state,
                "time_left_ms": expires_at - now,
                "expired": expires_at <= now and parked is None,
                "owner_alive": alive(owner_state, r["heartbeat_at"], r["exited_at"], now),
                "parked": parked,
            }
        )
    return out


def receipt_keys(detail: Any) -> list[KeyDiff]:
    """The differing owned keys a verdict names, in one shape whatever wrote it."""
    if not isinstance(detail, dict):
        return []
    keys = detail.get("keys") or detail.get("differences") or []
    out: list[KeyDiff] = []
    for item in keys if isinstance(keys, list) else []:
        if isinstance(item, dict):
            out.append(
                {
                    "key": cast(str, item.get("key")),  # as stored, even if malformed
                    "expected": item.get("expected"),
                    "actual": item.get("actual"),
                    "reason": item.get("reason"),
                }
            )
        else:
            out.append(KeyDiff(key=str(item), expected=None, actual=None, reason=None))
    return out


def mismatches_sync(
    conn: Conn, known: dict[tuple[Any, ...], ReceiptMismatch] | None = None, cap: int = LIST_CAP
) -> tuple[list[ReceiptMismatch], dict[tuple[Any, ...], ReceiptMismatch]]:
    """The listed mismatched receipts, most recently checked first, and each by its row.

    A row read before (the same verdict, detail, check time and reason: `known`,
    from the last snapshot) is not decoded again.
    """
    known = known or {}
    mismatched: list[ReceiptMismatch] = []
    by_row: dict[tuple[Any, ...], ReceiptMismatch] = {}
    for r in rows_sync(conn, "receipt_mismatched", cap=cap):
        row_key = tuple(r.values())
        record = known.get(row_key)
        if record is None:
            try:
                detail = json.loads(r["verdict_detail"]) if r["verdict_detail"] else {}
            except ValueError:
                detail = {}
            record = {
                "summary_id": summary_row_id(r["session_id"]),
                "session_id": r["session_id"],
                "verdict": _VERDICT[r["verdict"]],  # the query selects mismatch verdicts only
                "keys": receipt_keys(detail),
                "detail": detail,
                "checked_at": r["verdict_checked_at"],
                "quarantine_reason": r["quarantine_reason"],
            }
        by_row[row_key] = record
        mismatched.append(record)
    return mismatched, by_row


def _drift(r: dict[str, Any], klass: DriftClass) -> DriftRecord:
    return {
        "session_id": r["session_id"],
        "input_revision": r["input_revision"],
        "completed_revision": r["completed_revision"],
        "digest_state": _DIGEST.get(r["digest_state"]),
        "digest_attempts": r["digest_attempts"],
        "defer_reason": r["defer_reason"],
        "since": r["since"],
        "class": klass,
    }


def dream_drift_sync(
    conn: Conn, counts: dict[str, int], window: int | None = None, taken: dict[str, int] | None = None
) -> tuple[list[DriftRecord], dict[DriftClass, int]]:
    """The drift rows (drifting, legacy, then summary-stale sessions not listed yet) and the count
    of each class; `window`: the rows of all three together (None: `LIST_CAP` of each); `taken`
    gets the rows each query read."""
    read = Window(window)
    rows = read.rows(conn, "dream_drift", LIST_CAP) + read.rows(conn, "dream_legacy", LIST_CAP)
    drift = [_drift(r, classify_drift(r)) for r in rows]
    seen = {d["session_id"] for d in drift}
    for r in read.rows(conn, "summary_stale_rows", LIST_CAP):
        if r["session_id"] not in seen:
            stale = {
                "session_id": r["session_id"],
                "input_revision": None,
                "completed_revision": None,
                "digest_state": None,
                "digest_attempts": 0,
                "defer_reason": None,
                "since": r["since"],
            }
            drift.append(_drift(stale, DriftClass.SUMMARY_STALE))
    if taken is not None:
        taken.update(read.taken)
    by_class: dict[DriftClass, int] = dict.fromkeys(DRIFT_CLASSES, 0)
    for d in drift:
        by_class[d["class"]] += 1
    # the listed rows are capped; the totals of the big classes come from the counts
    by_class[DriftClass.SUMMARY_STALE] = counts["summary_stale"]
    by_class[DriftClass.LEGACY_ONLY] = counts["dream_state_legacy"]
    by_class[DriftClass.DEFERRED] = counts["dream_state_deferred"]
    by_class[DriftClass.UNDIGESTIBLE] = counts["dream_state_undigestible"]
    if window is not None:
        # a window lists few: pending and stale completions together are the rows Dream has yet
        # to digest (pending or in progress), counted; the listed ones say which are which
        waiting = counts["dream_state_pending"] + counts["dream_state_in_progress"]
        stale_done = by_class[DriftClass.STALE_COMPLETION]
        by_class[DriftClass.DREAM_PENDING] = max(by_class[DriftClass.DREAM_PENDING], waiting - stale_done)
    return drift, by_class


def worker_rows_sync(conn: Conn, now: int) -> list[WorkerRecord]:
    return [
        {
            "owner_id": r["owner_id"],
            "role": _ROLE[r["role"]],
            "pid": r["pid"],
            "host": r["host"],
            "state": _STATE[r["state"]],
            "started_at": r["started_at"],
            "heartbeat_at": r["heartbeat_at"],
            "heartbeat_age_ms": now - r["heartbeat_at"],
            "exited_at": r["exited_at"],
            "alive": workers.worker_alive(r["state"], r["heartbeat_at"], r["exited_at"], now),
        }
        for r in rows_sync(conn, "workers", recent=now - RECENT_STOPPED_MS, cap=LIST_CAP)
    ]


@dataclass
class SnapshotCache:
    """What the last snapshot read from state.db, reused while nothing was committed since.

    `key` is (`PRAGMA data_version`, the connection's `total_changes`): the
    first moves when another connection commits, the second when this one
    does. `counts` are the counters; `rows` holds each list query's rows (or
    what was built from them that does not depend on the clock).
    """

    key: tuple[int, int] | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    rows: dict[str, Any] = field(default_factory=dict)
    limits: ListLimits | None = None  # what `rows` were read with
    hits: int = 0
    misses: int = 0


def _change_key(conn: Conn) -> tuple[int, int] | None:
    """What moves when anything is committed: None where the engine offers nothing (never reused).

    Read before anything else: a commit landing after it is seen by the next call.
    """
    if not isinstance(conn, sqlite3.Connection):
        return None
    return int(conn.execute("PRAGMA data_version").fetchone()[0]), conn.total_changes


def _read_rows_sync(conn: Conn, cache: SnapshotCache, limits: ListLimits | None) -> None:
    """Every list and count that does not depend on the clock, into the cache."""
    counts = _counts_sync(conn)
    rows = cache.rows
    lists = limits or ListLimits()
    taken: dict[str, int] = {}  # the rows each windowed list read (`snapshot_reads_sync` guesses with them)
    _backlog_rows_sync(conn, rows, lists.backlog, taken)
    rows["leases"] = rows_sync(conn, "leases", cap=LIST_CAP)
    rows["mismatched"], rows["mismatched_by_row"] = mismatches_sync(
        conn, rows.get("mismatched_by_row"), lists.mismatched
    )
    rows["drift"] = dream_drift_sync(conn, counts, None if limits is None else lists.drift, taken)
    rows["taken"] = taken
    rows["recent_actions"] = [_event(r) for r in rows_sync(conn, "recent_actions", cap=lists.actions)]
    rows["events"] = [_event(r) for r in rows_sync(conn, "events", tail=lists.events)]
    rows["usage"] = model_health.usage_sync(conn, counts, lists.sessions)
    rows.pop("index_lag", None)  # read again at its next use
    cache.counts = counts
    cache.limits = limits
    rows["totals"] = {}  # the clockless totals, read again at their next use


def _backlog_rows_sync(conn: Conn, rows: dict[str, Any], window: int | None, taken: dict[str, int]) -> None:
    """The Backlog panel's lists, in its order: each to its cap, or (`window`) that many rows in all;
    `taken` gets the rows each list read."""
    read = Window(window)
    tools: dict[str, list[dict[str, Any]]] = {}
    for name, sql in tool_status.CALL_QUERIES.items():
        tools.update(tool_status.waiting_rows_sync(conn, read.cap(LIST_CAP), {name: sql}))
        read.took(len(tools[name]), name)
    rows["tools"] = {**tools, **tool_status.server_rows_sync(conn, LIST_CAP)}
    rows["held"] = model_health.held_rows_sync(conn, read.cap(model_health.USAGE_CAP))
    read.took(len(rows["held"]), "held")
    if window is None:  # `rem status` lists as many as it counts
        rows["held_count"] = len(rows["held"])
        rows["recoveries"] = read.rows(conn, "recoveries", LIST_CAP)
    else:
        rows["held_count"] = int(conn.execute(LIST_QUERIES["held_count"]).fetchone()[0])
        rows["recoveries"] = read.rows(conn, "recoveries_parked_first", LIST_CAP)
    rows["summary_failed"] = read.rows(conn, "summary_failed", FAILED_SUMMARIES)
    rows["inputs"] = _inputs_rows_sync(conn, read.cap(LIST_CAP))
    taken.update(read.taken)


def snapshot_sync(
    conn: Conn, now: int | None = None, cache: SnapshotCache | None = None, limits: ListLimits | None = None
) -> Snapshot:
    """Everything but Chroma health and identity; run it inside one read transaction.

    With a `cache` (kept between calls on the same connection), what has not
    changed since the last call is not read again. `limits`: the rows read of
    each list (`ListLimits`; None: `rem status`'s).
    """
    now = clock.now_ms() if now is None else now
    cache = SnapshotCache() if cache is None else cache
    key = _change_key(conn)
    if key is None or key != cache.key or not cache.rows or limits != cache.limits:
        _read_rows_sync(conn, cache, limits)
        cache.key = key
        cache.misses += 1
    else:
        cache.hits += 1
    counts = cache.counts
    rows = cache.rows
    drift, drift_counts = rows["drift"]
    worker_view = worker_rows_sync(conn, now)
    total = totals_sync(conn, now, counts, rows["totals"])
    back = backlog_sync(conn, cache, counts, now)
    snapshot: Snapshot = {
        "generated_at": now,
        "backlog": back,
        "leases": leases_sync(rows["leases"], now),
        "receipts": Receipts(
            counts={v: counts[f"receipt_{v}"] for v in (*ReceiptVerdict, "unchecked")},
            mismatched=list(rows["mismatched"]),
        ),
        "dream_drift": list(drift),
        "dream_counts": dict(drift_counts),
        "legacy_only": counts["dream_state_legacy"],
        "workers": worker_view,
        "model": model_health.model_health_sync(conn, now),
        "usage": rows["usage"],
        "recent_actions": list(rows["recent_actions"]),
        "events": list(rows["events"]),
        "totals": total,
        "counts": {
            "backlog": sum(total["backlog"].values()),
            "expired_leases": sum(t["expired"] for t in total["leases"].values()),
            "mismatches": sum(counts[f"receipt_{v}"] for v in MISMATCHES),
            "dream_pending": counts["dream_pending"],
            "sessions": counts["sessions"],
            "held": rows["held_count"],
            "workers_alive": sum(1 for w in worker_view if w["alive"]),
        },
        "tools": tool_status.tool_calls(rows["tools"], counts["tool_calls"], now),
        # read at every snapshot, like the workers: each server's heartbeat rewrites its row
        "api": api_status.servers_sync(conn, now),
    }
    return snapshot
