"""`rem token list`'s human view: one row per token, every value as plain text."""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from backend.core.inert import visible


def print_tokens(rows: list[dict[str, Any]]) -> None:
    """The tokens as a table (no secret: the store has none to show)."""
    console = Console(highlight=False, emoji=False)
    if not rows:
        console.print(Text("no tokens: create one with `rem token create NAME --project P`"))
        return
    table = Table(
        "name",
        "id",
        "projects",
        "scopes",
        "created",
        "by",
        "revoked",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
    )
    for row in rows:
        projects = "(all)" if row["projects"] is None else ", ".join(row["projects"])
        table.add_row(
            Text(row["name"]),
            Text(row["id"]),
            Text(visible(projects)),
            Text(", ".join(row["scopes"])),
            Text(_utc(row["created_at"])),
            Text(visible(row["created_by"])),
            Text("-" if row["revoked_at"] is None else _utc(row["revoked_at"])),
        )
    for column in table.columns:
        column.no_wrap = True
    console.print(table)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ms / 1000))
