"""The export prompt of a read-only console: the operator names the file, outside the data dir."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from backend.ops.console import BadInput, export_path
from tui.format import visible


class ExportScreen(ModalScreen[Path | None]):
    """Ask where to write the CSV; dismisses with a path that is new and outside the data dir.

    | Key | Does |
    | :- | :- |
    | enter | export to the path typed |
    | escape | cancel |
    """

    DEFAULT_CSS = """
    ExportScreen {
        align: center middle;
        background: $background 60%;
    }
    ExportScreen > #dialog {
        width: 90%;
        max-width: 100;
        height: auto;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    ExportScreen #title {
        text-style: bold;
        padding: 0 0 1 0;
    }
    ExportScreen #problem {
        color: $error;
        width: 100%;
        height: auto;
    }
    ExportScreen #problem.-hidden {
        display: none;
    }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, panel: str, rows: int, suggested: Path, data_root: Path) -> None:
        super().__init__()
        self.panel, self.rows, self.suggested, self.data_root = panel, rows, suggested, data_root

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"Export {self.rows} {self.panel} rows as CSV", id="title", markup=False)
            yield Static(
                "Read-only: the file goes where you say, outside the data dir, and never over an existing file.",
                markup=False,
            )
            yield Input(str(self.suggested), id="path", select_on_focus=False)
            yield Label("", id="problem", classes="-hidden", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#path", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            path = export_path(event.value, self.data_root)
        except BadInput as exc:
            problem = self.query_one("#problem", Label)
            problem.update(visible(exc))
            problem.remove_class("-hidden")
            return
        self.dismiss(path)

    def action_cancel(self) -> None:
        self.dismiss(None)
