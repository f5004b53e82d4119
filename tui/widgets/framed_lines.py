"""A panel's lines framed once: a row that moves up or down the panel is not framed again.

Textual draws a widget line by line, each line framed (the border's sides,
padding, background, opacity) from scratch, and keeps the result by the
line's place in the widget (`StylesCache`, textual 8.2.8). When a panel's rows
move (the Backlog's oldest input promoted, a journal row added on top of
Events), every line's place changes, so every line is framed again, though
the row it shows was drawn before and its strip is cached (`PanelTable`).
Framing was about half of what painting such a line cost. Here a framed
content line is kept by the strip it frames, so a row drawn before is framed
once, wherever it moves. The top and bottom lines (the border with its title)
are Textual's as they are. What else a frame depends on is in its key (the
sizes, the padding, the colours behind, the opacity) or drops every framed
line when it changes (any style of the widget: a focus, a class, the theme).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual._styles_cache import StylesCache
from textual.strip import Strip

# framed lines kept (the least recently used dropped first): more than a panel shows; each framed
# strip carries its own caches (memory, and objects for the full collections to scan), so not many
# more. (Dropped all at once when full, a busy fleet's panels were framed whole every ~6 refreshes.)
FRAMED_KEPT = 64


class FramedLines(StylesCache):
    """Textual's line cache for one widget, keeping each framed content line by the strip it frames."""

    def __init__(self) -> None:
        super().__init__()
        # (id of the content strip, the frame's inputs) -> (that strip, the framed line), framed
        # under the styles whose key is `_style_key`
        self._framed: dict[tuple[Any, ...], tuple[Strip, Strip]] = {}
        self._style_key: int | None = None
        self.framed = 0  # lines framed here (not served from `_framed`), ever: for tests

    def render_line(
        self,
        styles: Any,
        y: int,
        size: Any,
        content_size: Any,
        padding: Any,
        base_background: Any,
        background: Any,
        render_content_line: Callable[[int], Strip],
        *rest: Any,
    ) -> Strip:
        """A content line framed as Textual frames it, from `_framed` when that strip was framed before."""
        top, _, bottom, _ = styles.gutter
        if y < top or y >= size.height - bottom:  # the border (its title), the padding
            args = (styles, y, size, content_size, padding, base_background, background, render_content_line)
            return super().render_line(*args, *rest)
        if styles._cache_key != self._style_key:  # (Textual's own key: it moves with every style set)
            self._framed.clear()
            self._style_key = styles._cache_key
        content = render_content_line(y - top)
        key = (id(content), size, content_size, padding, base_background, background, *rest[2:])
        kept = self._framed.pop(key, None)  # (put back last: the most recently used)
        if kept is not None and kept[0] is content:
            self._framed[key] = kept
            return kept[1]
        self.framed += 1
        framed = super().render_line(
            styles, y, size, content_size, padding, base_background, background, lambda _y: content, *rest
        )
        if len(self._framed) >= FRAMED_KEPT:
            del self._framed[next(iter(self._framed))]
        self._framed[key] = (content, framed)
        return framed
