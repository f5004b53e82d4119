"""Agent tool calls in the status snapshot: the calls waiting for a person, every call counted,
and the tool sources' health.

`rem status --json`'s `tools` object, the console's tool panel, the tool-call metrics and
`ops.tool_calls_waiting` read this. The waiting lists are the calls only an operator moves on
(`WAITING_STATES`: an approval asked for, an effect whose outcome is unknown), oldest first (the
most urgent: it has waited longest); `running` lists the calls in flight with the executor that
runs each (the console's Backlog, and its `k`); all read from the partial index of open calls up
to `LIST_CAP` rows; the counts are the `tool_calls` status counter (`backend.store.counters`), so neither walks
the calls ever made.

The sources' health (`servers`) is what each live executor last recorded in its worker row
(`backend.execution.tool_health`: written when a source goes up or down, never per call): one
record per (executor, source), down first. A dead executor's records are not listed: its servers
died with it. `server_down_lines` is the one line per down source that `rem status` and the
console show, like the model's health line.
"""

from __future__ import annotations

import json
from typing import Any

from backend.execution.tool_health import INFO_KEY
from backend.ops.records import ToolCallRecord, ToolCalls, ToolServerRecord, WaitingToolCalls
from backend.store import workers
from backend.store.db import Conn
from backend.store.states import ToolCallState

_OPEN = "('pending', 'awaiting_approval', 'running', 'unknown')"
_COLUMNS = """c.id, c.session_id, c.execution_id, c.tool, c.arguments, c.effect, c.permission,
        c.state, c.idempotency_key, c.owner_id, c.epoch, c.starts, c.retries, c.time_created,
        c.time_started, c.time_updated, w.state AS owner_state, w.heartbeat_at, w.exited_at"""


def _waiting_sql(state: ToolCallState) -> str:
    # the IN term repeats the partial index's predicate word for word: SQLite's planner uses a
    # partial index only when a WHERE term is one of its own
    return f"""
        SELECT {_COLUMNS}
        FROM tool_call AS c LEFT JOIN worker AS w ON w.owner_id = c.owner_id
        WHERE c.state IN {_OPEN} AND c.state = '{state.value}'
        ORDER BY c.time_created, c.id LIMIT :cap"""


WAITING_QUERIES: dict[str, str] = {
    "tools_awaiting_approval": _waiting_sql(ToolCallState.AWAITING_APPROVAL),
    "tools_unknown_outcome": _waiting_sql(ToolCallState.UNKNOWN),
}
# the calls listed, in the Backlog panel's order
CALL_QUERIES: dict[str, str] = {
    "tools_unknown_outcome": WAITING_QUERIES["tools_unknown_outcome"],
    "tools_awaiting_approval": WAITING_QUERIES["tools_awaiting_approval"],
    # the calls in flight, and the executor each runs in (the one an operator's drill would kill)
    "tools_running": _waiting_sql(ToolCallState.RUNNING),
}
QUERIES: dict[str, str] = {
    **CALL_QUERIES,
    # the executors that may be alive, with what they recorded of their tool sources
    "tools_servers": f"""
        SELECT owner_id, state, heartbeat_at, exited_at, json_extract(info, '$.{INFO_KEY}') AS servers
        FROM worker INDEXED BY worker_state_heartbeat_idx
        WHERE state IN ('running', 'draining') AND role = 'executor'
        ORDER BY started_at, owner_id LIMIT :cap""",
}
# tools named in the counts (by calls made); the rest are summed under OTHER_TOOL, so a model
# that invents tool names cannot grow the status document or the metrics' label sets
TOOL_CAP = 50
OTHER_TOOL = "(other)"


def rows_sync(conn: Conn, cap: int) -> dict[str, list[dict[str, Any]]]:
    """The rows of both waiting lists and of the calls running (oldest first), and of the executors'
    tool sources, their records decoded: what does not depend on the clock."""
    return {**waiting_rows_sync(conn, cap, CALL_QUERIES), **server_rows_sync(conn, cap)}


def server_rows_sync(conn: Conn, cap: int) -> dict[str, list[dict[str, Any]]]:
    """The executors that may be alive with their recorded tool sources, decoded (`tools_servers`)."""
    out = waiting_rows_sync(conn, cap, {"tools_servers": QUERIES["tools_servers"]})
    for row in out["tools_servers"]:
        row["servers"] = recorded_servers(row["owner_id"], row["servers"])
    return out


def waiting_rows_sync(
    conn: Conn, cap: int, queries: dict[str, str] = WAITING_QUERIES
) -> dict[str, list[dict[str, Any]]]:
    """The rows of `queries` (by default both waiting lists, oldest first), as dicts."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, sql in queries.items():
        cursor = conn.execute(sql, {"cap": cap})
        cursor.row_factory = None
        names = [d[0] for d in cursor.description]
        out[name] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return out


def recorded_servers(owner_id: str, raw: str | None) -> list[ToolServerRecord]:
    """An executor's recorded tool sources (`worker.info`), each named by the executor; none if unreadable."""
    try:
        records = json.loads(raw) if raw else []
    except ValueError:
        return []
    out: list[ToolServerRecord] = []
    for r in records if isinstance(records, list) else []:
        if isinstance(r, dict) and isinstance(r.get("server"), str):
            error, since = r.get("error"), r.get("since")
            out.append(
                {
                    "server": r["server"],
                    "up": r.get("up") is True,
                    "error": None if error is None else str(error),
                    "since": since if isinstance(since, int) else 0,
                    "worker": owner_id,
                }
            )
    return out


