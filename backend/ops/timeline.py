"""The post-mortem timeline: what `rem up` records into the history store, and how a moment is read back.

A recorded snapshot is the status snapshot cut to what the console's panels
can show (`HISTORY_ROWS` per list; the totals and counts stay whole), without
the journal tail: the events around a moment are read from state.db's
journal by id (`events_around`), so they are not stored twice. Each record
carries the alert conditions that held (the same rules `rem metrics --rules`
prints, read against the snapshot's metrics), which is how the timeline
knows where incidents began.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from backend.core import clock
from backend.core.errors import UsageError
from backend.ops.actions import status
from backend.ops.alert_rules import firing
from backend.ops.prometheus import samples
from backend.ops.records import Moment, Status
from backend.ops.timeline_tools import tool_lines_sync
from backend.runtime.context import Context
from backend.store.db import Conn
from backend.store.history import Entry, HistoryStore

HISTORY_ROWS = 200
EVENTS_BEFORE = 100
EVENTS_AFTER = 20
# parts of the snapshot the console does not draw from a recorded moment
NOT_RECORDED = ("events", "data_dir", "read_only")


def compact(snapshot: Mapping[str, Any], rows: int = HISTORY_ROWS) -> dict[str, Any]:
    """The snapshot cut to what a panel can show: every list capped, totals and counts whole."""

    def cut(value: Any, depth: int = 0) -> Any:
        if isinstance(value, list):
            return [cut(v, depth + 1) for v in value[:rows]]
        if isinstance(value, dict) and depth < 3:
            return {k: cut(v, depth + 1) for k, v in value.items() if k != "detail"}
        return value

    out = {k: cut(v) for k, v in snapshot.items() if k not in NOT_RECORDED}
    return out


def last_event_id(snapshot: Mapping[str, Any]) -> int:
    """The newest journal id the snapshot saw."""
    tail = max((int(e.get("id") or 0) for e in snapshot.get("events") or []), default=0)
    return max(tail, int((snapshot.get("throughput") or {}).get("through_event_id") or 0))


def alert_names(snapshot: Mapping[str, Any]) -> list[str]:
    """The alert rules whose condition holds in this snapshot (their `for` not applied)."""
    return sorted(firing(samples(snapshot)))


# fields that move with the clock or a heartbeat alone: two snapshots that differ only in these
# (and in no alert) show the same state, so the recorder keeps one (`fingerprint`)
CLOCK_FIELDS = frozenset(
    {
        "generated_at",
        "heartbeat_at",
        "heartbeat_age_ms",
        "time_left_ms",
        "oldest_age_ms",
        "backlog_oldest_ms",
        "expired_max_ms",
        "held_ms",
        "checked_at",
    }
)


def fingerprint(snapshot: Mapping[str, Any]) -> str:
    """The recorded snapshot less its clock fields, with the alerts that hold: equal means the same state."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in CLOCK_FIELDS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    body = {"snapshot": strip(compact(snapshot)), "alerts": alert_names(snapshot)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


async def record(
    ctx: Context, history: HistoryStore, reason: str, shown: Status | None = None
) -> dict[str, Any]:
    """Take one status snapshot (or use `shown`) and append it to the history store, with the journal tally."""
    snap: Mapping[str, Any] = shown if shown is not None else await status(ctx)
    return await asyncio.to_thread(
        history.record,
        time=int(snap["generated_at"]),
        reason=reason,
        last_event_id=last_event_id(snap),
        alerts=alert_names(snap),
        snapshot=compact(snap),
        tally=dict(snap["throughput"]),
    )


# the streamed parts left out, as in the live event tail (`status_queries.LIST_QUERIES["events"]`)
EVENTS_BEFORE_SQL = """
SELECT id, time, kind, actor, session_id, target, data FROM event
WHERE id <= :last AND kind <> 'message.part' ORDER BY id DESC LIMIT :n"""
EVENTS_AFTER_SQL = """
SELECT id, time, kind, actor, session_id, target, data FROM event
WHERE id > :last AND kind <> 'message.part' ORDER BY id LIMIT :n"""


