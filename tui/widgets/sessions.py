"""The sessions panel: tokens and cost per session (costliest first), last model error, holds."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from backend.ops.records import Status
from tui.format import cell, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable


def money(value: float | None) -> str:
    """Dollars in a narrow cell: $0.0041, $1.27, $1,204."""
    if value is None:
        return "-"
    if value < 1:
        return f"${value:.4f}"
    return f"${value:,.2f}" if value < 1000 else f"${value:,.0f}"


def count(value: int | None) -> str:
    """Tokens in a narrow cell: 950, 12.4k, 3.1M."""
    if not value:
        return "0"
    if value < 10_000:
        return str(value)
    return f"{value / 1000:.1f}k" if value < 1_000_000 else f"{value / 1_000_000:.1f}M"


def _tokens(record: Record, name: str) -> int:
    tokens = record.get("tokens") or {}
    return int(tokens.get(name) or 0)


def _error(record: Record) -> str:
    error = record.get("last_error") or {}
    return str(error.get("class") or "")


def _error_cell(record: Record, now: int, palette: Palette) -> Text:
    if record.get("held"):
        return cell(f"HELD {_error(record)}".strip(), "error", palette, bold=True)
    error = _error(record)
    return cell(error, "warning" if error else None, palette)


def _num(name: str) -> Column:
    return Column(
        name,
        {"input": "in", "output": "out", "cache_read": "cache"}[name],
        6,
        lambda r, n, p: cell(count(_tokens(r, name))),
        sort=lambda r: -_tokens(r, name),
    )


class SessionsTable(SnapshotTable):
    """Sessions that used a model (or failed to), by cost; sort by any column."""

    PANEL_TITLE = "Sessions"
    PANEL_NAME = "sessions"
    EMPTY_TEXT = "no model usage yet (the offline agent uses no tokens)"
    COLUMNS = (
        Column(
            "session",
            "session",
            12,
            lambda r, n, p: cell(short_id(r.get("session_id"), 12)),
            sort=lambda r: r.get("session_id"),
        ),
        Column(
            "cost",
            "cost",
            8,
            lambda r, n, p: cell(money(r.get("cost"))),
            sort=lambda r: -(r.get("cost") or 0),
        ),
        Column(
            "tokens",
            "tokens",
            6,
            lambda r, n, p: cell(count(r.get("tokens_total"))),
            sort=lambda r: -(r.get("tokens_total") or 0),
        ),
        Column("error", "model error", 12, _error_cell, sort=lambda r: (not r.get("held"), _error(r) == "")),
        Column(
            "turns", "turns", 5, lambda r, n, p: cell(r.get("turns")), sort=lambda r: -(r.get("turns") or 0)
        ),
        _num("input"),
        _num("output"),
        _num("cache_read"),
        Column(
            "model",
            "model",
            None,
            lambda r, n, p: cell(short(r.get("model"), 24)),
            sort=lambda r: r.get("model"),
        ),
    )

    LIST = "sessions"

    def listed(self, snapshot: Status) -> int:
        return snapshot["usage"]["total"]["sessions"]

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        for row in snapshot["usage"]["sessions"]:
            yield f"s:{row['session_id']}", dict(row)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        usage = snapshot["usage"]
        total = usage["total"]
        tokens = sum(total["tokens"].values())
        held = sum(1 for r in usage["sessions"] if r["held"])
        title = f"Sessions {total['sessions']} · {count(tokens)} tok · {money(total['cost'])}"
        return title + (f" · {held} held" if held else ""), bool(held)
