"""The operator's decisions on agent tool calls: approve, deny, resolve (`rem approve|deny|resolve`).

Each decision is one transaction: it locks the call's execution row, re-reads
the call and refuses unless it is still in the state the decision acts on
(`awaiting_approval` for approve and deny, `unknown` for resolve), moves it,
writes the operator's journal event (`operator.approve|deny|resolve`,
hash-chained, with the call, its tool, session, arguments and digest), and
un-parks the turn when none of its calls waits any more
(`backend.execution.parking`): an executor then takes it over and the call
runs, or its result feeds the model's next step. What each leaves:

* approve: `pending`, approved (an executor runs it with its one key);
* deny: `denied`, with a tool error for the model that says so (and why);
* resolve done: `completed`, the operator's text as the tool's result;
* resolve retry: `pending` again, same key, `retries + 1` (what `rem check`
  allows an effect call's second start for);
* resolve fail: `error`, the model is told the call failed (and why).

A refusal (unknown id, wrong state) is one line, journaled as
`operator.refused`; a read-only rem refuses before it reads anything.

`tool_calls_waiting` reads the calls these decisions act on, as `rem status
--json` lists them (`ops.tool_status`), for a caller that wants only them
(`rem mcp`'s `list_tool_calls_waiting`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import Any, Literal

from backend.core import clock
from backend.core.errors import BadInput, NotFound, Refused
from backend.core.settings import settings
from backend.execution import parking
from backend.ops import tool_status
from backend.ops.actions import refusals_journaled
from backend.ops.operator_input import operator_id, operator_reason
from backend.ops.records import WaitingToolCalls
from backend.ops.results import ToolDecision
from backend.runtime.context import Context
from backend.store.db import Conn, Row
from backend.store.events import EventKind, append_event_sync
from backend.store.states import ToolCallState
from backend.tools.results import inert

Choice = Literal["done", "retry", "fail"]
Decision = Literal["approve", "deny", "done", "retry", "fail"]
CHOICES: tuple[Choice, ...] = ("done", "retry", "fail")

AWAITING, UNKNOWN = ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN
_KIND = {
    "approve": EventKind.OPERATOR_APPROVE,
    "deny": EventKind.OPERATOR_DENY,
    "done": EventKind.OPERATOR_RESOLVE,
    "retry": EventKind.OPERATOR_RESOLVE,
    "fail": EventKind.OPERATOR_RESOLVE,
}


class ToolCallNotFound(NotFound):
    """No tool call has that id."""


class WrongState(Refused):
    """The call is not in the state the decision acts on (`state` is the one it is in)."""

    def __init__(self, message: str, state: str) -> None:
        super().__init__(message)
        self.state = state


async def approve(ctx: Context, call_id: str, *, projects: Collection[str] | None = None) -> ToolDecision:
    """Approve a call awaiting approval: it runs (with its one idempotency key) when its turn resumes.

    `projects` (here and in `deny`, `resolve`) keeps the caller to those projects: a call of
    another project's session is not found, in the words an unknown id is.
    """
    return await _decide(ctx, call_id, "approve", None, projects)


async def deny(
    ctx: Context, call_id: str, reason: str | None = None, *, projects: Collection[str] | None = None
) -> ToolDecision:
    """Deny a call awaiting approval: the model is told it was denied (and `reason`)."""
    return await _decide(ctx, call_id, "deny", reason, projects)


async def resolve(
    ctx: Context,
    call_id: str,
    choice: Choice,
    text: str | None = None,
    *,
    projects: Collection[str] | None = None,
) -> ToolDecision:
    """Decide a call whose outcome is unknown: `done` (`text` is its result for the model), `retry`
    (run it again, same key) or `fail` (the model is told it failed; `text` says why)."""
    if choice not in CHOICES:
        raise BadInput(f"unknown resolution {choice!r}; use one of {', '.join(CHOICES)}")
    if choice == "retry" and text is not None:
        raise BadInput("`--retry` takes no text: the call runs again and its own result is used")
    return await _decide(ctx, call_id, choice, text, projects)


def resolution_text(choice: Choice, result: str | None, reason: str | None) -> str | None:
    """The text `resolve` takes from a result and a reason given apart (MCP, the API): the result
    with done, the reason with fail, none with retry; one given with the wrong choice is refused."""
    if result is not None and choice != "done":
        raise BadInput("result goes with outcome done; give a reason with fail, nothing with retry")
    if reason is not None and choice != "fail":
        raise BadInput("reason goes with outcome fail; give a result with done, nothing with retry")
    return result if choice == "done" else reason


async def tool_calls_waiting(ctx: Context, *, projects: Collection[str] | None = None) -> WaitingToolCalls:
    """`rem status --json`'s `tools.awaiting_approval` and `tools.unknown_outcome`, read alone
    (oldest first, capped alike); with `projects`, only the calls of their sessions."""
    from backend.ops.status_queries import LIST_CAP  # import time: the status queries, only for the list

    db = await ctx.db()
    now = clock.now_ms()

    def read_sync(conn: Conn) -> WaitingToolCalls:
        rows = tool_status.waiting_rows_sync(conn, LIST_CAP)
        if projects is not None:
            rows = _of_projects_sync(conn, rows, projects)
        return tool_status.waiting_lists(rows, now)

    return await db.read_in_thread(read_sync)


def _of_projects_sync(
    conn: Conn, rows: dict[str, list[dict[str, Any]]], projects: Collection[str]
) -> dict[str, list[dict[str, Any]]]:
    """The rows whose session is in one of `projects`."""
    sessions = sorted({r["session_id"] for listed in rows.values() for r in listed})
    kept: set[str] = set()
    if sessions and projects:  # PostgreSQL refuses an empty IN ()
        sql = (
            f"SELECT id FROM session WHERE id IN ({', '.join('?' * len(sessions))}) "
            f"AND project IN ({', '.join('?' * len(projects))})"
        )
        kept = {row[0] for row in conn.execute(sql, (*sessions, *projects)).fetchall()}
    return {name: [r for r in listed if r["session_id"] in kept] for name, listed in rows.items()}


async def _decide(
    ctx: Context, call_id: str, decision: Decision, text: str | None, projects: Collection[str] | None
) -> ToolDecision:
    action = "approve" if decision == "approve" else "deny" if decision == "deny" else "resolve"
    call_id = operator_id("tool call id", call_id)  # before anything, even a refusal, is journaled
    ctx.require_writable(f"{action} {call_id}")
    text = _bounded(text, decision)
    db = await ctx.db()
    async with refusals_journaled(ctx, action, call_id):
        return await db.write_in_thread(
            lambda conn: decide_sync(
                conn, call_id, decision, text, actor=ctx.operator, now=clock.now_ms(), projects=projects
            )
        )


def _bounded(text: str | None, decision: Decision) -> str | None:
    """The operator's text, inert; refused (one line) past its bound: a reason (deny, fail) is a
    few sentences (`REASON_MAX_BYTES`), a result (done) what a tool result is kept to."""
    if text is None:
        return None
    if decision != "done":
        return inert(operator_reason(text) or "")
    limit = settings.tool_result_max_bytes
    if len(text.encode("utf-8", "replace")) > limit:
        raise BadInput(f"the text is over {limit} bytes (REM_TOOL_RESULT_MAX_BYTES); shorten it")
    return inert(text)


def decide_sync(
    conn: Conn,
    call_id: str,
    decision: Decision,
    text: str | None,
    *,
    actor: str,
    now: int,
    projects: Collection[str] | None = None,
) -> ToolDecision:
    """One decision in the caller's transaction: re-check, move, journal, un-park (see the module doc)."""
    call = _locked_call_sync(conn, call_id, projects)
    wanted = AWAITING if decision in ("approve", "deny") else UNKNOWN
    if call["state"] != wanted:
        raise WrongState(_wrong_state(call, decision, wanted), call["state"])
    state = _move_sync(conn, call, decision, text, actor, now)
    unparked = parking.unpark_sync(conn, call["execution_id"], now)
    result = ToolDecision(
        call_id=call_id,
        session_id=call["session_id"],
        tool=call["tool"],
        arguments=json.loads(call["arguments"]),
        effect=call["effect"],
        decision=decision,
        previous_state=call["state"],
        state=state,
        unparked=unparked,
        decided_by=actor,
        decided_at=now,
    )
    _journal_sync(conn, call, result, text)
    return result


