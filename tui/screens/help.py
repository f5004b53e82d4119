"""The `?` help screen: every key of the console, generated from the BINDINGS that define them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Markdown

from tui.screens.confirm import ConfirmScreen
from tui.screens.detail import DetailScreen
from tui.screens.resolve import ResolveScreen
from tui.widgets.filter_bar import FilterBar
from tui.widgets.panel_table import PanelTable

INTRO = """\
# rem console keys

Live view of one state store. Panels refresh on every commit to it (state.db:
file watch + `PRAGMA data_version`; PostgreSQL: its LISTEN/NOTIFY change
feed), countdowns tick every second. Actions go through `backend.ops` and are
confirmed first; the library re-checks them.
"""


def key_label(binding: Binding) -> str:
    return binding.key_display or " / ".join(
        {
            "question_mark": "?",
            "slash": "/",
            "enter": "Enter",
            "escape": "Esc",
            "ctrl+r": "Ctrl+R",
            "ctrl+p": "Ctrl+P",
            "shift+tab": "Shift+Tab",
            "tab": "Tab",
            "left_square_bracket": "[",
            "right_square_bracket": "]",
            "left_curly_bracket": "{",
            "right_curly_bracket": "}",
        }.get(k.strip(), k.strip())
        for k in binding.key.split(",")
    )


def bindings_rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    rows = []
    for binding in bindings:
        if isinstance(binding, Binding) and binding.description:
            rows.append((key_label(binding), binding.tooltip or binding.description))
    return rows


def help_sections(app_bindings: Iterable[BindingType]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The help page, built from the BINDINGS that define each key."""
    navigation = [
        ("Tab / Shift+Tab", "next / previous panel"),
        (
            "mouse",
            "click a row to select it, click it again for detail; "
            "click a column header to sort by it; wheel scrolls",
        ),
    ]
    return [
        ("Anywhere", bindings_rows(app_bindings) + [("Ctrl+P", "command palette: every action")]),
        ("In a panel", bindings_rows(PanelTable.BINDINGS) + navigation),
        ("Filter bar", [("Enter", "keep the filter")] + bindings_rows(FilterBar.BINDINGS)),
        (
            "Confirmation",
            [("Tab", "move between Cancel and the action"), ("Enter", "press the focused button")]
            + bindings_rows(ConfirmScreen.BINDINGS),
        ),
        (
            "Tool calls (Backlog's `approve`, `unknown` and `running` rows)",
            [
                (
                    "a / n",
                    "approve / deny the call: the confirmation names its session, tool, arguments, "
                    "effect class, owner, epoch and age, and who will run it",
                ),
                ("o", "resolve an unknown outcome: Done (the text is its result), Retry (same key) or Fail"),
                (
                    "k",
                    "on a running call: kill the executor running it (the confirmation names the process, "
                    "its leases, its running calls and the signal)",
                ),
                ("Enter", "detail: the call, its session's tool calls (states, keys, results, times)"),
            ]
            + bindings_rows(ResolveScreen.BINDINGS),
        ),
        ("Detail", bindings_rows(DetailScreen.BINDINGS)),
    ]


def help_markdown(sections: Sequence[tuple[str, list[tuple[str, str]]]]) -> str:
    """A Markdown page with one key table per section."""
    parts = [INTRO]
    for title, rows in sections:
        table = "\n".join(["| key | does |", "| :- | :- |", *(f"| `{key}` | {what} |" for key, what in rows)])
        parts.append(f"## {title}\n\n{table}")
    return "\n\n".join(parts) + "\n"


class HelpScreen(ModalScreen[None]):
    """Every key, by where it works.

    | Key | Does |
    | :- | :- |
    | escape / q / ? | close |
    """

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        background: $background 60%;
    }
    HelpScreen > Vertical {
        width: 90%;
        max-width: 100;
        height: 90%;
        border: thick $accent;
        background: $surface;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close", show=False),
        Binding("question_mark", "close", "Close", show=False),
    ]

    def __init__(self, markdown: str) -> None:
        super().__init__()
        self.markdown = markdown

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Markdown(self.markdown, id="help-text")
        yield Footer(compact=True)

    def action_close(self) -> None:
        self.dismiss(None)
