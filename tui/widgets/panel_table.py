"""`PanelTable`: a lean row-cursor table on Textual's line API, for panels that change often.

Textual's DataTable re-renders every visible cell (through Rich padding and
wrapping) whenever any cell changes; with seven live panels over a large data
dir that cost frames of 100+ ms. Here a row is rendered once, as one Text,
and its Strip, cropped to the panel, is cached under the row's key with the
row's version: a changed countdown redraws one row, a re-sort redraws nothing.
The header stays put while rows scroll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

GAP = 1  # blank cells before each column: one space between columns, one before the first
AUTO_MAX = 160
# rows whose strips are kept: more than a full-screen panel shows. One strip a row, the one
# on screen (a new version replaces the old): every Strip carries 7 caches, all GC-tracked,
# so stale versions and uncropped copies lengthened the console's full collections
STRIP_CACHE = 64


class TableColumn(NamedTuple):
    key: str
    label: str
    width: int | None  # None: as wide as its widest cell


class PanelTable(ScrollView, can_focus=True):
    """Rows of Text cells in fixed-width columns, a row cursor, a fixed header.

    | Key | Does |
    | :- | :- |
    | enter | select the row under the cursor |
    | up / down | move the cursor |
    | pageup / pagedown | move the cursor a page |
    | home / end | first / last row |
    | left / right | scroll sideways to the columns that do not fit |
    """

    BINDINGS: ClassVar = [
        Binding("enter", "select_cursor", "Detail", tooltip="detail of the selected row"),
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "first_row", "First row", show=False),
        Binding("end", "last_row", "Last row", show=False),
        Binding("left", "scroll_left", "Scroll left", show=False),
        Binding("right", "scroll_right", "Scroll right", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "panel-table--header",
        "panel-table--cursor",
        "panel-table--cursor-blurred",
        "panel-table--empty",
    }
    # shown in place of rows when there are none (say what that means, e.g. "all clear")
    EMPTY_TEXT: ClassVar[str] = ""
    DEFAULT_CSS = """
    PanelTable > .panel-table--header {
        text-style: bold;
        color: $text-muted;
    }
    PanelTable > .panel-table--cursor {
        background: $block-cursor-background;
        color: $block-cursor-foreground;
        text-style: bold;
    }
    PanelTable > .panel-table--cursor-blurred {
        background: $block-cursor-blurred-background;
    }
    PanelTable > .panel-table--empty {
        color: $text-muted;
        text-style: italic;
    }
    """

    cursor_row: reactive[int] = reactive(0, always_update=True)

    class RowSelected(Message):
        """Enter, or a click on the row that already has the cursor."""

        def __init__(self, table: PanelTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> PanelTable:
            return self.table

    class HeaderSelected(Message):
        """A click on a column header."""

        def __init__(self, table: PanelTable, column_key: str) -> None:
            super().__init__()
            self.table = table
            self.column_key = column_key

        @property
        def control(self) -> PanelTable:
            return self.table

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.table_columns: list[TableColumn] = []
        self.order: list[str] = []
        self._widths: list[int] = []
        # row key -> (what the strip was rendered from, the strip as shown)
        self._strips: LRUCache[str, tuple[tuple[object, ...], Strip]] = LRUCache(STRIP_CACHE)
        self._header: tuple[tuple[object, ...], Strip] | None = None

    # -- what a subclass provides ------------------------------------------------
    def row_cells(self, key: str) -> Sequence[Text]:
        """The cells of row `key`, one Text per column."""
        raise NotImplementedError

    def row_version(self, key: str) -> int:
        """Changes whenever row `key`'s cells change (the cache key of its rendering)."""
        raise NotImplementedError

    # -- feeding it ------------------------------------------------------------------
    def set_columns(self, columns: Sequence[TableColumn]) -> None:
        self.table_columns = list(columns)
        self.measure_columns()

    def measure_columns(self) -> None:
        """Fix column widths (auto columns from their widest cell) and the virtual size."""
        widths = []
        for index, column in enumerate(self.table_columns):
            if column.width is not None:
                widths.append(column.width)
                continue
            widest = max((self.row_cells(k)[index].cell_len for k in self.order), default=0)
            widths.append(min(AUTO_MAX, max(len(column.label), widest)))
        if widths != self._widths:
            self._widths = widths
            self._forget_strips()
        self.virtual_size = Size(self.row_width, len(self.order) + 1)

    def set_order(self, order: list[str]) -> None:
        """Show these rows in this order; keeps the cursor index in range."""
        self.order = order
        self.virtual_size = Size(self.row_width, len(order) + 1)
        if self.cursor_row >= len(order):
            self.cursor_row = max(0, len(order) - 1)
        self.refresh()

    @property
    def row_width(self) -> int:
        return sum(w + GAP for w in self._widths) + GAP

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def body_height(self) -> int:
        """Rows visible under the header."""
        return max(1, self.scrollable_content_region.height - 1)

    # -- rendering ----------------------------------------------------------------------
    def _line_text(self, cells: Sequence[Text], style: Style) -> Text:
        line = Text(style=style, no_wrap=True, end="")
        for width, cell in zip(self._widths, cells, strict=False):
            piece = cell.copy()
            piece.truncate(width, overflow="ellipsis", pad=True)
            line.append(" " * GAP)
            line.append_text(piece)
        line.append(" " * GAP)
        return line

    def _strip(self, text: Text, style: Style) -> Strip:
        segments = list(text.render(self.app.console))
        return Strip(segments).extend_cell_length(max(self.row_width, self.size.width), style)

    def _forget_strips(self) -> None:
        self._strips.clear()
        self._header = None

    def _header_strip(self, scroll_x: int, width: int) -> Strip:
        style = self.get_component_rich_style("panel-table--header")
        made_from = (tuple(c.label for c in self.table_columns), tuple(self._widths), style, width, scroll_x)
        if self._header is None or self._header[0] != made_from:
            labels = [Text(c.label) for c in self.table_columns]
            strip = self._strip(self._line_text(labels, style), style).crop(scroll_x, scroll_x + width)
            self._header = (made_from, strip)
        return self._header[1]

    def _row_strip(self, index: int, scroll_x: int, width: int) -> Strip:
        key = self.order[index]
        base = self.rich_style
        if index == self.cursor_row:
            name = "panel-table--cursor" if self.has_focus else "panel-table--cursor-blurred"
            base = base + self.get_component_rich_style(name)
        made_from = (self.row_version(key), base, width, scroll_x)
        cached = self._strips.get(key)
        if cached is None or cached[0] != made_from:
            strip = self._strip(self._line_text(self.row_cells(key), base), base)
            cached = (made_from, strip.crop(scroll_x, scroll_x + width))
            self._strips[key] = cached
        return cached[1]

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            return self._header_strip(scroll_x, width)
        index = scroll_y + y - 1
        if index >= len(self.order):
            if y == 1 and not self.order and self.EMPTY_TEXT:
                style = self.rich_style + self.get_component_rich_style("panel-table--empty")
                return self._strip(Text(f" {self.EMPTY_TEXT}", style=style), self.rich_style).crop(0, width)
            return Strip.blank(width, self.rich_style)
        return self._row_strip(index, scroll_x, width)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget_strips()

    # -- cursor ---------------------------------------------------------------------------
    def watch_cursor_row(self, old: int, new: int) -> None:
        if new != old:
            self.refresh()
        self.scroll_cursor_visible()

    def scroll_cursor_visible(self) -> None:
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + self.body_height:
            self.scroll_to(y=self.cursor_row - self.body_height + 1, animate=False, immediate=True)

    def move_cursor(self, row: int) -> None:
        self.cursor_row = max(0, min(row, len(self.order) - 1))

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def action_cursor_up(self) -> None:
        self.move_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor_row - self.body_height)

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor_row + self.body_height)

    def action_first_row(self) -> None:
        self.move_cursor(0)

    def action_last_row(self) -> None:
        self.move_cursor(len(self.order) - 1)

    def action_select_cursor(self) -> None:
        if 0 <= self.cursor_row < len(self.order):
            self.post_message(self.RowSelected(self, self.order[self.cursor_row]))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        x, y = offset
        if y == 0:
            column = self._column_at(x + int(self.scroll_x))
            if column is not None:
                self.post_message(self.HeaderSelected(self, column))
            return
        index = int(self.scroll_y) + y - 1
        if index >= len(self.order):
            return
        if index == self.cursor_row:
            self.action_select_cursor()
        else:
            self.move_cursor(index)

    def _column_at(self, x: int) -> str | None:
        edge = GAP
        for column, width in zip(self.table_columns, self._widths, strict=False):
            edge += width + GAP
            if x < edge:
                return column.key
        return None