def server_records(rows: list[dict[str, Any]], now: int) -> list[ToolServerRecord]:
    """The live executors' tool sources as of `now`: down first, then by name and executor."""
    alive = workers.worker_alive
    listed = [
        record
        for row in rows
        if row["servers"] and alive(row["state"], row["heartbeat_at"], row["exited_at"], now)
        for record in row["servers"]
    ]
    return sorted(listed, key=lambda r: (r["up"], r["server"], r["worker"]))


def server_down_lines(records: list[ToolServerRecord], now: int) -> list[str]:
    """One plain line per source down in some live executor: the longest down, and in how many."""
    down: dict[str, list[ToolServerRecord]] = {}
    for record in records:
        if not record["up"]:
            down.setdefault(record["server"], []).append(record)
    lines = []
    for name, where in sorted(down.items()):
        first = min(where, key=lambda r: r["since"])
        executors = f"{len(where)} executors" if len(where) > 1 else first["worker"]
        lines.append(
            f"tool server {name} down for {elapsed(now - first['since'])} in {executors}: "
            f"{first['error'] or 'down'}"
        )
    return lines


def elapsed(ms: int) -> str:
    """A span as `rem status` prints it: 45s, 12m05s (a negative one as 0s)."""
    seconds = max(0, ms) // 1000
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _arguments(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw  # as stored: a CHECK keeps it JSON, a damaged row still shows


def call_record(r: dict[str, Any], now: int) -> ToolCallRecord:
    """One waiting call as the status shows it, its age and its owner's liveness as of `now`."""
    return {
        "call_id": r["id"],
        "session_id": r["session_id"],
        "execution_id": r["execution_id"],
        "tool": r["tool"],
        "arguments": _arguments(r["arguments"]),
        "effect": r["effect"],
        "permission": r["permission"],
        "state": r["state"],
        "idempotency_key": r["idempotency_key"],
        "since": r["time_created"],
        "age_ms": now - r["time_created"],
        "started_at": r["time_started"],
        "updated_at": r["time_updated"],
        "starts": r["starts"],
        "retries": r["retries"],
        "owner_id": r["owner_id"],
        "epoch": r["epoch"],
        "owner_alive": workers.worker_alive(r["owner_state"], r["heartbeat_at"], r["exited_at"], now),
    }


def by_tool(keyed: dict[str, int]) -> dict[str, dict[str, int]]:
    """The `tool_calls` counter (`STATE:TOOL` -> n) as tool -> state -> n, at most TOOL_CAP tools (the
    rest summed as OTHER_TOOL)."""
    tools: dict[str, dict[str, int]] = {}
    for key, n in keyed.items():
        state, _, tool = key.partition(":")
        per_state = tools.setdefault(tool, {})
        per_state[state] = per_state.get(state, 0) + n
    # the tools that ever ran (or wait to) first, then the most used: a name the model invented is
    # only ever an `error` call, so however often it is asked for it cannot push a real tool out
    ranked = sorted(tools, key=lambda t: (set(tools[t]) <= {"error"}, -sum(tools[t].values()), t))
    out = {tool: tools[tool] for tool in ranked[:TOOL_CAP]}
    for tool in ranked[TOOL_CAP:]:
        other = out.setdefault(OTHER_TOOL, {})
        for state, n in tools[tool].items():
            other[state] = other.get(state, 0) + n
    return out


def waiting_lists(rows: dict[str, list[dict[str, Any]]], now: int) -> WaitingToolCalls:
    """Both waiting lists as the status shows them (`waiting_rows_sync`'s rows, as of `now`)."""
    return {
        "awaiting_approval": [call_record(r, now) for r in rows["tools_awaiting_approval"]],
        "unknown_outcome": [call_record(r, now) for r in rows["tools_unknown_outcome"]],
    }


def tool_calls(rows: dict[str, list[dict[str, Any]]], keyed: dict[str, int], now: int) -> ToolCalls:
    """The snapshot's `tools` object: both waiting lists, the counts by state and by tool, the sources."""
    counts = dict.fromkeys((s.value for s in ToolCallState), 0)
    for key, n in keyed.items():
        state = key.partition(":")[0]
        counts[state] = counts.get(state, 0) + n
    return {
        **waiting_lists(rows, now),
        "running": [call_record(r, now) for r in rows["tools_running"]],
        "counts": counts,
        "by_tool": by_tool(keyed),
        "servers": server_records(rows["tools_servers"], now),
    }


# a session's calls as `rem show` and the console's detail view list them, newest last
SESSION_CALLS_SQL = """
    SELECT id AS call_id, execution_id, message_id, step, idx, model_call_id, tool, arguments, effect,
           effect_source, permission, state, approved, idempotency_key, owner_id, epoch, starts,
           retries, result, result_bytes, result_truncated, is_error, reason, decided_by,
           decided_at, time_created, time_started, time_finished, time_updated
    FROM tool_call WHERE session_id = ? ORDER BY time_created DESC, execution_id, step, idx LIMIT ?"""
# calls listed per session (the newest); a longer history is in state.db
SESSION_CALLS_CAP = 500


def session_calls_sync(conn: Conn, session_id: str, cap: int = SESSION_CALLS_CAP) -> list[dict[str, Any]]:
    """The session's newest `cap` tool calls, oldest first, each with its arguments, state, result and key."""
    cursor = conn.execute(SESSION_CALLS_SQL, (session_id, cap))
    cursor.row_factory = None
    names = [d[0] for d in cursor.description]
    calls = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for call in calls:
        call["arguments"] = _arguments(call["arguments"])
        for flag in ("approved", "result_truncated", "is_error"):
            call[flag] = bool(call[flag])
    calls.reverse()
    return calls
