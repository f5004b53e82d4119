"""The status snapshot kept to some projects (`GET /v1/status` for a token of named projects).

Every listed row that names a session (a backlog item, a hold, a lease, a receipt, a drift row,
a session's usage, a tool call waiting, a journal row) is kept only when its session is in one
of the projects; journal rows that name no session (operator actions on workers, tokens) are
left out too. The rest is the fleet's own health, shared by every project and naming none of
them: workers, Chroma, the model endpoint, the schema, and the figures (counts, totals,
throughput), which stay fleet-wide. The shape is `rem status --json`'s, unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable
from typing import Any

from backend.ops.records import Status
from backend.store.db import Conn

# the lists of session-bound rows, by their path in the snapshot
SESSION_LISTS: tuple[tuple[str, ...], ...] = (
    ("backlog", "inputs"),
    ("backlog", "held"),
    ("backlog", "recoveries"),
    ("backlog", "summary_jobs", "failed_rows"),
    ("leases",),
    ("receipts", "mismatched"),
    ("dream_drift",),
    ("usage", "sessions"),
    ("tools", "awaiting_approval"),
    ("tools", "unknown_outcome"),
    ("tools", "running"),
    ("recent_actions",),
    ("events",),
)
CHUNK = 500


def _lists(status: Any) -> Iterable[tuple[dict[str, Any], str]]:
    """(the dict holding a list, the list's key) for every session-bound list."""
    for path in SESSION_LISTS:
        holder = status
        for key in path[:-1]:
            holder = holder[key]
        yield holder, path[-1]


def listed_sessions(status: Status) -> set[str]:
    """Every session id a listed row names."""
    ids = {
        row["session_id"] for holder, key in _lists(status) for row in holder[key] if row.get("session_id")
    }
    last = status["model"]["last_error"]
    if last is not None and last["session_id"]:
        ids.add(last["session_id"])
    return ids


def sessions_in_sync(conn: Conn, ids: Collection[str], projects: Collection[str]) -> set[str]:
    """The sessions of `ids` whose project is one of `projects` (in chunks: bounded statements)."""
    names, wanted = sorted(ids), set(projects)
    kept: set[str] = set()
    for start in range(0, len(names), CHUNK):
        chunk = names[start : start + CHUNK]
        rows = conn.execute(
            f"SELECT id, project FROM session WHERE id IN ({', '.join('?' * len(chunk))})", chunk
        ).fetchall()
        kept.update(row[0] for row in rows if row[1] in wanted)
    return kept


def keep_to(status: Status, reached: set[str]) -> Status:
    """A copy of the snapshot with only the rows of sessions in `reached` (see the module doc)."""
    # a copy: the snapshot's rows may be the status cache's own, reused by the next snapshot
    status = copy.deepcopy(status)
    for holder, key in _lists(status):
        holder[key] = [row for row in holder[key] if row.get("session_id") in reached]
    last = status["model"]["last_error"]
    if last is not None and last["session_id"] not in reached:
        last["session_id"] = None
    return status
