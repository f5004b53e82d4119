"""What the benchmarks read from a running console: snapshots loaded and applied, and their timings.

`benchmarks/console_*.py` read `ConsoleApp.stats` (this object's `stats`): how
many snapshots were loaded and applied, and the latest ones' milliseconds. The
timings are kept in rings of a fixed size, allocated once: a console left open
for days must not grow by them (a deque of floats grows by ~32 bytes a refresh
until full: ~1.3 MB over its first hour at 5 refreshes a second, seen as the
console's RSS creeping up).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

# the timings of this many latest refreshes are kept
STATS_KEPT = 20_000


class Ring:
    """The latest `size` floats, oldest first, in memory allocated once."""

    def __init__(self, size: int) -> None:
        self._values = array("d", bytes(8 * max(1, size)))
        self._next = 0  # where the next value goes
        self._count = 0

    def append(self, value: float) -> None:
        self._values[self._next] = value
        self._next = (self._next + 1) % len(self._values)
        self._count = min(self._count + 1, len(self._values))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[float]:
        start = (self._next - self._count) % len(self._values)
        for i in range(self._count):
            yield self._values[(start + i) % len(self._values)]

    def __getitem__(self, index: int) -> float:
        if not -self._count <= index < self._count:
            raise IndexError("ring index out of range")
        return self._values[(self._next - self._count + index % self._count) % len(self._values)]


class RefreshProbes:
    """Counts and latest timings of snapshot loads and applies."""

    def __init__(self, kept: int = STATS_KEPT) -> None:
        self.stats: dict[str, Any] = {
            "loads": 0,
            "applies": 0,
            "load_ms": Ring(kept),
            "apply_ms": Ring(kept),
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
