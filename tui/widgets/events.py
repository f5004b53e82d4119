"""The event tail: the `event` journal, newest first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from rich.text import Text

from backend.ops.records import Status
from tui.format import cell, clock_time, compact_json, duration, owner_short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable


def kind_tone(kind: str) -> str | None:
    """Colour an event kind by what it means for an operator."""
    if kind.startswith("operator."):
        return "accent"
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


def _recorded(snapshot: Status) -> Mapping[str, Any] | None:
    """The recorded moment a timeline snapshot carries (`backend.ops.records.Moment`); None when live."""
    recorded = cast(Mapping[str, Any], snapshot).get("recorded")
    return recorded if isinstance(recorded, Mapping) else None


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
            sort=lambda r: r.get("id"),
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
            lambda r, n, p: cell(compact_json(r.get("data"), 70)),
            sort=lambda r: compact_json(r.get("data"), 200),
        ),
    )

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        recorded = _recorded(snapshot)
        for event in snapshot["events"]:
            record: Record = dict(event)
            if recorded is not None and event["id"] > recorded["last_event_id"]:
                # on the timeline: this happened after the moment shown
                record.update(after=True, after_ms=max(0, event["time"] - recorded["time"]))
            yield str(event["id"]), record

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        recorded = _recorded(snapshot)
        if recorded is not None:
            after = sum(1 for e in snapshot["events"] if e["id"] > recorded["last_event_id"])
            return (
                f"Events around {clock_time(recorded['time'])} · "
                f"{len(self._rows) - after} before, {after} after (dimmed)",
                False,
            )
        return f"Events · last {len(self._rows)}", False
