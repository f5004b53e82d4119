"""`SnapshotTable`: a keyed table that mirrors one list of the status snapshot.

Rows are keyed by the record's id and redrawn only when they changed, so the
cursor (which follows its row) and the scroll position survive every refresh.
A row's cells are rendered when it is on screen (`row_cells` asks), never for
rows scrolled out of view: a refresh costs what the screen shows. Each panel
declares its columns (how to render a cell, whether it is time-dependent,
how to sort by it), how to turn a snapshot into records, and its title.
Filtering and sorting happen here, over the full records, not the cut text.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual.markup import escape
from textual.message import Message

from backend.ops.console import LIST_CAP, RemError, create_export, make_private_dir
from backend.ops.records import Status
from tui.format import DEFAULT_PALETTE, visible
from tui.widgets.panel_table import PanelTable, TableColumn

Record = dict[str, Any]
Palette = Mapping[str, str]
Render = Callable[[Record, int, Palette], Text]


@dataclass(frozen=True)
class Column:
    """One column: its key, header, width, and how to render and sort a record."""

    key: str
    label: str
    width: int | None
    render: Render
    sort: Callable[[Record], Any] | None = None
    # re-rendered by the 1 s tick (countdowns, ages) without touching the database
    live: bool = False


# Fields of snapshot rows that are derived from `now` (the live columns recompute
# them from absolute times), so a row whose other fields are unchanged is not redrawn.
VOLATILE = frozenset(
    {
        "time_left_ms",
        "expired",
        "owner_alive",
        "heartbeat_age_ms",
        "alive",
        "oldest_age_ms",
        "owner_heartbeat_at",
    }
)


def stable_part(record: Record) -> Record:
    return {k: v for k, v in record.items() if k not in VOLATILE}


@dataclass
class Row:
    key: str
    record: Record
    stable: Record
    # what the table draws for this row now; empty until first drawn
    cells: dict[str, Text] = field(default_factory=dict)
    dirty: bool = True
    # the strip cache key of this row's rendering: unique per table, never reused, because
    # a row object is replaced when its record changes and a reused number would serve a
    # stale cached rendering
    version: int = 0
    _search: str | None = None

    @property
    def search(self) -> str:
        if self._search is None:
            self._search = _search_text(self.record)
        return self._search


def same_text(a: Text | None, b: Text | None) -> bool:
    """Equal text *and* look (Rich's own `==` ignores the base style)."""
    if a is None or b is None:
        return a is b
    return a.plain == b.plain and a.style == b.style and a.spans == b.spans


def _search_text(record: Record) -> str:
    return json.dumps(record, default=str, sort_keys=True).lower()


def _sort_value(value: Any) -> tuple[int, Any]:
    # None sorts last; mixed types compare by their text
    if value is None:
        return (2, "")
    if isinstance(value, int | float):
        return (0, value)
    return (1, str(value).lower())


class SnapshotTable(PanelTable):
    """A panel table over one list of the status snapshot (subclasses fill in the blanks).

    | Key | Does |
    | :- | :- |
    | enter | open the detail of the selected row |
    """

    DEFAULT_CSS = """
    SnapshotTable {
        height: 1fr;
        border: round $panel-lighten-2;
        border-title-color: $text;
        border-title-style: bold;
        border-subtitle-color: $text-muted;
        background: $surface;
        scrollbar-size-vertical: 1;
        /* wide rows scroll with ← → (or z to zoom); a bar would cost a row */
        scrollbar-size-horizontal: 0;
    }
    SnapshotTable:focus {
        border: round $accent;
    }
    SnapshotTable.-alert {
        border: round $error;
        border-title-color: $error;
    }
    SnapshotTable.-alert:focus {
        border: heavy $error;
    }
    """

    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    # tails (events, action log): a cursor on the first row stays on the first row, so new
    # rows arrive under it like `tail -f`; elsewhere the cursor follows its row once the operator
    # moved it (until then it stays on the top row: the most urgent)
    STICKY_TOP: ClassVar[bool] = False
    PANEL_TITLE: ClassVar[str] = ""
    # what the panel is called in help, the command palette and export file names
    PANEL_NAME: ClassVar[str] = ""
    # the `ListLimits` field that says how many rows of its list a refresh reads (None: the list
    # grows with the fleet, not the data, and is read whole)
    LIST: ClassVar[str | None] = None

    class WindowChanged(Message):
        """The rows on screen need more of the panel's list than the snapshot shown read."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        # rows rendered (cells made from a record), ever: tests hold a refresh to the rows on screen
        self.rows_rendered = 0
        self._rows: dict[str, Row] = {}
        self._versions = itertools.count(1)
        self._order: list[str] = []
        self._shown: list[str] = []
        self._palette: Palette = DEFAULT_PALETTE
        self._now = 0
        self.filter_text = ""
        # aggregate counts shown under the table when no filter or sort is active
        self.summary = ""
        self.sort_column: str | None = None
        self.sort_reverse = False
        self.border_title = self.PANEL_TITLE
        self._titles = (self.PANEL_TITLE, "")  # the border title and subtitle as set
        # the rows of its list the snapshot shown read (None: all of it), and how many the list has
        self._asked: int | None = None
        self._listed: int | None = None
        self._live_second = -1  # the second of `now` the live cells on screen were drawn for
        # what waits for the panel to hold every row it lists (an export, "replay all")
        self._whole_list_for: list[Callable[[], None]] = []
        self.frozen = False  # paused: no snapshot is shown until the operator resumes

    def on_mount(self) -> None:
        self.set_columns([TableColumn(c.key, c.label, c.width) for c in self.COLUMNS])

    def row_cells(self, key: str) -> list[Text]:
        cells = self._drawn(self._rows[key]).cells
        return [cells[c.key] for c in self.COLUMNS]

    def row_version(self, key: str) -> int:
        return self._drawn(self._rows[key]).version

    def _drawn(self, row: Row) -> Row:
        """The row with its cells rendered from its record (only rows asked for: those on screen)."""
        if row.dirty or not row.cells:
            self._update_cells(row, self.COLUMNS)
            row.dirty = False
        return row

    def _column(self, key: str) -> Column:
        return next(c for c in self.COLUMNS if c.key == key)

    # -- what subclasses provide ---------------------------------------------
    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        """(row key, record) pairs, most urgent first."""
        raise NotImplementedError

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        """The border title for this snapshot and whether the panel needs attention."""
        return f"{self.PANEL_TITLE} {len(self._rows)}", False

    def live_title(self, now: int) -> tuple[str, bool] | None:
        """The title as of `now`, for panels whose title ages between snapshots (else None)."""
        return None

    def listed(self, snapshot: Status) -> int | None:
        """How many rows the panel's list has, from the snapshot's counts (an upper bound will do);
        None: not counted (a tail of the journal)."""
        return None

    # -- the window: what of its list a refresh reads -------------------------------
    def rows_wanted(self) -> int:
        """The rows of its list this panel needs read: down to its last row on screen (a filter
        or a sort works on every row it lists; a panel not laid out yet, on as many as it lists;
        a hidden one, on none)."""
        # (the region looked up once: each look walks up to the screen, and this runs twice a refresh)
        height = (
            0 if self.filter_text or self.sort_column is not None else self.scrollable_content_region.height
        )
        if not height or self._whole_list_for:
            return LIST_CAP if self.display or self._whole_list_for else 0
        return min(LIST_CAP, self.first_row_on_screen() + max(1, height - 1))  # `body_height`'s rows

    def rows_in_all(self) -> int:
        """How many rows the panel scrolls over: those read, and those counted but not read yet."""
        if self.filter_text:
            return len(self._shown)  # what the filter keeps of every row it lists
        held = len(self._rows)
        if self.list_complete():
            return held
        if self._listed is None:  # not counted: one more row may follow, read once scrolled to
            return held + 1
        return max(held, min(LIST_CAP, self._listed))

    def list_complete(self) -> bool:
        """Whether the panel holds its whole list (the read asked for more rows than there were)."""
        return self._asked is None or len(self._rows) < self._asked

    def holds_all_it_lists(self) -> bool:
        """Whether the panel holds every row it lists: its whole list, or the `LIST_CAP` first."""
        return self.list_complete() or (self._asked or 0) >= LIST_CAP

    def with_whole_list(self, then: Callable[[], None]) -> None:
        """Call `then` once the panel holds every row it lists: at once, or after the read it asks for
        (an export or "replay all" is of every row, not of those on screen)."""
        if self.holds_all_it_lists() or self.frozen:  # paused: the rows as they stand
            then()
            return
        self._whole_list_for.append(then)
        self.post_message(self.WindowChanged())

    def _check_window(self) -> None:
        """Ask for a read (`WindowChanged`) when the screen shows rows of the list not read yet."""
        if self.LIST is not None and self._asked is not None and self.rows_wanted() > self._asked:
            if (
                self.rows_in_all() > len(self._rows)
                or self.filter_text
                or self.sort_column
                or self._whole_list_for
            ):
                self.post_message(self.WindowChanged())

    # -- feeding it ------------------------------------------------------------
    def show(self, snapshot: Status, now: int, palette: Palette, asked: int | None = None) -> None:
        """Mirror the snapshot: add, update in place, remove, re-order; keep the cursor.

        `asked`: the rows of this panel's list the snapshot read (None: all of them)."""
        asked = asked if self.LIST is not None else None
        listed = self.listed(snapshot)
        same_list = (asked, listed) == (self._asked, self._listed)
        self._asked, self._listed = asked, listed
        changed = self._set_rows(self.records(snapshot), now, palette)
        self._show_title(*self.titles(snapshot))
        if changed or not same_list:
            self._sync()
        else:  # every row as drawn, in place: their countdowns if a second passed, and the subtitle
            if self._now // 1000 != self._live_second:  # (while snapshots come, the tick waits)
                self._refresh_live_cells()
                self.refresh_changed()
            self._update_subtitle()
        if self._whole_list_for and self.holds_all_it_lists():
            waiting, self._whole_list_for = self._whole_list_for, []
            for then in waiting:
                then()
        self._check_window()  # laid out (or resized) since the read was asked for

    def _set_rows(self, records: Iterable[tuple[str, Record]], now: int, palette: Palette) -> bool:
        """Hold these records; whether any row came, went, moved or changed."""
        changed = palette is not self._palette
        self._now, self._palette = now, palette
        rows = {}
        for key, record in records:
            old = self._rows.get(key)
            stable = stable_part(record)
            if old is not None and old.stable == stable:
                old.record = record  # fresh time-derived values for the live cells
                rows[key] = old
            else:
                changed = True
                # its cells and version carried over: re-rendered when drawn, a new version only if
                # a cell changed (a new version would repaint its line, and miss the strip cache)
                rows[key] = (
                    Row(key, record, stable, cells=old.cells, version=old.version)
                    if old
                    else Row(key, record, stable)
                )
        order = list(rows)
        changed = changed or order != self._order
        self._rows, self._order = rows, order
        return changed

    def _show_title(self, title: str, alert: bool) -> None:
        # setting a border title repaints the whole panel, even to the same text: only on change
        if title != self._titles[0]:
            self._titles = (title, self._titles[1])
            self.border_title = title
        self.set_class(alert, "-alert")

    def restyle(self, palette: Palette) -> None:
        """Redraw every row in a new palette (the theme changed): those on screen now, the rest when shown."""
        self._palette = palette
        for row in self._rows.values():
            row.dirty = True
        self._sync()

    def tick(self, now: int) -> None:
        """Re-render the time-dependent cells for a new `now` (no database access)."""
        self._now = now
        self._refresh_live_cells()
        self.refresh_changed()
        title = self.live_title(now)
        if title is not None:
            self._show_title(*title)

    def _refresh_live_cells(self) -> None:
        # Only the rows on screen: with thousands of leases, redrawing every countdown each
        # second would block input; rows scrolled into view are refreshed as they appear.
        live = [c for c in self.COLUMNS if c.live]
        if not live or not self.is_mounted:
            return
        self._live_second = self._now // 1000
        for key in self.keys_on_screen():
            row = self._rows[key]
            if not (row.dirty or not row.cells):  # else rendered whole when drawn
                self._update_cells(row, live)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._refresh_live_cells()
        if any(c.width is None for c in self.COLUMNS):
            self.measure_columns()
        self._check_window()

    def on_resize(self) -> None:
        self._check_window()

    def _visible(self) -> list[str]:
        keys = self._order
        if self.filter_text:
            needle = self.filter_text.lower()
            keys = [k for k in keys if needle in self._rows[k].search]
        if self.sort_column is not None:
            column = self._column(self.sort_column)
            get = column.sort or partial(_rendered_text, column, self._now, self._palette)
            keys = sorted(
                keys, key=lambda k: _sort_value(get(self._rows[k].record)), reverse=self.sort_reverse
            )
        return keys

    def _sync(self) -> None:
        """Show `_rows` (filtered, sorted) with the cursor on its row; repaint the lines that changed."""
        # a cursor the operator never moved stays on the top row (the most urgent), as does a tail's
        # on its first row; one they moved follows its row
        sticky = self.STICKY_TOP or not self.cursor_chosen
        at_top = sticky and self.cursor_row <= 0 and self.scroll_y == 0
        selected = None if at_top else self.selected_key()
        wanted = self._visible()
        self._shown = wanted
        self.set_order(wanted, self.rows_in_all())
        self._restore_cursor(selected)
        if self._now // 1000 != self._live_second:  # else the rows on screen show this second already
            self._refresh_live_cells()
        if any(c.width is None for c in self.COLUMNS):
            self.measure_columns()
        self._update_subtitle()
        self.refresh_changed()

    def _update_cells(self, row: Row, columns: Iterable[Column]) -> bool:
        """Re-render `columns` of `row`; if any cell changed, the row gets a new version."""
        self.rows_rendered += 1
        changed = False
        for column in columns:
            text = column.render(row.record, self._now, self._palette)
            if not same_text(row.cells.get(column.key), text):
                row.cells[column.key] = text
                changed = True
        if changed:
            row.version = next(self._versions)
        return changed

    def _restore_cursor(self, key: str | None) -> None:
        if key is None or not self._shown:
            return
        try:
            index = self._shown.index(key)
        except ValueError:
            return
        if index != self.cursor_row:
            self.cursor_row = index

    def _update_subtitle(self) -> None:
        parts = []
        if self.filter_text:
            # a border subtitle is read as markup: the typed filter (`[x`, `[/]`) must show as typed
            parts.append(f"/{escape(visible(self.filter_text))} {len(self._shown)} of {len(self._rows)}")
        if self.sort_column is not None:
            label = self._column(self.sort_column).label
            parts.append(f"sort {label}{' ▼' if self.sort_reverse else ' ▲'}")
        subtitle = " · ".join(parts) or self.summary
        if subtitle != self._titles[1]:
            self._titles = (self._titles[0], subtitle)
            self.border_subtitle = subtitle

    # -- operator controls -------------------------------------------------------
    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._sync()
        self._check_window()

    def cycle_sort(self) -> str:
        """Next sort column (urgency, then each column in turn); returns its name."""
        keys = [c.key for c in self.COLUMNS]
        if self.sort_column is None:
            self.sort_column = keys[0]
        else:
            index = keys.index(self.sort_column) + 1
            self.sort_column = keys[index] if index < len(keys) else None
        self.sort_reverse = False
        self._sync()
        self._check_window()
        return self.sort_label()

    def sort_by(self, column: str) -> str:
        """Sort by `column`; choosing it again flips the direction (header clicks)."""
        if self.sort_column == column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = column, False
        self._sync()
        self._check_window()
        return self.sort_label()

    def reverse_sort(self) -> str:
        self.sort_reverse = not self.sort_reverse
        self._sync()
        return self.sort_label()

    def sort_label(self) -> str:
        if self.sort_column is None:
            return "most urgent first" if not self.sort_reverse else "least urgent first"
        label = self._column(self.sort_column).label
        return f"{label} {'descending' if self.sort_reverse else 'ascending'}"

    # -- reading it ----------------------------------------------------------------
    def selected_key(self) -> str | None:
        if not 0 <= self.cursor_row < len(self.order):
            return None
        return self.order[self.cursor_row]

    def selected_record(self) -> Record | None:
        key = self.selected_key()
        return None if key is None else self._rows[key].record

    def shown_records(self) -> list[Record]:
        return [self._rows[k].record for k in self._shown]

    def all_records(self) -> list[Record]:
        return [self._rows[k].record for k in self._order]

    def shown_keys(self) -> list[str]:
        return list(self._shown)

    def displayed_keys(self) -> list[str]:
        """Row keys in the order the table actually draws them (tests check it matches)."""
        return list(self.order)

    def cell_text(self, key: str, column: str) -> str:
        """The plain text a cell shows now (tests and CSV)."""
        row = self._rows.get(key)
        text = self._drawn(row).cells.get(column) if row is not None else None
        return text.plain if text is not None else ""

    def csv_file_name(self) -> str:
        """`console-<panel>-<time>.csv`: the name an export of this panel gets."""
        return f"console-{self.PANEL_NAME}-{time.strftime('%Y%m%d-%H%M%S')}.csv"

    def export_csv(self, folders: Iterable[Path]) -> Path | None:
        """Write `to_csv()` to a new private file in the first folder that takes it; its path, or None.

        Never over an existing file, never through a symlink (`private.create_export`).
        """
        text = self.to_csv()
        name = self.csv_file_name()
        for folder in folders:
            path = folder / name
            try:
                make_private_dir(folder)
                create_export(path, text)
            except (OSError, RemError):
                continue
            return path
        return None

    def to_csv(self) -> str:
        """The rows shown (filter and sort applied) as CSV with full, uncut values."""
        records = self.shown_records()
        fields: list[str] = []
        for record in records:
            fields += [k for k in record if k not in fields]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(fields)
        for record in records:
            writer.writerow([_csv_value(record.get(name)) for name in fields])
        return out.getvalue()


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _rendered_text(column: Column, now: int, palette: Palette, record: Record) -> str:
    """A column's cell as plain text: the sort key of a column without its own."""
    return column.render(record, now, palette).plain
