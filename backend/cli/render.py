"""Human renderings of `rem` results (rich, on stdout: they are the data without --json)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_status(result: dict[str, Any]) -> None:
    console = Console()
    chroma = result["chroma"]
    health = "[green]healthy[/]" if chroma["healthy"] else f"[red]down[/] ({chroma.get('error')})"
    console.print(f"[bold]rem[/] data dir {result['data_dir']}  schema v{result['schema_version']}")
    console.print(f"Chroma {chroma.get('url') or '-'}: {health}")
    table = Table("table", "rows", box=None)
    for name, count in result["tables"].items():
        table.add_row(name, str(count))
    console.print(table)


def print_check(result: dict[str, Any]) -> None:
    console = Console()
    verdict = "[green]ok[/]" if result["ok"] else "[red]VIOLATIONS[/]"
    console.print(f"[bold]rem check[/] {result['data_dir']}: {verdict} "
                  f"({result['counts']['violations']} violations, "
                  f"{result['counts']['unsettled']} in flight)")
    for title, findings, style in (("violation", result["violations"], "red"),
                                   ("in flight", result["unsettled"], "yellow")):
        for finding in findings:
            console.print(f"[{style}]{title}[/] (invariant {finding['invariant']}) "
                          f"{finding['what']}: {finding['count']}")
            for row in finding["rows"][:5]:
                console.print(f"    {row}", markup=False)
