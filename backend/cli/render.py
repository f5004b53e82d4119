"""Human renderings of `rem` results (rich, on stdout: they are the data without --json)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table


def _age(ms: int) -> str:
    seconds = ms // 1000
    return "-" if not ms else f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def print_status(result: dict[str, Any]) -> None:
    console = Console()
    chroma = result["chroma"]
    health = "[green]healthy[/]" if chroma["healthy"] else f"[red]down[/] ({chroma.get('error')})"
    console.print(f"[bold]rem[/] data dir {result['data_dir']}  schema v{result['schema_version']}")
    console.print(f"Chroma {chroma.get('url') or '-'}: {health}")
    totals = result["totals"]
    table = Table("backlog", "waiting", "oldest", box=None)
    for kind, count in totals["backlog"].items():
        table.add_row(kind, str(count), _age(totals["backlog_oldest_ms"][kind]))
    console.print(table)
    leases = Table("leases", "held", "expired", "dead owner", "longest expired", box=None)
    for kind, lease in totals["leases"].items():
        leases.add_row(
            kind,
            str(lease["held"]),
            str(lease["expired"]),
            str(lease["dead_owner"]),
            _age(lease["expired_max_ms"]),
        )
    console.print(leases)
    verdicts = "  ".join(f"{v} {n}" for v, n in result["receipts"]["counts"].items())
    recoveries = totals["recoveries"]
    console.print(f"receipts: {verdicts}")
    console.print(f"recoveries: {recoveries['waiting']} waiting, {recoveries['parked']} parked")
    drift = "  ".join(f"{c} {n}" for c, n in result["dream_counts"].items() if n)
    console.print(f"Dream drift: {drift or 'none'}")
    alive = sum(1 for w in result["workers"] if w["alive"])
    console.print(f"workers: {alive} alive of {len(result['workers'])} listed")


def print_check(result: dict[str, Any]) -> None:
    console = Console()
    verdict = "[green]ok[/]" if result["ok"] else "[red]VIOLATIONS[/]"
    console.print(
        f"[bold]rem check[/] {result['data_dir']}: {verdict} "
        f"({result['counts']['violations']} violations, "
        f"{result['counts']['unsettled']} in flight)"
    )
    for title, findings, style in (
        ("violation", result["violations"], "red"),
        ("in flight", result["unsettled"], "yellow"),
    ):
        for finding in findings:
            console.print(
                f"[{style}]{title}[/] (invariant {finding['invariant']}) "
                f"{finding['what']}: {finding['count']}"
            )
            for row in finding["rows"][:5]:
                console.print(f"    {row}", markup=False)


def check_progress_bar() -> Any:
    """A progress bar on stderr for `rem check` (a context manager yielding the callback)."""
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    labels = {
        "structure": "structure (quick_check, foreign keys)",
        "sessions": "sessions",
        "chroma": "Chroma",
    }

    @contextmanager
    def bar() -> Any:
        console = Console(stderr=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not console.is_terminal,
        ) as shown:
            tasks: dict[str, Any] = {}

            def update(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = shown.add_task(labels.get(phase, phase), total=total)
                shown.update(tasks[phase], completed=done, total=total)

            yield update

    return bar()


def drill_round_printer() -> Any:
    """A callback printing one line per drill round on stderr as it happens."""
    console = Console(stderr=True)

    def show(rnd: Any) -> None:
        took = f"{rnd.recovery_s:.2f} s" if rnd.recovery_s is not None else "-"
        status = f"[red]{rnd.error}[/]" if rnd.error else rnd.recovered
        console.print(
            f"round {rnd.number:>2}: SIGKILL {rnd.role} pid {rnd.pid} at "
            f"{rnd.killed_at_s:.1f} s -> {status} ({took})"
        )

    return show


def print_drill(report: dict[str, Any]) -> None:
    console = Console()
    table = Table(
        "round",
        "killed",
        "pid",
        "at (s)",
        "recovered",
        "recovery (s)",
        "released",
        title=f"rem drill sigkill ({report['data_dir']})",
    )
    for rnd in report["rounds"]:
        table.add_row(
            str(rnd["number"]),
            rnd["role"],
            str(rnd["pid"]),
            f"{rnd['killed_at_s']:.1f}",
            rnd["error"] or rnd["recovered"],
            "-" if rnd["recovery_s"] is None else f"{rnd['recovery_s']:.2f}",
            str(rnd["released"]),
        )
    console.print(table)
    check = report["check"]
    for finding in check.get("violations", []):
        console.print(f"[red]violation[/] {finding['what']}: {finding['count']}")
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
                bench["name"] if i == 0 else "",
                line["what"],
                line["figure"],
                str(bench["seconds"]) if i == 0 else "",
            )
    Console().print(table)


def print_replay(result: dict[str, Any]) -> None:
    console = Console()
    if result["rows"]:
        table = Table("summary id", "outcome", "what differs", box=None)
        for row in result["rows"]:
            keys = ", ".join(
                f"{k['key']} ({k['reason']}: {k['expected']!r} -> {k['actual']!r})" for k in row["keys"]
            )
            what = "; ".join(filter(None, ["document" if row["document"] else "", keys, row["reason"] or ""]))
            table.add_row(row["summary_id"], row["outcome"], what or "-")
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
