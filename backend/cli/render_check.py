"""`rem check`'s human view: the verdict, then each finding as a line and its first rows below it.

A finding's rows are records of the data (sessions, receipts, keys that differ); each row is
printed as one line of `field: value` pairs (wrapped at the terminal's width), every value as
plain text: an enum as its value (`vector_differs`, not `<KeyReason.VECTOR_DIFFERS: ...>`), a
nested record as `(key=value, ...)`, a list joined by commas, a long value cut, every control
character shown as its escape (`backend.core.inert`). `--json` keeps the findings as data for
scripts, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from backend.core.inert import visible
from backend.ops.checks.report import ROW_CAP

CHECK_ROWS = 5  # rows shown per finding; `--json` lists up to its own cap, and counts them all
CELL_CHARS = 500  # a value longer than this is cut (a vector, a document; an error says more)


def plain(value: Any) -> str:
    """A finding's value as one plain line: enums as their value, records as `(key=value, ...)`, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return (
            "(" + ", ".join(f"{key}={plain(item)}" for key, item in value.items() if item is not None) + ")"
        )
    if isinstance(value, list | tuple):
        return ", ".join(plain(item) for item in value) or "-"
    return str(value)


def _cut(text: str) -> str:
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def row_line(row: Mapping[str, Any]) -> Text:
    """One finding row as plain text: `field: value` pairs, the empty ones left out."""
    pairs = [
        f"{visible(key)}: {_cut(visible(plain(value)))}" for key, value in row.items() if value is not None
    ]
    return Text("    " + "  ".join(pairs))


def print_check(result: dict[str, Any]) -> None:
    console = Console(emoji=False)
    not_checked = result.get("not_checked", [])
    if result["violations"]:
        verdict = "[red]VIOLATIONS[/]"
    else:
        verdict = "[yellow]INCOMPLETE[/] (Chroma unreachable)" if not_checked else "[green]ok[/]"
    console.print(
        f"[bold]rem check[/] {escape(visible(result['data_dir']))}: {verdict} "
        f"({result['counts']['violations']} violations, "
        f"{result['counts']['unsettled']} in flight)"
    )
    for title, findings, style in (
        ("violation", result["violations"], "red"),
        ("in flight", result["unsettled"], "yellow"),
    ):
        for finding in findings:
            console.print(
                f"[{style}]{title}[/] (invariant {escape(visible(finding['invariant']))}) "
                f"{escape(visible(finding['what']))}: {finding['count']}"
            )
            shown = finding["rows"][:CHECK_ROWS]
            for row in shown:
                console.print(row_line(row))
            if finding["count"] > len(shown):
                more = finding["count"] - len(shown)
                console.print(f"    … {more} more (rem check --json lists the first {ROW_CAP})")
    for part in not_checked:
        console.print(
            f"[yellow]not checked[/] (invariants {', '.join(part['invariants'])}) "
            f"receipts, Dream keys and turn vectors against Chroma: {escape(visible(part['error']))}"
        )


CHECK_PHASES = {
    "structure": "structure (quick_check, foreign keys)",
    "sessions": "sessions",
    "counters": "status counters",
    "chroma": "Chroma",
}


@contextmanager
def check_progress_bar() -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr for `rem check`, yielding the callback (shown only on a terminal)."""
    # import time: rich.progress, only for a progress bar
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as shown:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = shown.add_task(CHECK_PHASES.get(phase, phase), total=total)
            shown.update(tasks[phase], completed=done, total=total)

        yield update
