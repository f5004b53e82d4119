"""The confirmation modal: names the exact targets and counts; Cancel has the focus."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Static

from tui.actions import ActionPlan
from tui.format import plain, visible


class ConfirmScreen(ModalScreen[bool]):
    """Confirm one operator action; dismisses with True only on the confirm button.

    | Key | Does |
    | :- | :- |
    | tab / shift+tab | move between Cancel and the action button |
    | enter | press the focused button (Cancel is focused first) |
    | escape | cancel |
    """

    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
        background: $background 60%;
    }
    ConfirmScreen > #dialog {
        width: 90%;
        max-width: 110;
        height: auto;
        max-height: 90%;
        border: thick $error;
        background: $surface;
        padding: 0 1;
    }
    ConfirmScreen #title {
        text-style: bold;
        color: $error;
        width: 100%;
        padding: 0 0 1 0;
    }
    ConfirmScreen #warning {
        color: $warning;
        text-style: bold;
    }
    ConfirmScreen #preview {
        height: auto;
        max-height: 14;
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
    }
    ConfirmScreen #buttons {
        height: auto;
        align-horizontal: right;
        padding: 1 0 0 0;
    }
    ConfirmScreen Button {
        margin-left: 2;
    }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, plan: ActionPlan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            # the plan names targets, hosts, reasons and Chroma values from the data: each line
            # shown as plain text with its control characters as escapes
            yield Label(visible(self.plan.title), id="title", markup=False)
            yield Static(Text("\n".join(visible(line) for line in self.plan.lines)), id="body")
            if self.plan.warning:
                yield Static(Text(f"⚠ {visible(self.plan.warning)}"), id="warning")
            if self.plan.preview:
                with VerticalScroll(id="preview") as scroll:
                    scroll.border_title = "dry-run diff"
                    yield Static(plain(self.plan.preview, multiline=True), id="preview-text")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.plan.confirm_label, id="confirm", variant="error")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)
