"""`PanelTable`: a lean row-cursor table on Textual's line API, for panels that change often.

Textual's DataTable re-renders every visible cell (through Rich padding and
wrapping) whenever any cell changes; with seven live panels over a large data
dir that cost frames of 100+ ms. Here a row is rendered once, as one Text,
and its Strip, cropped to the panel, is cached under the row's key with the
row's version. Each line on screen remembers what it was drawn from (the
row, its version, the cursor, the scroll); `refresh_changed` repaints only
the lines whose source changed, so a changed countdown repaints one line of
the screen, not the panel, and an unchanged refresh repaints nothing.
The header stays put while rows scroll. The table can scroll over more rows
than it holds (`total_rows`): rows not read yet show as `…` until they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.widgets.framed_lines import FramedLines

GAP = 1  # blank cells before each column: one space between columns, one before the first
AUTO_MAX = 160
# rows whose strips are kept: more than a full-screen panel shows. One strip a row, the one
# on screen (a new version replaces the old): every Strip carries 7 caches, all GC-tracked,
# so stale versions and uncropped copies lengthened the console's full collections
STRIP_CACHE = 64


# what every line painted depends on besides its row: the scroll offsets, the width, the widths'
# version, the cursor's row and whether the table has the focus
View = tuple[int, int, int, int, int, bool]


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
    # a row scrolled into view that is not read yet
    PENDING_TEXT: ClassVar[str] = "…"
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

    # repaint=False: a reactive repaints the whole widget on every set (the same value too, with
    # always_update); `watch_cursor_row` repaints the two lines that changed
    cursor_row: reactive[int] = reactive(0, always_update=True, repaint=False)

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
        # the rows it scrolls over: `order`, then rows not read yet (at least len(order))
        self.total_rows = 0
        # whether the operator moved the cursor (a key, a click): until then it marks no row of
        # its own, only the top one (`SnapshotTable` keeps it there)
        self.cursor_chosen = False
        self._widths: list[int] = []
        self._measured: dict[str, int] = {}  # row key -> the version its cells were measured at
        self._widths_version = 0
        self._fits_width: int | None = None  # a row width found to fit in the panel (`_within_panel`)
        # content line y -> what it was drawn from (`_line_source`), as last painted
        self._painted: dict[int, tuple[object, ...]] = {}
        # a row's style, the cursor's focused and blurred: resolved once per style change (the
        # widget's own rich_style walks its ancestors, and every refresh forgets it)
        self._styles: tuple[Style, Style, Style] | None = None
        # row key -> (what the strip was rendered from, the strip as shown), the least recently used
        # first: a dict, not Textual's LRUCache, whose links are a ring (a cycle for the cyclic GC
        # to free, with every strip in it, each time the widths changed and the cache was cleared)
        self._strips: dict[str, tuple[tuple[object, ...], Strip]] = {}
        self.strips_made = 0  # row strips rendered (not served from `_strips`), ever: for tests
        self._header: tuple[tuple[object, ...], Strip] | None = None
        self._view_now: View | None = None  # while painting (`render_lines`)
        # Textual's line cache, keeping framed lines by row (`tui/widgets/framed_lines.py`)
        self._styles_cache = FramedLines()

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
        self._measured = {}
        self.measure_columns()

    def measure_columns(self) -> None:
        """Fix column widths and the virtual size. An auto column grows to its widest cell on screen
        and never shrinks: widths that moved with each refresh's rows would repaint every line.
        A row measured before at the same version is not measured again (its cells are as then,
        and widths never shrink)."""
        columns = self.table_columns
        widths = [
            c.width
            if c.width is not None
            else max(self._widths[i] if i < len(self._widths) else 0, len(c.label))
            for i, c in enumerate(columns)
        ]
        auto = [i for i, c in enumerate(columns) if c.width is None]
        measured: dict[str, int] = {}
        for key in self.keys_on_screen() if auto else ():
            measured[key] = version = self.row_version(key)
            if self._measured.get(key) == version:
                continue
            cells = self.row_cells(key)
            for i in auto:
                widths[i] = max(widths[i], min(AUTO_MAX, cells[i].cell_len))
        self._measured = measured
        widths = [min(w, AUTO_MAX) if c.width is None else w for w, c in zip(widths, columns, strict=True)]
        if widths != self._widths:
            self._widths = widths
            self._widths_version += 1
            self._forget_strips()
        self._size_to_rows()

    def set_order(self, order: list[str], total: int | None = None) -> None:
        """Show these rows in this order, over `total` rows in all (the rest not read yet); keeps
        the cursor index in range. The caller repaints what changed (`refresh_changed`)."""
        self.order = order
        self.total_rows = max(len(order), total or 0)
        self._size_to_rows()
        if self.cursor_row >= self.total_rows and self.cursor_row > 0:
            self.cursor_row = max(0, self.total_rows - 1)

    def _size_to_rows(self) -> None:
        """The virtual size: the rows, and their width once it is past the panel's (the width a
        horizontal scroll needs). Rows that widen within the panel leave it as it was: a new virtual
        size is a layout of the whole screen (~5 ms under a busy fleet, as an auto column grows),
        and rows no wider than the panel scroll nowhere whatever it says."""
        width, kept = self.row_width, self.virtual_size.width
        if kept and width != kept and self._within_panel(width):
            width = kept
        size = Size(width, self.total_rows + 1)
        if size != self.virtual_size:
            self.virtual_size = size

    def _within_panel(self, width: int) -> bool:
        """Whether rows this wide, and the virtual width now, fit in the panel with room for a
        vertical scrollbar (remembered until a resize: the panel's region is a walk to the screen)."""
        if width == self._fits_width:
            return True
        room = self.scrollable_content_region.width - self.styles.scrollbar_size_vertical
        if width <= room and self.virtual_size.width <= room:
            self._fits_width = width
            return True
        return False

    def first_row_on_screen(self) -> int:
        return max(0, int(self.scroll_y))

    def keys_on_screen(self) -> list[str]:
        """The keys of the rows read that are on screen now."""
        top = self.first_row_on_screen()
        return self.order[top : top + self.body_height]

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
        self._styles = None

    def _row_style(self, cursor: bool, focused: bool | None = None) -> Style:
        if self._styles is None:
            base = self.rich_style
            self._styles = (
                base,
                base + self.get_component_rich_style("panel-table--cursor"),
                base + self.get_component_rich_style("panel-table--cursor-blurred"),
            )
        if not cursor:
            return self._styles[0]
        focused = self.has_focus if focused is None else focused
        return self._styles[1] if focused else self._styles[2]

    def _line_source(self, y: int, view: View | None = None) -> tuple[object, ...]:
        """What content line `y` shows now: it is repainted when this changes. `view`: the scroll
        offsets, the width, the widths' version, the cursor and the focus (`_view`), if the
        caller has them."""
        scroll_x, scroll_y, _, _, cursor_row, focused = view = view or self._view()
        shape = view[:4]
        if y == 0:
            return ("header", *shape)
        index = scroll_y + y - 1
        cursor = (index == cursor_row, focused)
        if index < len(self.order):
            key = self.order[index]
            return ("row", key, self.row_version(key), *cursor, *shape)
        if index < self.total_rows:
            return ("pending", *cursor, *shape)
        return ("empty" if y == 1 and not self.total_rows else "blank", *shape)

    def _view(self) -> View:
        """What every line painted now depends on besides its row (`View`)."""
        if self._view_now is not None:  # painting: the same for every line
            return self._view_now
        scroll_x, scroll_y = self.scroll_offset
        return scroll_x, scroll_y, self.size.width, self._widths_version, self.cursor_row, self.has_focus

    def render_lines(self, crop: Region) -> list[Strip]:
        # found once for the lines painted, not for each: the widget's size walks up to its screen
        # each time it is asked, and each reactive read is a descriptor call (together ~a third of
        # what a cached row's line cost)
        self._view_now = self._view()
        try:
            return super().render_lines(crop)
        finally:
            self._view_now = None

    def refresh_changed(self) -> None:
        """Repaint the lines on screen whose source changed since they were painted (none: nothing)."""
        if not self.is_mounted or not self.size:
            return
        # the rows' width, not the scrollbar's column: a row changed is no reason to paint the bar
        width, height = self.scrollable_content_region.size
        painted, start, view = self._painted, None, self._view()
        for y in range(height + 1):
            changed = y < height and painted.get(y) != self._line_source(y, view)
            if changed and start is None:
                start = y
            elif not changed and start is not None:
                self.refresh(Region(0, start, width, y - start))
                start = None

    def _header_strip(self, scroll_x: int, width: int) -> Strip:
        style = self.get_component_rich_style("panel-table--header")
        made_from = (tuple(c.label for c in self.table_columns), tuple(self._widths), style, width, scroll_x)
        if self._header is None or self._header[0] != made_from:
            labels = [Text(c.label) for c in self.table_columns]
            strip = self._strip(self._line_text(labels, style), style).crop(scroll_x, scroll_x + width)
            self._header = (made_from, strip)
        return self._header[1]

    def _row_strip(self, index: int, view: View) -> Strip:
        key = self.order[index]
        scroll_x, _, width, _, cursor_row, focused = view
        cursor = index == cursor_row
        base = self._row_style(cursor, focused)
        # the styles change only with a style update, which forgets every strip
        made_from = (self.row_version(key), cursor, cursor and focused, width, scroll_x)
        cached = self._strips.pop(key, None)  # (put back last: the most recently used)
        if cached is None or cached[0] != made_from:
            self.strips_made += 1
            strip = self._strip(self._line_text(self.row_cells(key), base), base)
            cached = (made_from, strip.crop(scroll_x, scroll_x + width))
            if len(self._strips) >= STRIP_CACHE:
                del self._strips[next(iter(self._strips))]
        self._strips[key] = cached
        return cached[1]

    def render_line(self, y: int) -> Strip:
        view = self._view()
        self._painted[y] = self._line_source(y, view)
        scroll_x, scroll_y, width, *_ = view
        if y == 0:
            return self._header_strip(scroll_x, width)
        index = scroll_y + y - 1
        if index >= len(self.order):
            if index < self.total_rows:
                return self._pending_strip(index, width)
            if y == 1 and not self.total_rows and self.EMPTY_TEXT:
                style = self.rich_style + self.get_component_rich_style("panel-table--empty")
                return self._strip(Text(f" {self.EMPTY_TEXT}", style=style), self.rich_style).crop(0, width)
            return Strip.blank(width, self.rich_style)
        return self._row_strip(index, view)

    def _pending_strip(self, index: int, width: int) -> Strip:
        style = self._row_style(index == self.cursor_row) + self.get_component_rich_style(
            "panel-table--empty"
        )
        return self._strip(Text(f" {self.PENDING_TEXT}", style=style), style).crop(0, width)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._forget_strips()

    # -- cursor ---------------------------------------------------------------------------
    def watch_cursor_row(self, old: int, new: int) -> None:
        self.scroll_cursor_visible()
        if new != old:
            self.refresh_changed()

    def scroll_cursor_visible(self) -> None:
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + self.body_height:
            self.scroll_to(y=self.cursor_row - self.body_height + 1, animate=False, immediate=True)

    def move_cursor(self, row: int) -> None:
        self.cursor_chosen = True
        self.cursor_row = max(0, min(row, self.total_rows - 1))

    def on_resize(self) -> None:
        self._fits_width = None
        self._size_to_rows()  # a narrower panel may need the rows' width to scroll them

    def on_focus(self) -> None:
        self.refresh_changed()

    def on_blur(self) -> None:
        self.refresh_changed()

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
        self.move_cursor(self.total_rows - 1)

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
        if index >= self.total_rows:
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
