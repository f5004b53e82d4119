"""`rem drill sigkill`'s human view: a line per round as it happens, then the rounds and the verdict."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from backend.cli.render import _cell, _console, _e


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
    effects = report.get("effects")
    if effects:
        console.print(
            f"tool effects (the tool server's outbox): {effects['sent']} sent for {effects['keys']} calls, "
            f"{effects['duplicated']} duplicated; {effects.get('resolved_unknown', 0)} unknown outcome(s) resolved"
        )
    verdict = "[green]PASS[/]" if report["ok"] else "[red]FAIL[/]"
    console.print(f"verdict: {verdict} in {report['duration_s']} s (settled in {report['settle_s']} s)")
