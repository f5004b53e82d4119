"""A panel's rows as CSV, from the console (`e` exports a file, `c` copies to the clipboard).

Every row the panel lists (filter and sort applied), full values (`SnapshotTable.to_csv`):
a panel reads only the rows on screen, so an export first has it read the rest
(`SnapshotTable.with_whole_list`).
A writable console writes `console-<panel>-<time>.csv` into the data dir's
`logs/` (or the current folder); a read-only console changes no byte of the
data dir, so the operator names a file outside it. An export is created
private and exclusively: never over an existing file, never through a link.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.notifications import SeverityLevel

from backend.ops.console import DataDir, RemError, create_export, inside
from tui.screens.export import ExportScreen
from tui.widgets.snapshot_table import SnapshotTable


class ExportHost(Protocol):
    """What exporting needs of the app: where the data dir is, whether it is read-only, screens."""

    @property
    def data(self) -> DataDir: ...
    @property
    def read_only(self) -> bool: ...

    def focused_panel(self) -> SnapshotTable: ...
    def notify(self, message: str, *, severity: SeverityLevel = "information") -> None: ...
    def push_screen(self, screen: Any, callback: Callable[[Path | None], None] | None = None) -> Any: ...
    def copy_to_clipboard(self, text: str) -> None: ...


class CsvExport:
    """Export or copy a panel's rows as CSV, and say where they went."""

    def __init__(self, host: ExportHost) -> None:
        self.host = host

    def export_focused(self) -> None:
        """The focused panel, to logs/ (or the current folder); read-only, to a file the operator names."""
        table = self.host.focused_panel()
        table.with_whole_list(lambda: self._export(table))

    def _export(self, table: SnapshotTable) -> None:
        if self.host.read_only:
            self.ask_path(table, table.to_csv(), table.csv_file_name())
            return
        path = table.export_csv([self.host.data.logs, Path.cwd()])
        if path is None:
            self.host.notify(
                "could not write the CSV to the data dir's logs/ or the current directory", severity="error"
            )
        else:
            self.host.notify(f"exported {len(table.shown_keys())} {table.PANEL_NAME} rows to {path}")

    def ask_path(self, table: SnapshotTable, text: str, name: str) -> None:
        """Read-only: the data dir gets no new bytes, so the operator names a file outside it."""
        root = self.host.data.root
        folder = Path.cwd() if not inside(Path.cwd(), root) else Path.home()
        rows = len(table.shown_keys())

        def chosen(path: Path | None) -> None:
            if path is None:
                return
            try:
                create_export(path, text)
            except RemError as exc:
                self.host.notify(f"export failed: {exc}", severity="error")
                return
            self.host.notify(f"exported {rows} {table.PANEL_NAME} rows to {path}")

        self.host.push_screen(ExportScreen(table.PANEL_NAME, rows, folder / name, root), callback=chosen)

    def copy_focused(self) -> None:
        table = self.host.focused_panel()
        table.with_whole_list(lambda: self._copy(table))

    def _copy(self, table: SnapshotTable) -> None:
        self.host.copy_to_clipboard(table.to_csv())
        self.host.notify(f"copied {len(table.shown_keys())} {table.PANEL_NAME} rows as CSV")
