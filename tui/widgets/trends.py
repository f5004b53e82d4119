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
        # what each label and line shows: redrawn only when that changes (once a second at most)
        self._shown: dict[str, tuple[int, int, str]] = {}

    def compose(self) -> ComposeResult:
        for key, label in SERIES:
            with Vertical():
                self.labels[key] = Label(label, id=f"label-{key}")
                self.lines[key] = Sparkline([0], id=f"trend-{key}")
                yield self.labels[key]
                yield self.lines[key]

    def record(self, now_ms: int, values: Mapping[str, int]) -> None:
        """Sample the current values; repeated samples within one second replace each other."""
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
            span = max(1, second - series[0][0] + 1)
            shown = (second, value, label)
            if self._shown.get(key) == shown:
                continue  # the same second and value: line and label as drawn
            self._shown[key] = shown
            data = [v for _, v in series]
            # a leading zero pins the scale to 0..max, so a steady count is not drawn as a peak
            self.lines[key].data = [0, *data]
            self.labels[key].update(
                f"{label} {value} · max {max(data)} in {duration(span * 1000)}", layout=False
            )


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
