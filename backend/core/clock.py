"""Wall-clock time as Unix time in ms, always from Python, never from SQL.

Tests and clock-skew drills shift it: `REM_CLOCK_SKEW_MS` adds a fixed
offset for a whole process; `set_clock` replaces the source in-process.

Leases compare one process's clock with another's, so clocks must agree
within a bound: two processes Δ ms apart never take each other's leases
over while Δ < L - R (L the lease, R its renewal interval): 20 s with the
default 30 s execution leases renewed every 10 s. Past it, leases are taken
over early, and fencing still keeps every write exactly-once
(tests/reliability/test_clock_skew.py proves both sides).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from backend.core.settings import settings

_source: Callable[[], int] | None = None
# REM_CLOCK_SKEW_MS, read at the first `now_ms` (a whole process's offset: read once, not per call)
_skew: int | None = None


def _skew_ms() -> int:
    global _skew
    if _skew is None:
        _skew = settings.clock_skew_ms
    return _skew


def now_ms() -> int:
    """The current Unix time in ms (with any configured skew)."""
    if _source is not None:
        return _source()
    return int(time.time() * 1000) + _skew_ms()


def set_clock(source: Callable[[], int] | None) -> None:
    """Replace the clock (tests); `None` restores the real one."""
    global _source
    _source = source


class FrozenClock:
    """A controllable clock for tests: `advance(ms)` moves it forward."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