def events_around_sync(conn: Conn, last_id: int) -> list[dict[str, Any]]:
    """The journal around a moment, newest first: a few events after it (id > `last_id`), then those before."""
    out = []
    for sql, n, after in ((EVENTS_AFTER_SQL, EVENTS_AFTER, True), (EVENTS_BEFORE_SQL, EVENTS_BEFORE, False)):
        cursor = conn.execute(sql, {"last": last_id, "n": n})
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            try:
                row["data"] = json.loads(row["data"] or "{}")
            except ValueError:
                row["data"] = {"raw": row["data"]}
        out.extend(sorted(rows, key=lambda r: -int(r["id"])) if after else rows)
    return out


async def moment(ctx: Context, entry: Entry) -> Moment:
    """A recorded snapshot as the console shows it: its panels plus the journal around it."""
    db = await ctx.db()

    def read(conn: Conn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        events = events_around_sync(conn, entry.last_event_id)
        return events, tool_lines_sync(conn, events, entry.time)

    events, tool_lines = await db.run_in_thread(read)
    return cast(
        Moment,
        {
            **entry.snapshot,
            "events": events,
            "tool_lines": tool_lines,
            "data_dir": str(ctx.data.root),
            "read_only": True,
            "recorded": {
                "id": entry.id,
                "time": entry.time,
                "reason": entry.reason,
                "alerts": list(entry.alerts),
                "incident": entry.incident,
                "last_event_id": entry.last_event_id,
            },
        },
    )


def _clock_time(raw: str, now: int) -> int:
    """`HH:MM[:SS]` as the last such moment (today, or yesterday if that is later than `now`), in ms."""
    today = datetime.fromtimestamp(now / 1000).astimezone()
    parsed = datetime.strptime(raw, "%H:%M:%S" if raw.count(":") == 2 else "%H:%M")
    moment_today = today.replace(hour=parsed.hour, minute=parsed.minute, second=parsed.second, microsecond=0)
    if moment_today.timestamp() * 1000 > now:  # a time later than now means yesterday
        moment_today -= timedelta(days=1)
    return int(moment_today.timestamp() * 1000)


def parse_time(text: str, now: int | None = None) -> int:
    """`--at`: ISO 8601 (`2026-11-30T03:12`, `...Z`, an offset), `HH:MM[:SS]` today, `-15m`, or Unix time in ms."""
    now = clock.now_ms() if now is None else now
    raw = text.strip()
    if raw.startswith("-") and raw[1:-1].replace(".", "", 1).isdigit() and raw[-1] in "smhd":
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86_400}[raw[-1]]
        return now - int(float(raw[1:-1]) * unit * 1000)
    if raw.isdigit() and len(raw) >= 12:
        return int(raw)
    try:
        if len(raw) <= 8 and raw.count(":") in (1, 2):
            return _clock_time(raw, now)
        parsed_full = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--at {text!r} is not a time; use 2026-11-30T03:12:00, 03:12, -15m or Unix time in ms"
        ) from None
    if parsed_full.tzinfo is None:
        parsed_full = parsed_full.astimezone()  # local time, as the console shows it
    return int(parsed_full.timestamp() * 1000)


SEEKS = ("at", "back", "forward", "incident_back", "incident_forward")


async def seek(ctx: Context, history: HistoryStore, how: str, time: int, entry_id: int = 0) -> Moment | None:
    """The moment `how` names from (`time`, `entry_id`): at a time, a step, or the next/previous incident.

    None when there is nothing that way (the first or last snapshot, no other incident).
    """
    if how not in SEEKS:
        raise UsageError(f"unknown timeline move {how!r}; one of {', '.join(SEEKS)}")
    if how == "at":
        entry = await asyncio.to_thread(history.at, time)
    elif how in ("back", "forward"):
        entry = await asyncio.to_thread(history.step, time, entry_id, 1 if how == "forward" else -1)
    else:
        entry = await asyncio.to_thread(history.incident, time, 1 if how == "incident_forward" else -1)
    if entry is None:
        return None
    shown = await moment(ctx, entry)
    index, total = await asyncio.to_thread(history.position, entry.time, entry.id)
    recorded = shown["recorded"]
    recorded["index"], recorded["count"] = index, total
    recorded["asked"] = time if how == "at" else entry.time
    return shown
