"""What the operator does to a panel: focus it, filter it, sort it, open a row's detail, zoom it.

The panel acted on is the focused one, or the last one focused when the focus
is elsewhere (the filter bar, a button). Filtering and sorting happen in the
panel (`SnapshotTable`), over the full records; this module wires the keys,
the filter bar and the header clicks to them, and says what changed.
"""

from __future__ import annotations

from typing import Any, Protocol

from textual.widget import Widget

from tui.console_backend import ConsoleBackend
from tui.screens.detail import DetailScreen
from tui.widgets.filter_bar import FilterBar
from tui.widgets.panel_table import PanelTable
from tui.widgets.snapshot_table import SnapshotTable


def focus_now(widget: Widget) -> None:
    """Focus `widget` before the next key is handled: `Widget.focus` only schedules it, so keys
    typed in one go (`1` then Home, as a terminal multiplexer or a quick hand sends them) went to
    the panel focused before."""
    widget.screen.set_focus(widget)


class PanelHost(Protocol):
    """What the panel controls need of the app: its panels, the focus, the screen, the backend."""

    @property
    def backend(self) -> ConsoleBackend | None: ...
    @property
    def filter_bar(self) -> FilterBar: ...
    @property
    def focused(self) -> Widget | None: ...
    @property
    def screen(self) -> Any: ...

    def panel(self, name: str) -> SnapshotTable: ...
    def notify(self, message: str, *, timeout: float | None = None) -> None: ...
    def push_screen(self, screen: Any) -> Any: ...
    def one_line(self, error: BaseException | None) -> str: ...


class PanelControls:
    """Focus, filter, sort, detail and zoom for the console's panels."""

    def __init__(self, host: PanelHost, first: str = "leases") -> None:
        self.host = host
        self.last_focused = first

    def focused_panel(self) -> SnapshotTable:
        """The focused panel, or the last one focused when the focus is elsewhere."""
        focused = self.host.focused
        return focused if isinstance(focused, SnapshotTable) else self.host.panel(self.last_focused)

    def focus_changed(self, widget: Widget) -> None:
        if isinstance(widget, SnapshotTable) and widget.id:
            self.last_focused = widget.id

    def focus(self, name: str) -> None:
        focus_now(self.host.panel(name))

    def open_filter(self) -> None:
        table = self.focused_panel()
        self.host.filter_bar.open_for(table.id or "", table.PANEL_NAME, table.filter_text)

    def filter_changed(self, message: FilterBar.FilterChanged) -> None:
        """As the operator types: filter the panel; on Enter or Escape, back to it."""
        table = self.host.panel(message.target)
        table.set_filter(message.text)
        if message.done:
            self.host.filter_bar.close()
            table.focus()

    def sort(self) -> None:
        table = self.focused_panel()
        self.host.notify(f"{table.PANEL_NAME}: {table.cycle_sort()}", timeout=2)

    def reverse_sort(self) -> None:
        table = self.focused_panel()
        self.host.notify(f"{table.PANEL_NAME}: {table.reverse_sort()}", timeout=2)

    def header_clicked(self, event: PanelTable.HeaderSelected) -> None:
        if isinstance(event.table, SnapshotTable):
            event.table.sort_by(event.column_key)

    def row_selected(self, event: PanelTable.RowSelected) -> None:
        if isinstance(event.table, SnapshotTable):
            self.show_detail(event.table)

    def detail(self) -> None:
        self.show_detail(self.focused_panel())

    def show_detail(self, table: SnapshotTable) -> None:
        """The selected row in full, with its journal history (and for a receipt, the live diff)."""
        record, backend = table.selected_record(), self.host.backend
        if record is not None and backend is not None:
            key, describe = table.selected_key(), self.host.one_line
            self.host.push_screen(
                DetailScreen.of_row(table.PANEL_NAME, key, record, backend, describe_error=describe)
            )

    def toggle_maximize(self) -> None:
        screen = self.host.screen
        if screen.maximized is not None:
            screen.minimize()
        else:
            screen.maximize(self.focused_panel())
