"""What the console paints leaves no reference cycles: strips are freed by refcounting, not by full collections.

A full collection stops the UI thread for every object it scans (~5-7 ms under a busy
fleet); the console runs them on a timer of its own (`tui/gc_policy.py`), and what they
found was nearly all strips the screen update had dropped inside reference cycles.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.segment import Segment
from textual.geometry import Region
from textual.strip import Strip

from backend.core.datadir import DataDir
from tests.tui.test_console import SIZE, console, loaded, table
from tui.compositor import Chops, _place


@contextmanager
def cyclic_garbage() -> Iterator[Callable[[], list[object]]]:
    """The objects only the cyclic GC could free that the block left behind (the collector off
    meanwhile: nothing collects them early; what the console froze is collectable again)."""
    gc.unfreeze()
    gc.collect()
    gc.disable()
    found: list[object] = []
    try:
        yield lambda: found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_line_cut_only_at_its_end_is_placed_without_a_reference_cycle() -> None:
    """Textual's `Strip.divide` of a strip at its own end caches `[strip]` in the strip itself."""
    with cyclic_garbage() as garbage:
        strip = Strip([Segment("a line of one widget"), Segment(" and its end")])
        width = strip.cell_length
        chops: Chops = [{0: None}]
        _place(Region(0, 0, width, 1), [strip], {0: [(0, width)]}, [[0, width]], chops)
        assert chops[0][0] is strip
        del strip, chops
    assert not [o for o in garbage() if isinstance(o, Strip)]


async def test_a_panel_forgetting_its_row_strips_leaves_no_reference_cycle(healthy_dir: DataDir) -> None:
    """Column widths that change (or a style update) forget every row strip of a panel: with Textual's
    LRUCache, whose links are a ring, every strip in it became cyclic garbage."""
    async with console(healthy_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.pause()
        events = table(app, "events")
        assert events.strips_made > 0
        with cyclic_garbage() as garbage:  # no await inside: the loop adds nothing meanwhile
            events._forget_strips()
        # (the strips themselves may live on in the frame's cache: the cache's own links must not)
        assert garbage() == []
