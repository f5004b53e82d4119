"""The console's garbage-collector policy: full cyclic collections on a timer of their own.

Textual, the modules and the first snapshot are long-lived: once the first
snapshot is shown they are frozen (`gc.freeze`), out of the cyclic GC's full
scans, which otherwise stop every thread for 50-150 ms about once a second on a
big data dir (refcounting still frees them). A full collection then scans
every object made since (26 000-31 000 at 10x, most of them Textual's strips
and their caches): 12-63 ms. Left automatic, about once a second it lands
inside a screen update of 40-60 ms and input waits for both; run on a timer,
in a callback of its own, a key waits for one of them, never both.

Young collections are rarer while the console owns full ones: a refresh
allocates thousands of short-lived objects (rows, strips, segments), and at
the interpreter's 700 a refresh ran ~3 young collections and moved survivors
on to the middle generation, whose scans added to it; at `YOUNG_THRESHOLD`
the collector's share of a busy fleet's refresh fell from ~0.9 to ~0.45 ms.
Full collections every `FULL_GC_EVERY_S` (60 s, not 5 s) for the same reason:
each scans the same ~30 000 live objects whatever the gap (5-7 ms of the UI
thread under a busy fleet, which the refresh budget then made the next refresh
wait for: ~60-80 ms), and there is little for them to find: the screen update
leaves no strips in reference cycles (`tui/compositor.py`, `PanelTable`): a
busy fleet's 5 s left ~2 100 objects for the cyclic GC, its first minute now
~1 600 (Textual's full screen updates, most of them at the start).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

# a full collection every this many seconds, while the console owns them
FULL_GC_EVERY_S = 60.0
# the youngest generation's threshold while the console owns full collections (the interpreter's: 700)
YOUNG_THRESHOLD = 10_000
# gc's threshold for the oldest generation while the console owns full collections (never reached)
NO_AUTOMATIC_FULL_GC = 1_000_000_000

SetInterval = Callable[[float, Callable[[], None]], object]


class FullCollections:
    """Takes full collections over from the interpreter, and gives them back."""

    def __init__(self) -> None:
        self._thresholds: tuple[int, int, int] | None = None  # the interpreter's, while ours are set

    @property
    def owned(self) -> bool:
        """Whether the console runs full collections now (from the first snapshot shown to unmount)."""
        return self._thresholds is not None

    def take_over(self, every_s: float, set_interval: SetInterval) -> None:
        """Freeze what lives this long, stop automatic full collections (young ones rarer), run one every
        `every_s`."""
        if self._thresholds is not None:
            return
        gc.freeze()
        self._thresholds = gc.get_threshold()
        _, middle, _ = self._thresholds
        gc.set_threshold(YOUNG_THRESHOLD, middle, NO_AUTOMATIC_FULL_GC)
        set_interval(every_s, self._collect_fully)

    def give_back(self) -> None:
        """The interpreter's thresholds again: the process outlives the app (tests, `rem bench`)."""
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def _collect_fully(self) -> None:
        """A full cyclic collection, as a callback of its own."""
        gc.collect()
