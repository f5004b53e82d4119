"""The event tail: the `event` journal, newest first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from rich.text import Text

from backend.ops.records import Status
from tui.format import cell, clock_time, compact_json, duration, owner_short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

# a tool call's lines on the timeline (`backend.ops.timeline_tools`): what waits for a person, what
# went wrong, and a person's decision stand out
TOOL_TONES = {
    "tool.awaiting_approval": "warning",
    "tool.unknown": "error",
    "tool.error": "error",
    "tool.denied": "error",
    "tool.approved": "accent",
    "tool.resolved": "accent",
    "tool.completed": "success",
}


def kind_tone(kind: str) -> str | None:
    """Colour an event kind by what it means for an operator."""
    if kind.startswith("operator."):
        return "accent"
    if kind in TOOL_TONES:
        return TOOL_TONES[kind]
    if any(word in kind for word in ("lost", "parked", "failed", "quarantined", "undigestible")):
        return "error"
    if any(
        word in kind
        for word in ("taken_over", "stale", "deferred", "draining", "stopped", "handed_back", "replayed")
    ):
        return "warning"
    return None


def _kind(record: Record, now: int, palette: Palette) -> Text:
    kind = str(record.get("kind") or "")
    # on the timeline, the events after the moment shown are dimmed: they had not happened yet
    return cell(kind, "muted" if record.get("after") else kind_tone(kind), palette)


def _when(record: Record) -> str:
    """The event's wall-clock time; on the timeline, an event after the moment shows how long after."""
    if record.get("after"):
        return f"+{duration(int(record.get('after_ms') or 0))}"
    return clock_time(record.get("time"))


def tool_data(line: Mapping[str, Any]) -> str:
    """A tool call's line in the data column: the tool, its effect class, the call id, what was
    decided or why, then its arguments (cut by the backend; drawn inert by `cell`)."""
    detail = f" {line['detail']}" if line.get("detail") else ""
    return f"{line['tool']} {line['effect']} call={line['call_id']}{detail} args={line['arguments']}"


def _merged(snapshot: Status, recorded: Mapping[str, Any]) -> Iterable[tuple[str, Record]]:
    """The journal around a moment in its own order, each tool call's line put in by time above the
    first older event; an event drawn as a call's line (a decision, an unknown outcome) is not
    drawn twice."""
    lines = sorted(cast(Mapping[str, Any], snapshot).get("tool_lines") or [], key=lambda line: -line["time"])
    drawn = {line["event_id"] for line in lines if "event_id" in line}
    rows: list[tuple[str, Record]] = []
    for event in (e for e in snapshot["events"] if e["id"] not in drawn):
        while lines and lines[0]["time"] > event["time"]:
            rows.append(_line_row(lines.pop(0)))
        rows.append((str(event["id"]), dict(event)))
    rows.extend(_line_row(line) for line in lines)
    for key, record in rows:
        event_id = record.get("id")
        later = int(event_id) > recorded["last_event_id"] if event_id else record["time"] > recorded["time"]
        if later:  # on the timeline: this happened after the moment shown
            record.update(after=True, after_ms=max(0, int(record["time"]) - recorded["time"]))
        yield key, record


def _line_row(line: Mapping[str, Any]) -> tuple[str, Record]:
    return f"tool:{line['key']}", {**line, "id": line.get("event_id"), "data": tool_data(line)}


def _recorded(snapshot: Status) -> Mapping[str, Any] | None:
    """The recorded moment a timeline snapshot carries (`backend.ops.records.Moment`); None when live."""
    recorded = cast(Mapping[str, Any], snapshot).get("recorded")
    return recorded if isinstance(recorded, Mapping) else None


def _data(record: Record, limit: int) -> str:
    """A journal event's data as `k=v`, cut to `limit`; a tool call's line as it is (cut by the backend)."""
    data = record.get("data")
    return data if record.get("call_id") and isinstance(data, str) else compact_json(data, limit)


class EventTable(SnapshotTable):
    """The journal tail: time, kind, actor, session, target, data."""

    PANEL_TITLE = "Events"
    PANEL_NAME = "events"
    EMPTY_TEXT = "no journal rows yet"
    STICKY_TOP = True
    COLUMNS = (
        Column(
            "time",
            "time",
            8,
            lambda r, n, p: cell(_when(r), "muted", p),
            sort=lambda r: (r.get("time"), r.get("id") or 0),
        ),
        Column("kind", "kind", 20, _kind, sort=lambda r: r.get("kind")),
        Column(
            "session",
            "session",
            10,
            lambda r, n, p: cell(short_id(r.get("session_id"))),
            sort=lambda r: r.get("session_id"),
        ),
        Column(
            "actor",
            "actor",
            12,
            lambda r, n, p: cell(owner_short(r.get("actor"))),
            sort=lambda r: r.get("actor"),
        ),
        Column(
            "data",
            "data",
            None,
            lambda r, n, p: cell(_data(r, 70)),
            sort=lambda r: _data(r, 200),
        ),
    )

    LIST = "events"

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        recorded = _recorded(snapshot)
        if recorded is not None:
            yield from _merged(snapshot, recorded)
            return
        for event in snapshot["events"]:
            yield str(event["id"]), dict(event)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        recorded = _recorded(snapshot)
        if recorded is not None:
            after = sum(1 for row in self._rows.values() if row.record.get("after"))
            calls = len({row.record["call_id"] for row in self._rows.values() if row.record.get("call_id")})
            with_calls = f" and {calls} tool call{'s' if calls != 1 else ''}" if calls else ""
            return (
                f"Events{with_calls} around {clock_time(recorded['time'])} · "
                f"{len(self._rows) - after} before, {after} after (dimmed)",
                False,
            )
        if not self.list_complete():  # a window of the tail: how long it is was not counted
            return "Events · newest first", False
        return f"Events · last {len(self._rows)}", False
