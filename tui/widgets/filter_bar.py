"""The `/` filter input: narrows the focused panel as you type; Enter keeps, Escape clears."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class FilterBar(Input):
    """An input docked above the footer, shown only while filtering.

    | Key | Does |
    | :- | :- |
    | enter | keep the filter and return to the panel |
    | escape | clear the filter and return to the panel |
    """

    DEFAULT_CSS = """
    FilterBar {
        dock: bottom;
        display: none;
        height: 3;
        border: tall $accent;
    }
    FilterBar.-shown {
        display: block;
    }
    """
    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    class FilterChanged(Message):
        """The text changed (live) or was committed."""

        def __init__(self, target: str, text: str, done: bool) -> None:
            super().__init__()
            self.target = target
            self.text = text
            self.done = done

    def __init__(self, id: str | None = None) -> None:
        super().__init__(placeholder="filter…", id=id)
        self.target = ""

    def open_for(self, target: str, panel_name: str, current: str) -> None:
        self.target = target
        self.border_title = f"filter {panel_name} (Enter keep · Esc clear)"
        self.value = current
        self.add_class("-shown")
        self.focus()

    def close(self) -> None:
        self.remove_class("-shown")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.target:
            self.post_message(self.FilterChanged(self.target, event.value, done=False))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.FilterChanged(self.target, event.value, done=True))

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.FilterChanged(self.target, "", done=True))
