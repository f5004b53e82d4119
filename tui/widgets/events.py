"""The event tail: the `event` journal, newest first."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from backend.ops.records import Status
from tui.format import cell, clock_time, compact_json, owner_short, short_id
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
    return cell(kind, kind_tone(kind), palette)


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
            lambda r, n, p: cell(clock_time(r.get("time")), "muted", p),
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
        for event in snapshot["events"]:
            yield str(event["id"]), dict(event)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        return f"Events · last {len(self._rows)}", False
