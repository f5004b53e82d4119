"""The resolve modal: an unknown outcome decided done, retry or fail, with the operator's text.

It shows what the confirmation of any action shows (the call's session, tool, arguments, effect
class, owner, epoch and age), a text field (done: the tool's result for the model; fail: why),
and one button per choice. Cancel has the focus; nothing is decided until a choice is pressed.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Static

from tui.actions import ActionPlan
from tui.format import visible
from tui.screens.confirm import ConfirmScreen

CHOICES = ("done", "retry", "fail")


class ResolveScreen(ModalScreen[tuple[str, str] | None]):
    """Resolve one unknown outcome; dismisses with (choice, text), or None when cancelled.

    | Key | Does |
    | :- | :- |
    | tab / shift+tab | move between the text, Cancel, Done, Retry and Fail |
    | enter | press the focused button (Cancel is focused first) |
    | escape | cancel |
    """

    DEFAULT_CSS = ConfirmScreen.DEFAULT_CSS.replace("ConfirmScreen", "ResolveScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, plan: ActionPlan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(visible(self.plan.title), id="title", markup=False)
            yield Static(Text("\n".join(visible(line) for line in self.plan.lines)), id="body")
            if self.plan.warning:
                yield Static(Text(f"⚠ {visible(self.plan.warning)}"), id="warning")
            yield Input(placeholder="done: the result for the model · fail: why (optional)", id="text")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                for choice in CHOICES:
                    yield Button(choice.capitalize(), id=choice, variant="error")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        choice = event.button.id
        if choice not in CHOICES:
            self.dismiss(None)
            return
        text = "" if choice == "retry" else self.query_one("#text", Input).value.strip()
        self.dismiss((str(choice), text))

    def action_cancel(self) -> None:
        self.dismiss(None)
