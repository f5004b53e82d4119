"""The detail screen (Enter on a row): the full row, the receipt vs Chroma diff, the session's tool
calls, the journal."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from backend.ops.console import RemError
from backend.ops.records import ReplayReport
from tui.actions import key_diff_lines, replay_preview
from tui.console_backend import ConsoleBackend
from tui.format import clock_time, compact_json, full_time, plain, visible
from tui.refresh import WorkerGroup

# what a section shows until its worker has loaded it
LOADING = "loading…"
HistoryLoader = Callable[[], Awaitable[list[dict[str, Any]]]]
ToolCallsLoader = Callable[[], Awaitable[list[dict[str, Any]]]]
DiffLoader = Callable[[], Awaitable[ReplayReport]]
TIME_FIELDS = (
    "time",
    "time_created",
    "time_updated",
    "expires_at",
    "heartbeat_at",
    "started_at",
    "checked_at",
    "since",
    "oldest_at",
    "owner_heartbeat_at",
)


def history_keys(panel: str, record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(session_id, target) whose journal rows the detail screen lists for a panel's row."""
    if panel == "leases":
        return record.get("session_id"), record.get("id")
    if panel == "workers":
        return None, record.get("owner_id")
    if panel == "receipts":
        return record.get("session_id"), record.get("summary_id")
    if panel == "backlog":
        return record.get("target") or record.get("session_id"), record.get("execution_id")
    return record.get("session_id"), record.get("target")


def row_table(record: Mapping[str, Any]) -> Table:
    """Every field of the row, times also shown as wall-clock times."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in record.items():
        if isinstance(value, dict | list):
            shown = json.dumps(value, sort_keys=True, default=str)
        else:
            shown = "-" if value is None else str(value)
        if name in TIME_FIELDS and isinstance(value, int):
            shown += f"  ({full_time(value)})"
        table.add_row(plain(name), plain(shown))
    return table


def receipt_diff_table(record: Mapping[str, Any]) -> RenderableType:
    """Receipt (expected) vs Chroma (actual) per owned key, as last verified."""
    keys = [k for k in record.get("keys") or [] if isinstance(k, Mapping)]
    if not keys:
        return plain(
            f"verdict {record.get('verdict')}: no per-key detail recorded"
            + (f" ({record.get('quarantine_reason')})" if record.get("quarantine_reason") else "")
        )
    table = Table(box=None, padding=(0, 1), header_style="bold")
    for name in ("key", "receipt (expected)", "Chroma (actual)", "why"):
        table.add_column(name, overflow="fold")
    for k in keys:
        table.add_row(  # plain text: values come from Chroma and must never be read as markup
            plain(k.get("key")),
            plain(json.dumps(k.get("expected"), default=str)),
            plain(json.dumps(k.get("actual"), default=str)),
            plain(k.get("reason") or ""),
        )
    return table


def history_table(events: list[dict[str, Any]]) -> RenderableType:
    if not events:
        return Text("no journal rows for this target or session")
    table = Table(box=None, padding=(0, 1), header_style="bold")
    for name in ("id", "time", "kind", "actor", "target", "data"):
        table.add_column(name, overflow="fold", no_wrap=name != "data")
    for e in events:
        table.add_row(  # plain text: the journal holds operator names, ids and errors, never markup
            plain(e.get("id")),
            plain(clock_time(e.get("time"))),
            plain(e.get("kind")),
            plain(e.get("actor")),
            plain(e.get("target") or ""),
            plain(compact_json(e.get("data"), 200)),
        )
    return table


def tool_calls_table(calls: list[dict[str, Any]]) -> RenderableType:
    """A session's tool calls, oldest first: state, tool, key, fence, times and result (plain text)."""
    if not calls:
        return Text("no tool calls in this session")
    table = Table(box=None, padding=(0, 1), header_style="bold")
    for name in ("call", "state", "tool", "effect", "key", "owner · epoch", "made", "started", "finished"):
        table.add_column(name, no_wrap=True)
    table.add_column("arguments → result", overflow="fold")
    for c in calls:
        result = c.get("result")
        shown = compact_json(c.get("arguments"), 80) + " → " + ("-" if result is None else str(result)[:200])
        table.add_row(
            plain(c.get("call_id")),
            plain(c.get("state")),
            plain(c.get("tool")),
            plain(c.get("effect")),
            plain(str(c.get("idempotency_key"))[:20] + "…"),
            plain(f"{c.get('owner_id') or '-'} · {c.get('epoch')}"),
            plain(clock_time(c.get("time_created"))),
            plain(clock_time(c.get("time_started")) if c.get("time_started") else "-"),
            plain(clock_time(c.get("time_finished")) if c.get("time_finished") else "-"),
            plain(shown),
        )
    return table


