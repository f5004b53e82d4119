"""Tool calls on the post-mortem timeline: each call's life as lines beside the journal around a moment.

A `tool_call` row keeps its latest state and the times it was created,
last started and finished; the journal keeps what happened between (an
outcome that became unknown, each operator's approve, deny and resolve).
`tool_lines_sync` joins the two into lines, one per step of a call's life,
each naming the call (id, `NAME.TOOL`, effect class, its arguments cut to
`ARGUMENTS_SHOWN` characters) and who moved it: the executor that ran it,
or the operator whose decision the journal holds. Read in the moment's own
read transaction; the console shows them in its Events panel, inert.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from backend.store.db import Conn

CALLS_SHOWN = 60  # the calls created last before the moment (or before its last event after it)
ARGUMENTS_SHOWN = 160  # characters of a call's arguments on one line (the detail view has them whole)
TEXT_SHOWN = 120  # characters of a reason or a decision's text
# the journal events about one call, drawn as that call's lines (the event's id keeps their order)
CALL_EVENTS = {
    "tool.outcome_unknown": "unknown",
    "operator.approve": "approved",
    "operator.deny": "denied",
    "operator.resolve": "resolved",
}

CALLS_SQL = """
SELECT id, session_id, tool, effect, permission, arguments, state, owner_id, epoch, starts, retries,
       reason, decided_by, decided_at, time_created, time_started, time_finished, time_updated
FROM tool_call WHERE time_created <= :until ORDER BY time_created DESC, id LIMIT :n"""


def cut(text: Any, limit: int) -> str:
    """`text` as at most `limit` characters, an ellipsis marking the cut."""
    value = "" if text is None else str(text)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _line(call: Mapping[str, Any], kind: str, time: int, actor: Any, detail: str = "") -> dict[str, Any]:
    return {
        "key": f"{call['id']}:{kind}:{time}",
        "kind": f"tool.{kind}",
        "time": int(time),
        "call_id": call["id"],
        "session_id": call["session_id"],
        "tool": cut(call["tool"], 60),
        "effect": call["effect"],
        "arguments": cut(call["arguments"], ARGUMENTS_SHOWN),
        "actor": actor,
        "detail": cut(detail, TEXT_SHOWN),
    }


def _row_lines(call: Mapping[str, Any], journaled: set[str]) -> Iterable[dict[str, Any]]:
    """What the row itself dates: asked for, started running, and how it finished (if the journal
    does not hold that step: an unknown outcome, a deny, a resolve are drawn from their events)."""
    asked = "awaiting_approval" if call["permission"] == "ask" else "requested"  # asked a person first
    yield _line(call, asked, call["time_created"], call["owner_id"])
    if call["time_started"] is not None:
        starts = f"start {call['starts']}" if int(call["starts"] or 0) > 1 else ""
        yield _line(call, "running", call["time_started"], call["owner_id"], starts)
    finished = call["time_finished"]
    if finished is None and call["state"] == "unknown":  # a takeover's unknown: dated by its update
        finished = call["time_updated"]
    if finished is not None and call["state"] not in journaled:
        actor = call["decided_by"] if call["decided_at"] == finished else call["owner_id"]
        yield _line(call, str(call["state"]), finished, actor, call["reason"] or "")


def _event_line(event: Mapping[str, Any], call: Mapping[str, Any]) -> dict[str, Any]:
    """A journal event about `call` as its line: the decision (or the unknown outcome) and who made it."""
    data = event.get("data") or {}
    choice = data.get("decision") if isinstance(data, Mapping) else None
    words = [str(choice)] if choice and event["kind"] == "operator.resolve" else []
    for field in ("text", "reason"):
        if isinstance(data, Mapping) and data.get(field):
            words.append(str(data[field]))
    line = _line(call, CALL_EVENTS[event["kind"]], event["time"], event.get("actor"), " · ".join(words))
    line["event_id"] = event["id"]
    return line


def tool_lines_sync(
    conn: Conn, events: Sequence[Mapping[str, Any]], moment_time: int
) -> list[dict[str, Any]]:
    """The lines of the calls made up to the moment (or to its last event after it), newest first."""
    until = max([moment_time, *(int(e["time"]) for e in events)])
    cursor = conn.execute(CALLS_SQL, {"until": until, "n": CALLS_SHOWN})
    names = [d[0] for d in cursor.description]
    calls = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
    about = [e for e in events if e["kind"] in CALL_EVENTS and e.get("target") in calls]
    journaled: dict[str, set[str]] = {}
    for event in about:
        journaled.setdefault(str(event["target"]), set()).add(_journaled_state(event))
    for event in about:  # the row names its taker now; the journal, the owner that ran the call
        ran_by = (event.get("data") or {}).get("ran_by")
        if ran_by and event["kind"] == "tool.outcome_unknown":
            calls[str(event["target"])]["owner_id"] = ran_by
    lines = [line for cid, call in calls.items() for line in _row_lines(call, journaled.get(cid, set()))]
    lines.extend(_event_line(event, calls[str(event["target"])]) for event in about)
    return sorted(lines, key=lambda line: (-line["time"], -int(line.get("event_id") or 0), line["key"]))


def _journaled_state(event: Mapping[str, Any]) -> str:
    """The row state an event about a call accounts for (a deny: denied; a resolve: what it set)."""
    data = event.get("data") or {}
    state = data.get("state") if isinstance(data, Mapping) else None
    return str(state or CALL_EVENTS[event["kind"]])
