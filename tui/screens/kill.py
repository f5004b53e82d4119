"""The kill's confirmation: the blast radius before the signal, as chaos tools name it; Cancel has the focus.

Its parts, each in a box of its own: the process (role, pid, host, owner id),
the leases it holds, the tool calls it has running, and the signal with what
follows it. An effect in flight is the warning: it will become an unknown
outcome for the operator to resolve.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Footer, Label, Static

from tui.format import visible
from tui.screens.confirm import ConfirmScreen

PARTS_CSS = """
KillScreen #parts {
    height: auto;
    max-height: 24;
}
KillScreen.-short #parts {
    max-height: 9;
}
KillScreen .part {
    height: auto;
    border: round $panel-lighten-2;
    border-title-color: $text-muted;
    padding: 0 1;
}
KillScreen .part.-empty {
    color: $text-muted;
}
"""


class KillScreen(ConfirmScreen):
    """Confirm one SIGKILL; dismisses with True only on the Kill button.

    | Key | Does |
    | :- | :- |
    | tab / shift+tab | move between Cancel and Kill |
    | enter | press the focused button (Cancel is focused first) |
    | escape | cancel |
    """

    DEFAULT_CSS = ConfirmScreen.DEFAULT_CSS.replace("ConfirmScreen", "KillScreen") + PARTS_CSS

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(visible(self.plan.title), id="title", markup=False)
            with VerticalScroll(id="parts"):  # a short terminal scrolls the parts, never the buttons away
                yield from map(self._part, self.plan.sections)
            if self.plan.warning:
                yield Static(Text(f"⚠ {visible(self.plan.warning)}"), id="warning")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.plan.confirm_label, id="confirm", variant="error")
        yield Footer(compact=True)

    @staticmethod
    def _part(section: tuple[str, list[str]]) -> Static:
        name, lines = section
        shown = [visible(line) for line in lines if line]
        part = Static(Text("\n".join(shown) or "none"), classes="part")
        part.border_title = visible(name)
        part.set_class(not shown, "-empty")
        return part
