"""The key bar: the main keys in one line, clickable, actions greyed out when read-only.

Textual's Footer rebuilds all its key widgets on every focus change (about
200 ms on a busy console, and memory that comes back slowly); this bar is one
line of text, rebuilt only when what it says changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.markup import escape
from textual.widgets import Static

KEY_NAMES = {"question_mark": "?", "slash": "/", "enter": "⏎", "ctrl+p": "^p", "ctrl+r": "^r"}


class KeyBar(Static):
    """`? Help  p Pause  / Filter ...`: click a key to run it."""

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        color: $footer-description-foreground;
        padding: 0 1;
    }
    """

    def __init__(
        self,
        bindings: Iterable[BindingType],
        *,
        lead: Sequence[tuple[str, str, str]] = (),
        tail: Sequence[tuple[str, str, str]] = (),
        id: str | None = None,
    ) -> None:
        super().__init__("", id=id)
        shown = [b for b in bindings if isinstance(b, Binding) and b.show]
        # (key as shown, action, description)
        self.entries: list[tuple[str, str, str]] = [
            *lead,
            *((b.key_display or KEY_NAMES.get(b.key, b.key), b.action, b.description) for b in shown),
            *tail,
        ]
        self._shown: str | None = None

    def show_keys(self, enabled: Callable[[str], bool], labels: dict[str, str] | None = None) -> None:
        """Render the keys; `enabled(action)` false greys one out, `labels` renames one."""
        labels = labels or {}
        parts = []
        for key, action, description in self.entries:
            text = f"{escape(key)} {escape(labels.get(action, description))}"
            if enabled(action):
                parts.append(
                    f"[@click=app.{action}][bold $footer-key-foreground]{escape(key)}[/] "
                    f"{escape(labels.get(action, description))}[/]"
                )
            else:
                parts.append(f"[$text-disabled]{text}[/]")
        markup = "  ".join(parts)
        if markup != self._shown:
            self._shown = markup
            self.update(Content.from_markup(markup), layout=False)

    def state(self, enabled: Callable[[str], bool]) -> list[tuple[str, str, bool]]:
        """(key, description, enabled) per entry, as shown (tests and help)."""
        return [(key, description, enabled(action)) for key, action, description in self.entries]
