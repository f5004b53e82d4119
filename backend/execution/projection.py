"""Projecting a turn into the transcript: assistant rows, parts, supersession, context baselines.

The projection rule (docs/architecture.md#leases-epochs-and-fencing): a newer turn supersedes stale incomplete
assistant rows; an older assistant projection is never resumed; only the
assistant owned by the running execution is mutated. Every write here runs
inside a transaction that `leases.guard_sync` already fenced, and assistant
updates also require the row to still be `streaming`, so a closed row can
never be reopened. Raw turns (for the summarizer and Dream) are user rows
and assistant rows whose `data.status == "completed"`.
"""

from __future__ import annotations

import json
from typing import Any

from backend.core.errors import LeaseLost
from backend.execution.leases import Lease
from backend.execution.sessions import dumps
from backend.store.db import (
    Conn,
    Reader,
    execute_unread,
    executemany_unread,
    fenced_write,
    read_together_sync,
)
from backend.store.fencing import UNSAFE_NO_FENCING, fence_sql

# Assistant statuses: streaming (the owner is writing it), completed (a raw turn),
# superseded (closed by a newer turn or a recovery), interrupted (its stream broke;
# the next step re-asks), error (the agent failed).
ANSWERED = ("completed", "error")


def assistant_id(execution_id: str, step: int) -> str:
    """The id of a step's assistant row: derived, so a caller's id can never collide (`:`)."""
    return f"{execution_id}:{step}"


def continuation_id(execution_id: str) -> str:
    """The one continuation message of an interrupted execution: `recovery:<execution_id>`."""
    return f"recovery:{execution_id}"


def unanswered_prompts_sync(conn: Conn, session_id: str) -> list[dict[str, Any]]:
    """User rows after the newest answered assistant row: what the next step must answer."""
    row = conn.execute(
        "SELECT seq FROM session_message WHERE session_id = ? AND type = 'assistant' "
        "AND json_extract(data, '$.status') IN ('completed', 'error') ORDER BY seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    rows = conn.execute(
        "SELECT id, seq, data FROM session_message WHERE session_id = ? AND type = 'user' AND seq > ? "
        "ORDER BY seq",
        (session_id, row["seq"] if row else 0),
    ).fetchall()
    return [{"id": r["id"], "seq": r["seq"], "text": json.loads(r["data"]).get("text", "")} for r in rows]


