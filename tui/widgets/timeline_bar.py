"""The timeline bar: shown only while the console shows a recorded moment, so the past is unmistakable."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

from textual.widgets import Static

from tui.format import duration, full_time, visible


def zone_name(at_ms: int) -> str:
    """The local time zone's abbreviation at that moment (UTC, CET, ...)."""
    return _dt.datetime.fromtimestamp(at_ms / 1000).astimezone().tzname() or ""


def timeline_text(recorded: Mapping[str, Any]) -> str:
    """One line: when, why it was recorded, where it sits in the history, and the keys."""
    at = int(recorded["time"])
    when = f"{full_time(at)[:19]} {zone_name(at)}".strip()
    asked = int(recorded.get("asked") or at)
    gap = f" (nearest to the time asked: {duration(abs(asked - at))} off)" if abs(asked - at) >= 1000 else ""
    reason = visible(recorded.get("reason") or "interval")
    alerts = visible(", ".join(recorded.get("alerts") or []) or "none")
    incident = "  INCIDENT START" if recorded.get("incident") else ""
    return (
        f"◀ THE PAST, NOT LIVE: {when}{gap} · recorded at {reason} · "
        f"snapshot {recorded.get('index', '?')} of {recorded.get('count', '?')} · alerts: {alerts}{incident}\n"
        "[ ] step  { } previous/next incident  t back to live · actions are disabled here"
    )


class TimelineBar(Static):
    """Two lines under the header while the timeline shows a recorded moment; hidden when live."""

    DEFAULT_CSS = """
    TimelineBar {
        display: none;
        height: 2;
        background: $primary;
        color: $text;
        text-style: bold;
        padding: 0 1;
    }
    TimelineBar.-shown {
        display: block;
    }
    TimelineBar.-incident {
        background: $error;
    }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self._text = ""

    @property
    def text(self) -> str:
        """What the bar says now (empty when live)."""
        return self._text

    def show_moment(self, recorded: Mapping[str, Any] | None) -> None:
        """Show where the timeline is (None: back to live, hidden)."""
        self.set_class(recorded is not None, "-shown")
        self.set_class(bool(recorded and recorded.get("incident")), "-incident")
        text = timeline_text(recorded) if recorded is not None else ""
        if text != self._text:
            self._text = text
            self.update(text)
