"""What the benchmarks read from a running console: snapshots loaded and applied, and their timings.

`benchmarks/console_*.py` read `ConsoleApp.stats` (this object's `stats`): how
many snapshots were loaded and applied, and the latest ones' milliseconds. The
timings are bounded deques: a console left open for days refreshing ten times
a second must not grow by them (~2 MB an hour unbounded).
"""

from __future__ import annotations

from collections import deque
from typing import Any

# the timings of this many latest refreshes are kept
STATS_KEPT = 20_000


class RefreshProbes:
    """Counts and latest timings of snapshot loads and applies."""

    def __init__(self, kept: int = STATS_KEPT) -> None:
        self.stats: dict[str, Any] = {
            "loads": 0,
            "applies": 0,
            "load_ms": deque(maxlen=kept),
            "apply_ms": deque(maxlen=kept),
        }

    def loaded(self, took_ms: float) -> None:
        """A snapshot was read in `took_ms`."""
        self.stats["loads"] += 1
        self.stats["load_ms"].append(took_ms)

    def applied(self, took_s: float) -> float:
        """A snapshot was shown in `took_s`; returns the whole cycle (last load + this apply) in s."""
        self.stats["applies"] += 1
        self.stats["apply_ms"].append(took_s * 1000)
        load_ms = self.stats["load_ms"]
        return took_s + (load_ms[-1] / 1000 if load_ms else 0)