def execution_started_turn_sync(conn: Conn, session_id: str, execution_id: str) -> bool:
    """Whether this execution already promoted its turn's first input (executions are serial)."""
    row = conn.execute(
        "SELECT data FROM session_message WHERE session_id = ? AND type = 'user' ORDER BY seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return row is not None and json.loads(row["data"]).get("execution_id") == execution_id


def interrupted_step_memory_sync(conn: Conn, session_id: str, execution_id: str) -> dict[str, Any] | None:
    """The memory recorded with the execution's newest interrupted (superseded) step: what its
    agent was given, for the recovered step to reuse; None when it recorded none."""
    row = conn.execute(
        "SELECT json_extract(data, '$.memory') FROM session_message "
        "WHERE session_id = ? AND type = 'assistant' AND json_extract(data, '$.execution_id') = ? "
        "AND json_extract(data, '$.status') = 'superseded' ORDER BY seq DESC LIMIT 1",
        (session_id, execution_id),
    ).fetchone()
    return json.loads(row[0]) if row is not None and row[0] is not None else None


def supersede_open_sync(conn: Conn, session_id: str, by: str, now: int) -> list[str]:
    """Close every incomplete assistant row of the session (a newer turn or recovery took over)."""
    superseded: list[str] = read_together_sync(conn, [supersede_open(session_id, by, now)])[0]
    return superseded


def supersede_open(session_id: str, by: str, now: int) -> Reader[list[str]]:
    """`supersede_open_sync` as a `Reader`, to be sent with other statements (`read_together_sync`)."""
    # INDEXED BY: without statistics the planner prefers (session_id, type, seq) and
    # would walk every assistant row of a long session
    # a streaming row's text lives in its parts (flushes never rewrite the row): closing
    # it records the text that was durable, so the transcript shows what was cut off
    (rows,) = yield [
        (
            "UPDATE session_message INDEXED BY session_message_open_assistant_idx SET time_updated = :now, "
            "data = json_set(data, '$.status', 'superseded', '$.superseded_by', :by, '$.text', "
            "(SELECT coalesce(group_concat(json_extract(p.data, '$.text'), ''), '') FROM "
            "(SELECT data FROM session_part WHERE message_id = session_message.id ORDER BY idx) AS p)) "
            "WHERE session_id = :sid AND type = 'assistant' AND json_extract(data, '$.status') = 'streaming' "
            "RETURNING id",
            {"now": now, "by": by, "sid": session_id},
        )
    ]
    return [r["id"] for r in rows]


def write_parts_sync(
    conn: Conn, message_id: str, session_id: str, first_idx: int, parts: list[str], now: int
) -> None:
    """Append streamed text parts to a message (ids derived from the message id and index)."""
    executemany_unread(
        conn,
        "INSERT INTO session_part (id, message_id, session_id, idx, type, time_created, data) "
        "VALUES (?, ?, ?, ?, 'text', ?, ?)",
        [
            (
                f"{message_id}:p{first_idx + i}",
                message_id,
                session_id,
                first_idx + i,
                now,
                dumps({"text": text}),
            )
            for i, text in enumerate(parts)
        ],
    )


# Streamed parts, many sessions' at once, in ONE statement: each row fenced on its own
# lease in the insert itself (no write to the lease rows: the renewal loop keeps them), so
# a lost lease drops only its own rows. One statement matters: the database thread
# retakes the GIL after every SQLite call, and on a busy event loop each retake waits.
PARTS_SQL = f"""
INSERT INTO session_part (id, message_id, session_id, idx, type, time_created, data)
SELECT j.value ->> 'pid', j.value ->> 'mid', j.value ->> 'sid', CAST(j.value ->> 'idx' AS INTEGER), 'text', :now,
       j.value ->> 'data'
FROM json_each(:rows) AS j
WHERE EXISTS (SELECT 1 FROM session_execution AS e WHERE e.id = j.value ->> 'eid'
              AND {fence_sql("e.", owner="j.value ->> 'owner'", epoch="CAST(j.value ->> 'epoch' AS INTEGER)")})
"""
WRITTEN_SQL = """
SELECT json_group_array(id) FROM session_part
WHERE id IN (SELECT j.value ->> 'pid' FROM json_each(:rows) AS j)
"""


def part_row(lease: Lease, message_id: str, idx: int, text: str) -> dict[str, Any]:
    """One part for `write_fenced_parts_sync`: its id, place, text and the lease that must still hold."""
    return {
        "pid": f"{message_id}:p{idx}",
        "mid": message_id,
        "sid": lease.session_id,
        "idx": idx,
        # encoded here, not by SQLite: its text functions stop at a NUL character
        "data": dumps({"text": text}),
        "eid": lease.execution_id,
        "owner": lease.owner_id,
        "epoch": lease.epoch,
    }


def write_fenced_parts_sync(conn: Conn, rows: list[dict[str, Any]], now: int) -> set[str]:
    """Insert the parts whose lease still holds; returns the ids written (the rest: lease lost)."""
    payload = dumps(rows)
    written = conn.execute(PARTS_SQL, {"rows": payload, "now": now}).rowcount
    if written == len(rows):
        return {row["pid"] for row in rows}
    return set(json.loads(conn.execute(WRITTEN_SQL, {"rows": payload}).fetchone()[0]))


def write_fenced_part_sync(conn: Conn, lease: Lease, message_id: str, idx: int, text: str, now: int) -> None:
    """Append one streamed part if `lease` is still held, else raise LeaseLost (nothing written)."""
    if not write_fenced_parts_sync(conn, [part_row(lease, message_id, idx, text)], now):
        raise LeaseLost(lease.lost_message())


def update_owned_assistant_sync(
    conn: Conn, message_id: str, data: dict[str, Any], now: int, *, unread: bool = False
) -> None:
    """Rewrite the running execution's own assistant row; a closed row is never reopened.

    `unread` as for `leases.guard_sync` (PostgreSQL: no round trip of its own).
    """
    # the broken build of fencing.UNSAFE_NO_FENCING drops this guard too (drills must catch it)
    still_open = "" if UNSAFE_NO_FENCING else " AND json_extract(data, '$.status') = 'streaming'"
    sql = f"UPDATE session_message SET data = ?, time_updated = ? WHERE id = ? AND type = 'assistant'{still_open}"
    params = (dumps(data), now, message_id)
    lost = f"assistant {message_id} is no longer open for this execution"
    fenced_write(conn, sql, params, lost, unread=unread)


# The session's context baseline (the system prompt and agent snapshot a turn started from)
# lives in opencode's `session_context_epoch` table; "epoch" in rem's own names is the lease fence.
CONTEXT_BASELINE_SQL = (
    "INSERT INTO session_context_epoch (session_id, baseline, snapshot, baseline_seq, time_updated) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET baseline = excluded.baseline, "
    "snapshot = excluded.snapshot, baseline_seq = excluded.baseline_seq, "
    "time_updated = excluded.time_updated "
    "WHERE excluded.baseline_seq > session_context_epoch.baseline_seq "
    "AND (excluded.snapshot != session_context_epoch.snapshot "
    "OR excluded.baseline != session_context_epoch.baseline)"
)


def _context_baseline_params(
    session_id: str, baseline: str, snapshot: dict[str, Any], seq: int, now: int
) -> tuple[Any, ...]:
    snap = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
    return (session_id, baseline, snap, seq, now)


def record_context_baseline_sync(
    conn: Conn, session_id: str, baseline: str, snapshot: dict[str, Any], seq: int, now: int
) -> bool:
    """Create the session's context baseline, or move it forward when the context changed."""
    params = _context_baseline_params(session_id, baseline, snapshot, seq, now)
    return conn.execute(CONTEXT_BASELINE_SQL, params).rowcount > 0


def queue_context_baseline_sync(
    conn: Conn, session_id: str, baseline: str, snapshot: dict[str, Any], seq: int, now: int
) -> None:
    """`record_context_baseline_sync` unread (PostgreSQL: no round trip of its own), for a caller
    that does not ask whether it moved (the executor at a turn start)."""
    execute_unread(
        conn, CONTEXT_BASELINE_SQL, _context_baseline_params(session_id, baseline, snapshot, seq, now)
    )


def transcript_violations_sync(conn: Conn, session_id: str | None = None) -> list[dict[str, Any]]:
    """Breaches of the turn invariants (1 and 3 in docs/architecture.md) in the stored transcript; [] when all hold.

    Checks: every promoted input is exactly one `user` row with the input's
    id and its promoted seq; no user row without its input; one continuation
    per recovery and none without one; no open (`streaming`) assistant row
    that no live execution owns; no user row answered twice; and, for
    sessions with no execution in progress, no promoted user row left
    unanswered. Reads only; O(messages) of the sessions checked.
    """
    params = {"sid": session_id}
    return (
        _input_violations_sync(conn, params)
        + _continuation_violations_sync(conn, params)
        + _answer_violations_sync(conn, params)
    )


def _violation(kind: str, session_id: str | None, item: str, detail: str = "") -> dict[str, Any]:
    return {"kind": kind, "session_id": session_id, "id": item, "detail": detail}


def _input_violations_sync(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT i.session_id, i.id, i.promoted_seq, m.seq FROM session_input AS i "
        "LEFT JOIN session_message AS m ON m.id = i.id "
        "WHERE i.promoted_seq IS NOT NULL AND (:sid IS NULL OR i.session_id = :sid) "
        "AND (m.id IS NULL OR m.type != 'user' OR m.seq != i.promoted_seq)",
        params,
    ).fetchall()
    found = [
        _violation(
            "input_not_projected",
            r["session_id"],
            r["id"],
            f"promoted at seq {r['promoted_seq']}, message seq {r['seq']}",
        )
        for r in rows
    ]
    rows = conn.execute(
        "SELECT m.session_id, m.id FROM session_message AS m LEFT JOIN session_input AS i ON i.id = m.id "
        "WHERE m.type = 'user' AND (:sid IS NULL OR m.session_id = :sid) "
        "AND (i.id IS NULL OR i.promoted_seq IS NOT m.seq)",
        params,
    ).fetchall()
    return found + [_violation("user_message_without_input", r["session_id"], r["id"]) for r in rows]


def _continuation_violations_sync(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT m.session_id, m.id, json_extract(m.data, '$.execution_id'), r.execution_id "
        "FROM session_message AS m LEFT JOIN session_recovery AS r ON r.continuation_message_id = m.id "
        "WHERE m.type = 'synthetic' AND (:sid IS NULL OR m.session_id = :sid)",
        params,
    ).fetchall()
    found = []
    per_execution: dict[str, int] = {}
    for sid, mid, eid, rid in rows:
        per_execution[eid] = per_execution.get(eid, 0) + 1
        if rid is None or mid != continuation_id(rid):
            found.append(_violation("continuation_without_recovery", sid, mid))
    return found + [
        _violation("several_continuations", None, eid, f"{n} messages")
        for eid, n in per_execution.items()
        if n > 1
    ]


def _answer_violations_sync(conn: Conn, params: dict[str, Any]) -> list[dict[str, Any]]:
    live = dict(
        conn.execute(
            "SELECT session_id, assistant_message_id FROM session_execution "
            "WHERE :sid IS NULL OR session_id = :sid",
            params,
        ).fetchall()
    )
    owned = set(live.values())
    answered: dict[str, int] = {}
    found, users = [], []
    for sid, mid, kind, raw in conn.execute(
        "SELECT session_id, id, type, data FROM session_message WHERE (:sid IS NULL OR session_id = :sid) "
        "AND type IN ('user', 'assistant')",
        params,
    ):
        if kind == "user":
            users.append((sid, mid))
            continue
        data = json.loads(raw)
        if data.get("status") == "streaming" and mid not in owned:
            found.append(_violation("open_assistant_without_execution", sid, mid, "never closed, not owned"))
        if data.get("status") in ANSWERED:
            for uid in data.get("answers", []):
                answered[uid] = answered.get(uid, 0) + 1
    for sid, uid in users:
        count = answered.get(uid, 0)
        if count > 1:
            found.append(_violation("answered_twice", sid, uid, f"{count} replies"))
        elif count == 0 and sid not in live:
            found.append(_violation("unanswered", sid, uid, "promoted, no execution in progress, no reply"))
    return found
