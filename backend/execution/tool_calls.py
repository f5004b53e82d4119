"""An agent's tool calls as durable rows (`tool_call`): every write of a call's life, fenced.

A step whose reply asks for tools closes (`backend.execution.steps`) with one
`tool_call` row per call, inserted in that same fenced transaction, so **the
arguments are durable before anything runs**. Each row carries a copy of the
execution lease's fence, `(owner_id, epoch)`: the lease it last moved under
(`TOOL_CALL`, a `backend.store.fencing.FencedTable`). Its life:

* inserted `pending` (allowed, or an unknown tool / bad arguments: `error`
  at once), `awaiting_approval` (permission `ask`), or `denied` (`deny`);
* `start_sync`: `running`, `starts + 1` and the lease's fence, committed
  **before** the request is sent (the transaction begins with `guard_sync`,
  so a lost lease starts nothing);
* `finish_sync`: the outcome, written only while the row still carries this
  lease's fence (`write_row_sync`): a lost lease writes nothing;
* `settle_takeover_sync`: the new owner's first act on a taken-over turn:
  `running` read/idempotent calls go back to `pending` (they run again with
  the same key); a `running` effect becomes `unknown` (journaled
  `tool.outcome_unknown`): nothing runs it again without an operator.

The call's id and idempotency key are derived from (session, execution,
step, index): stable across every re-run of the same call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from backend.core.settings import settings
from backend.execution.leases import Lease
from backend.store import fencing
from backend.store.db import Conn, Row
from backend.store.events import EventKind, append_event_sync
from backend.store.states import TERMINAL_STATES, ToolCallState
from backend.tools.results import TRUNCATED_NOTE, utf8_prefix

TOOL_CALL = fencing.FencedTable(name="tool_call", key="id")

OPEN_STATES = ("pending", "awaiting_approval", "running", "unknown")


def call_id(execution_id: str, step: int, idx: int) -> str:
    """rem's id of a call: `call_` and a short hash of where it was asked."""
    return "call_" + hashlib.sha256(f"{execution_id}:{step}:{idx}".encode()).hexdigest()[:16]


def idempotency_key(session_id: str, execution_id: str, step: int, idx: int) -> str:
    """The key every run of one call sends (`_meta["rem/idempotency_key"]`): stable across re-runs."""
    return "rem:" + hashlib.sha256(f"{session_id}:{execution_id}:{step}:{idx}".encode()).hexdigest()[:40]


@dataclass(kw_only=True)
class PlannedCall:
    """One call of a step, as its closing transaction inserts it."""

    idx: int
    model_call_id: str
    tool: str  # NAME.TOOL (or the name the model gave, for an unknown tool)
    arguments: str  # JSON text
    effect: str
    effect_source: str
    permission: str
    state: ToolCallState
    result: str | None = None  # an error/denial text, for a call that never runs
    timeout_ms: int | None = None


def insert_sync(
    conn: Conn, lease: Lease, step: int, message_id: str, calls: Sequence[PlannedCall], now: int
) -> list[str]:
    """Insert a step's calls (inside its closing, fenced transaction); their ids."""
    ids = []
    for call in calls:
        cid = call_id(lease.execution_id, step, call.idx)
        terminal = call.state in (ToolCallState.ERROR, ToolCallState.DENIED)
        conn.execute(
            "INSERT INTO tool_call (id, session_id, execution_id, message_id, step, idx, model_call_id, tool, "
            "arguments, effect, effect_source, permission, state, idempotency_key, owner_id, epoch, result, "
            "result_bytes, is_error, time_created, time_finished, time_updated) VALUES (?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                cid,
                lease.session_id,
                lease.execution_id,
                message_id,
                step,
                call.idx,
                call.model_call_id,
                call.tool,
                call.arguments,
                call.effect,
                call.effect_source,
                call.permission,
                call.state,
                idempotency_key(lease.session_id, lease.execution_id, step, call.idx),
                lease.owner_id,
                lease.epoch,
                call.result,
                None if call.result is None else len(call.result.encode()),
                int(terminal),
                now,
                now if terminal else None,
                now,
            ),
        )
        ids.append(cid)
    return ids


def open_calls_sync(conn: Conn, execution_id: str) -> list[Row]:
    """The execution's calls not yet terminal, in the order they were asked."""
    return list(
        conn.execute(
            "SELECT * FROM tool_call WHERE execution_id = ? AND state IN "
            "('pending', 'awaiting_approval', 'running', 'unknown') ORDER BY step, idx",
            (execution_id,),
        ).fetchall()
    )