class DetailScreen(ModalScreen[None]):
    """One row in full, with its journal history (and, for receipts, the diff).

    | Key | Does |
    | :- | :- |
    | escape / q | close |
    | c | copy the row as JSON |
    """

    DEFAULT_CSS = """
    DetailScreen {
        align: center middle;
        background: $background 60%;
    }
    DetailScreen > #detail {
        width: 95%;
        height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    DetailScreen #detail-title {
        text-style: bold;
        width: 100%;
    }
    DetailScreen .section {
        text-style: bold;
        color: $accent;
        margin-top: 1;
    }
    """
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close", show=False),
        Binding("c", "copy_row", "Copy row"),
    ]

    class HistoryLoaded(Message):
        def __init__(self, events: list[dict[str, Any]] | None, error: str | None) -> None:
            super().__init__()
            self.events = events
            self.error = error

    class ToolCallsLoaded(Message):
        def __init__(self, calls: list[dict[str, Any]] | None, error: str | None) -> None:
            super().__init__()
            self.calls = calls
            self.error = error

    class LiveDiffLoaded(Message):
        def __init__(self, result: ReplayReport | None, error: str | None) -> None:
            super().__init__()
            self.result = result
            self.error = error

    def __init__(
        self,
        title: str,
        record: Mapping[str, Any],
        *,
        history: HistoryLoader | None,
        live_diff: DiffLoader | None = None,
        receipt: bool = False,
        describe_error: Callable[[BaseException], str] = str,
        tool_calls: ToolCallsLoader | None = None,
    ) -> None:
        super().__init__()
        self._tool_calls = tool_calls
        self.describe_error = describe_error
        self.title_text = title
        self.record = dict(record)
        self._history = history
        self._live_diff = live_diff
        self.receipt = receipt

    @classmethod
    def of_row(
        cls,
        panel: str,
        key: str | None,
        record: Mapping[str, Any],
        backend: ConsoleBackend,
        *,
        describe_error: Callable[[BaseException], str] = str,
    ) -> DetailScreen:
        """The detail of one panel row: the row, its journal history, and for a receipt the live diff."""
        session_id, target = history_keys(panel, record)

        async def history() -> list[dict[str, Any]]:
            return await backend.history(session_id=session_id, target=target)

        async def live_diff() -> ReplayReport:
            return await backend.replay([str(record.get("summary_id"))], dry_run=True)

        async def tool_calls() -> list[dict[str, Any]]:
            return await backend.tool_calls(str(session_id))

        return cls(
            f"{panel}: {target or session_id or key}",
            record,
            history=history,
            live_diff=live_diff,
            receipt=panel == "receipts",
            describe_error=describe_error,
            tool_calls=tool_calls if session_id else None,
        )

    def compose(self) -> ComposeResult:
        with Vertical(id="detail"):
            yield Label(visible(self.title_text), id="detail-title", markup=False)
            with VerticalScroll():
                if self.receipt:
                    yield Label("Receipt vs Chroma (last verification)", classes="section")
                    yield Static(receipt_diff_table(self.record), id="receipt-diff")
                    yield Label("Receipt vs Chroma now (replay dry run)", classes="section")
                    yield Static(LOADING, id="live-diff")
                yield Label("Row", classes="section")
                yield Static(row_table(self.record), id="row")
                if self._tool_calls is not None:
                    yield Label("Tool calls of the session (oldest first)", classes="section")
                    yield Static(LOADING, id="tool-calls")
                yield Label("History (event journal, newest first)", classes="section")
                yield Static(LOADING, id="history")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self._history is not None:
            self.load_history()
        else:
            self.query_one("#history", Static).update("no history for this row")
        if self.receipt and self._live_diff is not None:
            self.load_live_diff()
        if self._tool_calls is not None:
            self.load_tool_calls()

    @work(exclusive=True, group=WorkerGroup.DETAIL_TOOLS, exit_on_error=False)
    async def load_tool_calls(self) -> None:
        assert self._tool_calls is not None
        await self._load(self._tool_calls, self.ToolCallsLoaded)

    def on_detail_screen_tool_calls_loaded(self, message: ToolCallsLoaded) -> None:
        target = self.query_one("#tool-calls", Static)
        if message.error:
            target.update(plain(f"tool calls unavailable: {message.error}"))
        else:
            target.update(tool_calls_table(message.calls or []))

    @work(exclusive=True, group=WorkerGroup.DETAIL_HISTORY, exit_on_error=False)
    async def load_history(self) -> None:
        assert self._history is not None
        await self._load(self._history, self.HistoryLoaded)

    @work(exclusive=True, group=WorkerGroup.DETAIL_DIFF, exit_on_error=False)
    async def load_live_diff(self) -> None:
        assert self._live_diff is not None
        await self._load(self._live_diff, self.LiveDiffLoaded)

    async def _load(
        self, loader: Callable[[], Awaitable[Any]], loaded: Callable[[Any, str | None], Message]
    ) -> None:
        """Post `loaded(result, None)`, or `loaded(None, error)` when rem refuses or fails."""
        try:
            result = await loader()
        except RemError as exc:
            self.post_message(loaded(None, self.describe_error(exc)))
        else:
            self.post_message(loaded(result, None))

    def on_detail_screen_history_loaded(self, message: HistoryLoaded) -> None:
        target = self.query_one("#history", Static)
        if message.error:
            target.update(plain(f"journal unavailable: {message.error}"))
        else:
            target.update(history_table(message.events or []))

    def on_detail_screen_live_diff_loaded(self, message: LiveDiffLoaded) -> None:
        target = self.query_one("#live-diff", Static)
        if message.error:
            target.update(plain(f"unavailable: {message.error}"))
            return
        lines = replay_preview([self.record], message.result).splitlines()
        target.update(Group(*(plain(line) for line in lines or key_diff_lines([]))))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_copy_row(self) -> None:
        self.app.copy_to_clipboard(json.dumps(self.record, default=str, sort_keys=True))
        self.notify("row copied to the clipboard as JSON")
