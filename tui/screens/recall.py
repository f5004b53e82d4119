"""The recall screen (palette: "Recall memory"): what an agent would be given for a query."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Label

from backend.ops.console import RemError
from tui.format import plain, short

RecallLoader = Callable[[str, str | None], Awaitable[dict[str, Any]]]
COLUMNS = ("#", "kind", "score", "session", "who", "text", "when", "found by")


def item_row(rank: int, item: dict[str, Any]) -> tuple[Any, ...]:
    """One ranked item as table cells."""
    text = " ".join(str(item.get("text") or "").split())
    who = str(item.get("speaker") or item.get("role") or "")
    when = item.get("time")
    # every cell a Text: a DataTable reads a str cell as markup, and these are the data
    return (
        Text(str(rank)),
        plain(item["kind"], style={"summary": "bold", "fact": "italic"}.get(item["kind"], "")),
        Text(f"{item['score']:.3f}"),
        plain(short(str(item.get("session_id") or ""), 16)),
        plain(short(who, 14)),
        plain(short(text, 56)),
        Text(time.strftime("%Y-%m-%d %H:%M", time.localtime(when / 1000)) if isinstance(when, int) else ""),
        plain(",".join(item["provenance"]["found_by"])),
    )


class RecallScreen(ModalScreen[None]):
    """Type a query, see the ranked memory items (turns, summaries, facts) and where they came from.

    | Key | Does |
    | :- | :- |
    | enter | recall (in the query or project field) |
    | escape | close |
    """

    DEFAULT_CSS = """
    RecallScreen {
        align: center middle;
        background: $background 60%;
    }
    RecallScreen > #recall {
        width: 95%;
        height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    RecallScreen #recall-inputs {
        height: 3;
    }
    RecallScreen #recall-query {
        width: 3fr;
    }
    RecallScreen #recall-project {
        width: 1fr;
    }
    RecallScreen #recall-status {
        color: $text-muted;
        height: 1;
    }
    RecallScreen #recall-status.-degraded {
        color: $warning;
    }
    RecallScreen #recall-status.-error {
        color: $error;
    }
    """
    BINDINGS = [Binding("escape", "close", "Close")]

    class RecallLoaded(Message):
        """A recall answered (or failed with one line)."""

        def __init__(self, result: dict[str, Any] | None, error: str | None) -> None:
            super().__init__()
            self.result = result
            self.error = error

    def __init__(self, loader: RecallLoader, *, describe_error: Callable[[BaseException], str] = str) -> None:
        super().__init__()
        self._loader = loader
        self.describe_error = describe_error

    def compose(self) -> ComposeResult:
        with Vertical(id="recall"):
            yield Label("Recall memory: what an agent would be given", id="recall-title")
            with Horizontal(id="recall-inputs"):
                yield Input(
                    placeholder="query, e.g. when did we move the payments service", id="recall-query"
                )
                yield Input(placeholder="project (default)", id="recall-project")
            yield Label("type a query and press Enter", id="recall-status")
            yield DataTable(id="recall-items", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#recall-items", DataTable).add_columns(*COLUMNS)
        self.query_one("#recall-query", Input).focus()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        query = self.query_one("#recall-query", Input).value.strip()
        project = self.query_one("#recall-project", Input).value.strip() or None
        if not query:
            self._status("type a query first", "-error")
            return
        self._status(f"recalling {query!r}…", "")
        self.load(query, project)

    @work(exclusive=True, group="recall", exit_on_error=False)
    async def load(self, query: str, project: str | None) -> None:
        try:
            result = await self._loader(query, project)
        except RemError as exc:
            self.post_message(self.RecallLoaded(None, self.describe_error(exc)))
        else:
            self.post_message(self.RecallLoaded(result, None))

    def on_recall_screen_recall_loaded(self, message: RecallLoaded) -> None:
        table = self.query_one("#recall-items", DataTable)
        table.clear()
        if message.error or message.result is None:
            self._status(f"recall failed: {message.error}", "-error")
            return
        result = message.result
        for rank, item in enumerate(result["items"], 1):
            table.add_row(*item_row(rank, item), key=f"{rank}:{item['id']}")
        degraded = "; ".join(result["degraded"])
        summary = (
            f"{len(result['items'])} item(s) in project {result['project']} in {result['took_ms']:.0f} ms"
            + (f" · degraded: {degraded}" if degraded else "")
        )
        self._status(summary, "-degraded" if degraded else "")

    def _status(self, text: str, state: str) -> None:
        label = self.query_one("#recall-status", Label)
        label.update(plain(text))
        label.set_classes(state)

    def action_close(self) -> None:
        self.dismiss(None)