def start_sync(conn: Conn, lease: Lease, ids: Sequence[str], now: int) -> list[Row]:
    """Commit `running` (+1 start, this lease's fence) for the pending calls `ids`; the rows started.

    The caller's transaction begins with `guard_sync` on `lease` (fenced whole).
    """
    started = []
    for cid in ids:
        row = conn.execute(
            "UPDATE tool_call SET state = 'running', starts = starts + 1, owner_id = ?, epoch = ?, "
            "time_started = ?, time_updated = ? WHERE id = ? AND state = 'pending' RETURNING *",
            (lease.owner_id, lease.epoch, now, now, cid),
        ).fetchone()
        if row is not None:
            started.append(row)
    return started


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How one run of a call ended, as its row records it."""

    state: ToolCallState
    result: str | None
    is_error: bool
    size_bytes: int | None = None
    truncated: bool = False
    reason: str | None = None


def finish_sync(conn: Conn, lease: Lease, cid: str, outcome: Outcome, now: int) -> None:
    """Write a started call's outcome while its row carries this lease's fence (else LeaseLost)."""
    fencing.write_row_sync(
        conn,
        TOOL_CALL,
        cid,
        lease.fence,
        "state = :state, result = :result, result_bytes = :bytes, result_truncated = :truncated, "
        "is_error = :is_error, reason = :reason, time_finished = :now, time_updated = :now",
        {
            "state": outcome.state,
            "result": outcome.result,
            "bytes": outcome.size_bytes,
            "truncated": int(outcome.truncated),
            "is_error": int(outcome.is_error),
            "reason": outcome.reason,
            "now": now,
        },
        lost=f"tool call {cid} is no longer held by {lease.owner_id} at epoch {lease.epoch}",
    )
    if outcome.state == ToolCallState.UNKNOWN:
        journal_unknown_sync(conn, lease, cid, outcome.reason or "", now)


def journal_unknown_sync(
    conn: Conn, lease: Lease, cid: str, reason: str, now: int, ran_by: Any = None, ran_epoch: Any = None
) -> None:
    """The journal's record of an outcome now unknown; after a takeover it names the dead owner
    that had the call in flight (`ran_by`, `ran_epoch`), which the row's owner no longer says."""
    data = {"execution_id": lease.execution_id, "epoch": lease.epoch, "reason": reason}
    if ran_by is not None:
        data.update(ran_by=ran_by, ran_epoch=ran_epoch)
    append_event_sync(
        conn,
        kind=EventKind.TOOL_OUTCOME_UNKNOWN,
        actor=lease.owner_id,
        session_id=lease.session_id,
        target=cid,
        now=now,
        data=data,
    )


def settle_takeover_sync(conn: Conn, lease: Lease, now: int) -> dict[str, list[str]]:
    """After a takeover (the caller's tx began with `guard_sync`): the dead owner's running calls
    move on by effect class; {"rerun": ids back to pending, "unknown": ids now unknown}."""
    running = conn.execute(
        "SELECT id, effect, owner_id, epoch FROM tool_call WHERE execution_id = ? AND state = 'running'",
        (lease.execution_id,),
    ).fetchall()
    moved: dict[str, list[str]] = {"rerun": [], "unknown": []}
    for row in running:
        unknown = row["effect"] == "effect"
        reason = (
            f"in flight when its executor {row['owner_id']} (epoch {row['epoch']}) stopped; "
            "check the tool's own records, then `rem resolve`"
        )
        conn.execute(
            "UPDATE tool_call SET state = ?, reason = ?, owner_id = ?, epoch = ?, time_updated = ? "
            "WHERE id = ? AND state = 'running'",
            (
                "unknown" if unknown else "pending",
                reason if unknown else None,
                lease.owner_id,
                lease.epoch,
                now,
                row["id"],
            ),
        )
        if unknown:
            journal_unknown_sync(conn, lease, row["id"], reason, now, row["owner_id"], row["epoch"])
        moved["unknown" if unknown else "rerun"].append(row["id"])
    return moved


def rounds_sync(conn: Conn, execution_id: str, after_step: int = -1) -> list[dict[str, Any]]:
    """The execution's tool exchanges so far (those of steps after `after_step`), for the model:
    per step, the assistant's text and each call (its model id, tool, arguments, and the result
    it is shown), in order."""
    rows = conn.execute(
        "SELECT c.step, c.model_call_id, c.tool, c.arguments, c.state, c.result, c.is_error, "
        "c.result_bytes, c.result_truncated, m.data AS message FROM tool_call AS c "
        "LEFT JOIN session_message AS m ON m.id = c.message_id "
        "WHERE c.execution_id = ? AND c.step > ? ORDER BY c.step, c.idx",
        (execution_id, after_step),
    ).fetchall()
    rounds: dict[int, dict[str, Any]] = {}
    model_bytes = settings.tool_result_model_bytes
    for r in rows:
        if r["step"] not in rounds:
            text = json.loads(r["message"]).get("text", "") if r["message"] else ""
            rounds[r["step"]] = {"step": r["step"], "text": text, "calls": []}
        call = dict(r)
        del call["message"]
        call["model_arguments"] = r["arguments"]
        call["for_model"] = for_model(
            r["result"] or "", r["result_bytes"], bool(r["result_truncated"]), model_bytes
        )
        rounds[r["step"]]["calls"].append(call)
    return list(rounds.values())


def settled(round_: dict[str, Any]) -> bool:
    """Whether every call of a `rounds_sync` round reached a terminal state (it changes no more)."""
    return all(call["state"] in TERMINAL_STATES for call in round_["calls"])


def for_model(text: str, size: int | None, truncated: bool, max_bytes: int) -> str:
    """A stored result as the model is shown it: at most `max_bytes`, with a note when it was cut."""
    size = size if size is not None else len(text.encode("utf-8", "replace"))
    if size <= max_bytes and not truncated:
        return text
    kept = utf8_prefix(text, max_bytes)
    return kept + TRUNCATED_NOTE.format(size=size, kept=len(kept.encode("utf-8")))