def _locked_call_sync(conn: Conn, call_id: str, projects: Collection[str] | None = None) -> Row:
    """The call, read after its execution row is locked (a park committing meanwhile is seen); one of
    a session outside `projects` is not found, in the words an unknown id is."""
    seen = conn.execute(
        "SELECT c.execution_id, s.project FROM tool_call AS c JOIN session AS s ON s.id = c.session_id "
        "WHERE c.id = ?",
        (call_id,),
    ).fetchone()
    if seen is None or (projects is not None and seen["project"] not in projects):
        raise ToolCallNotFound(
            f"no tool call {call_id!r}; `rem status` lists the calls awaiting approval or an outcome"
        )
    parking.lock_execution_sync(conn, seen["execution_id"])
    row = conn.execute("SELECT * FROM tool_call WHERE id = ?", (call_id,)).fetchone()
    assert row is not None  # a call row is never deleted but with its session
    return row


def _wrong_state(call: Row, decision: Decision, wanted: str) -> str:
    verb = {"approve": "approved", "deny": "denied"}.get(decision, "resolved")
    hint = {
        AWAITING: f"it awaits approval: `rem approve {call['id']}` or `rem deny {call['id']}`",
        UNKNOWN: f"its outcome is unknown: `rem resolve {call['id']} --done|--retry|--fail`",
    }.get(call["state"], "it needs no decision")
    return f"tool call {call['id']} is {call['state']}, not {wanted}, so it cannot be {verb}; {hint}"


