"""Human renderings of `rem` results (rich, on stdout: they are the data without --json).

Every value that comes from the data (ids, paths, Chroma values, errors) is
escaped (`_e`) or passed as `Text`: a `[/oops]` in a summary title must print
as itself, never be read as markup (it used to crash `rem replay`).
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


def _console(*, stderr: bool = False) -> Console:
    # no emoji codes either: `:thumbs_up:` inside a value stays as typed
    return Console(stderr=stderr, emoji=False)


def _e(value: Any) -> str:
    """A data value as markup-safe text."""
    return escape(str(value))


def _cell(value: Any) -> Text:
    return Text(str(value))


def print_status(result: dict[str, Any]) -> None:
    console = _console()
    chroma = result["chroma"]
    health = "[green]healthy[/]" if chroma["healthy"] else f"[red]down[/] ({_e(chroma.get('error'))})"
    console.print(f"[bold]rem[/] data dir {_e(result['data_dir'])}  schema v{result['schema_version']}")
    console.print(f"Chroma {_e(chroma.get('url') or '-')}: {health}")
    table = Table("what", "now", box=None)
    for name, count in result["counts"].items():
        table.add_row(_cell(name.replace("_", " ")), _cell(count))
    console.print(table)


def print_check(result: dict[str, Any]) -> None:
    console = _console()
    verdict = "[green]ok[/]" if result["ok"] else "[red]VIOLATIONS[/]"
    console.print(
        f"[bold]rem check[/] {_e(result['data_dir'])}: {verdict} "
        f"({result['counts']['violations']} violations, "
        f"{result['counts']['unsettled']} in flight)"
    )
    for title, findings, style in (
        ("violation", result["violations"], "red"),
        ("in flight", result["unsettled"], "yellow"),
    ):
        for finding in findings:
            console.print(
                f"[{style}]{title}[/] (invariant {_e(finding['invariant'])}) "
                f"{_e(finding['what'])}: {finding['count']}"
            )
            for row in finding["rows"][:5]:
                console.print(f"    {row}", markup=False)


def drill_round_printer() -> Any:
    """A callback printing one line per drill round on stderr as it happens."""
    console = _console(stderr=True)

    def show(rnd: Any) -> None:
        took = f"{rnd.recovery_s:.2f} s" if rnd.recovery_s is not None else "-"
        status = f"[red]{_e(rnd.error)}[/]" if rnd.error else _e(rnd.recovered)
        console.print(
            f"round {rnd.number:>2}: SIGKILL {_e(rnd.role)} pid {rnd.pid} at "
            f"{rnd.killed_at_s:.1f} s -> {status} ({took})"
        )

    return show


def print_drill(report: dict[str, Any]) -> None:
    console = _console()
    table = Table(
        "round",
        "killed",
        "pid",
        "at (s)",
        "recovered",
        "recovery (s)",
        "released",
        title=f"rem drill sigkill ({_e(report['data_dir'])})",
    )
    for rnd in report["rounds"]:
        table.add_row(
            _cell(rnd["number"]),
            _cell(rnd["role"]),
            _cell(rnd["pid"]),
            f"{rnd['killed_at_s']:.1f}",
            _cell(rnd["error"] or rnd["recovered"]),
            "-" if rnd["recovery_s"] is None else f"{rnd['recovery_s']:.2f}",
            _cell(rnd["released"]),
        )
    console.print(table)
    check = report["check"]
    for finding in check.get("violations", []):
        console.print(f"[red]violation[/] {_e(finding['what'])}: {finding['count']}")
    verdict = "[green]PASS[/]" if report["ok"] else "[red]FAIL[/]"
    console.print(f"verdict: {verdict} in {report['duration_s']} s (settled in {report['settle_s']} s)")


def print_bench(report: dict[str, Any]) -> None:
    table = Table(
        "benchmark",
        "what",
        "figure",
        "took (s)",
        title="rem bench" + (" (quick sizes)" if report["quick"] else ""),
    )
    for bench in report["benchmarks"]:
        for i, line in enumerate(bench["headline"]):
            table.add_row(
                _cell(bench["name"] if i == 0 else ""),
                _cell(line["what"]),
                _cell(line["figure"]),
                _cell(bench["seconds"] if i == 0 else ""),
            )
    _console().print(table)


def print_replay(result: dict[str, Any]) -> None:
    console = _console()
    if result["rows"]:
        table = Table("summary id", "outcome", "what differs", box=None)
        for row in result["rows"]:
            keys = ", ".join(
                f"{k['key']} ({k['reason']}: {k['expected']!r} -> {k['actual']!r})" for k in row["keys"]
            )
            what = "; ".join(filter(None, ["document" if row["document"] else "", keys, row["reason"] or ""]))
            table.add_row(_cell(row["summary_id"]), _cell(row["outcome"]), _cell(what or "-"))
        console.print(table)
    counters = "  ".join(f"{name} {value}" for name, value in result["counters"].items())
    console.print(("[bold]dry run[/] (nothing written): " if result["dry_run"] else "") + counters)


def drain_progress_printer() -> Any:
    last: list[str] = []

    def show(report: dict[str, Any]) -> None:
        line = (
            f"\r{report['owner_id']}: {report['state']}, {report['leases_held']} leases held, "
            f"{report['waited_ms'] / 1000:.1f} s"
        )
        if line != (last[0] if last else None):
            sys.stderr.write(line.ljust(90))
            sys.stderr.flush()
            last[:] = [line]
        if report["state"] == "stopped":
            sys.stderr.write("\n")

    return show
