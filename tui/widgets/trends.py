"""Sparklines of backlog, expired leases and receipt mismatches over the last minutes."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from backend.ops.records import Status
from tui.format import duration

SERIES = (("backlog", "backlog"), ("expired_leases", "expired leases"), ("mismatches", "mismatches"))
WINDOW_S = 10 * 60
# a line is redrawn this often at most (or when its top moves): one cell holds ~15 s of samples
REDRAW_EVERY_S = 5


class Trends(Horizontal):
    """Three labelled sparklines, one sample per clock second, ten minutes kept."""

    DEFAULT_CSS = """
    Trends {
        height: 2;
    }
    Trends > Vertical {
        width: 1fr;
        padding: 0 1;
    }
    Trends Label {
        width: 100%;
        color: $text-muted;
    }
    Trends Sparkline {
        height: 1;
    }
    Trends #trend-expired_leases > .sparkline--max-color, Trends #trend-mismatches > .sparkline--max-color {
        color: $error;
    }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history: dict[str, deque[tuple[int, int]]] = {key: deque(maxlen=WINDOW_S) for key, _ in SERIES}
        self.labels: dict[str, Label] = {}
        self.lines: dict[str, Sparkline] = {}
        # per series: (second, value) last drawn, the second its line was drawn, and its top then
        self._shown: dict[str, tuple[int, int, int, int]] = {}
        self._labels: dict[str, str] = {}  # each label's text as drawn

    def compose(self) -> ComposeResult:
        for key, label in SERIES:
            with Vertical():
                self.labels[key] = Label(label, id=f"label-{key}")
                self.lines[key] = Sparkline([0], id=f"trend-{key}")
                yield self.labels[key]
                yield self.lines[key]

    def record(self, now_ms: int, values: Mapping[str, int]) -> None:
        """Sample the current values; repeated samples within one second replace each other.

        A label is redrawn when its text changes; a line every `REDRAW_EVERY_S` (ten minutes
        drawn in a few dozen cells: a second moves no cell), or at once when its top moves.
        """
        second = now_ms // 1000
        for key, label in SERIES:
            series = self.history[key]
            value = int(values.get(key, 0))
            if series and series[-1][0] == second:
                series[-1] = (second, value)
            else:
                series.append((second, value))
            while series and series[0][0] <= second - WINDOW_S:
                series.popleft()
            shown = self._shown.get(key)
            if shown is not None and shown[:2] == (second, value):
                continue  # the same second and value: line and label as drawn
            top = max(v for _, v in series)
            if shown is None or second - shown[2] >= REDRAW_EVERY_S or top != shown[3]:
                # a leading zero pins the scale to 0..max, so a steady count is not drawn as a peak
                self.lines[key].data = [0, *(v for _, v in series)]
                shown = (second, value, second, top)
            self._shown[key] = (second, value, shown[2], top)
            span = max(1, second - series[0][0] + 1)
            text = f"{label} {value} · max {top} in {duration(span * 1000)}"
            if self._labels.get(key) != text:
                self._labels[key] = text
                self.labels[key].update(text, layout=False)


def trend_values(snapshot: Status, now: int) -> dict[str, int]:
    """The three series' values in a snapshot; expired leases counted against `now`."""
    counts = snapshot["counts"]
    return {
        "backlog": counts["backlog"],
        # a turn parked for a person is held by nobody: its expiry is no lateness
        "expired_leases": sum(
            1 for lease in snapshot["leases"] if lease["expires_at"] <= now and not lease["parked"]
        ),
        "mismatches": counts["mismatches"],
    }