# what each decision writes: (new state, approved, is_error, retries added)
_MOVES: dict[str, tuple[ToolCallState, int | None, int, int]] = {
    "approve": (ToolCallState.PENDING, 1, 0, 0),
    "deny": (ToolCallState.DENIED, None, 1, 0),
    "done": (ToolCallState.COMPLETED, None, 0, 0),
    "retry": (ToolCallState.PENDING, 1, 0, 1),
    "fail": (ToolCallState.ERROR, None, 1, 0),
}


def _move_sync(conn: Conn, call: Row, decision: Decision, text: str | None, actor: str, now: int) -> str:
    state, approved, is_error, retries = _MOVES[decision]
    result = _result_text(decision, text)
    changed = conn.execute(
        "UPDATE tool_call SET state = :state, approved = coalesce(:approved, approved), "
        "is_error = :is_error, retries = retries + :retries, result = :result, "
        "result_bytes = :bytes, result_truncated = 0, reason = :reason, decided_by = :actor, "
        "decided_at = :now, time_updated = :now, "
        "time_finished = CASE WHEN :terminal = 1 THEN :now ELSE NULL END "
        "WHERE id = :id AND state = :seen",
        {
            "state": state,
            "approved": approved,
            "is_error": is_error,
            "retries": retries,
            "result": result,
            "bytes": None if result is None else len(result.encode()),
            "reason": text if decision in ("deny", "fail") else None,
            "actor": actor,
            "now": now,
            "terminal": int(result is not None),
            "id": call["id"],
            "seen": call["state"],
        },
    ).rowcount
    if not changed:  # under the execution row's lock nothing moves it: belt and braces
        raise Refused(
            f"tool call {call['id']} moved while it was being decided; look again with `rem status`"
        )
    return state


def _result_text(decision: Decision, text: str | None) -> str | None:
    """What the model is told for a decision that ends the call (None: it runs, or runs again)."""
    why = f": {text}" if text else ""
    if decision == "deny":
        return f"The operator denied this tool call{why}. It was not run."
    if decision == "fail":
        return f"This tool call failed (an operator resolved its unknown outcome as failed){why}."
    if decision == "done":
        return text if text else "The operator confirmed this tool call completed (no result was given)."
    return None


def _journal_sync(conn: Conn, call: Row, result: ToolDecision, text: str | None) -> None:
    data: dict[str, Any] = {
        **result,
        "execution_id": call["execution_id"],
        "idempotency_key": call["idempotency_key"],
        "arguments_sha256": hashlib.sha256(call["arguments"].encode()).hexdigest(),
        "owner_id": call["owner_id"],
        "epoch": call["epoch"],
        "starts": call["starts"],
        "retries": call["retries"] + int(result["decision"] == "retry"),
    }
    if text is not None:
        data["text"] = text
    append_event_sync(
        conn,
        kind=_KIND[result["decision"]],
        actor=result["decided_by"],
        session_id=call["session_id"],
        target=call["id"],
        data=data,
        now=result["decided_at"],
    )
