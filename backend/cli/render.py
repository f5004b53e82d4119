"""Human renderings of `rem` results (rich, on stdout: they are the data without --json)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def print_status(result: dict[str, Any]) -> None:
    console = Console()
    chroma = result["chroma"]
    health = "[green]healthy[/]" if chroma["healthy"] else f"[red]down[/] ({chroma.get('error')})"
    console.print(f"[bold]rem[/] data dir {result['data_dir']}  schema v{result['schema_version']}")
    console.print(f"Chroma {chroma.get('url') or '-'}: {health}")
    index = (result.get("backlog") or {}).get("index") or {}
    if index:
        console.print(
            f"recall index: {index['sessions_behind']} session(s) behind"
            + (f" (oldest {index['oldest_ms'] / 1000:.1f} s)" if index["sessions_behind"] else "")
            + f", {index['vectors_pending']} turn vector(s) pending, ~{index['turns_indexed_approx']} turns indexed"
        )
    # (the snapshot has no "tables" key: this printed a KeyError traceback before)
    table = Table("what", "count", box=None)
    for name, count in (result.get("counts") or {}).items():
        table.add_row(name, str(count))
    console.print(table)


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


def progress_printer() -> Any:
    """A callback that prints `what: n` progress on stderr (one line, rewritten)."""
    console = Console(stderr=True)

    def show(what: str, done: int) -> None:
        console.print(f"{what}: {done}", end="\r", highlight=False)

    return show


def print_reindex(result: dict[str, Any]) -> None:
    console = Console()
    summaries, turns = result["summaries"], result["turns"]
    receipts = summaries["receipts"]
    console.print(
        f"[bold]rem reindex[/] with {result['embedder']} ({result['dim']}-d) in {result['seconds']:.1f} s"
    )
    console.print(
        f"summaries: {receipts['scanned']} receipts replayed ({receipts['quarantined']} quarantined), "
        f"{summaries['legacy_rows']} legacy rows kept, {summaries['overlays']} Dream overlays rewritten"
    )
    pending = f", [yellow]{turns['pending']} pending[/]" if turns["pending"] else ""
    console.print(f"turns: {turns['vectors']} vectors written{pending}")


def _when(ms: Any) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ms / 1000)) if isinstance(ms, int) else "-"


def print_recall(result: dict[str, Any]) -> None:
    console = Console()
    scope = f"session {result['session']}" if result["session"] else f"project {result['project'] or '(all)'}"
    console.print(
        f"[bold]rem recall[/] {result['query']!r} in {scope}: {len(result['items'])} item(s) "
        f"in {result['took_ms']:.1f} ms",
        highlight=False,
    )
    for note in result["degraded"]:
        console.print(f"[yellow]degraded[/] {note}", highlight=False)
    table = Table("#", "kind", "score", "session", "who / when", "text", "found by", box=None)
    for rank, item in enumerate(result["items"], 1):
        who = item.get("speaker") or item.get("title") or ""
        table.add_row(
            str(rank),
            item["kind"],
            f"{item['score']:.3f}",
            item["session_id"],
            f"{who} {_when(item.get('time'))}".strip(),
            " ".join(str(item["text"]).split())[:160],
            ",".join(item["provenance"]["found_by"]),
        )
    console.print(table)


@contextmanager
def byte_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr driven by (done, total) bytes; silent when stderr is not a terminal."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    console = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def print_import(result: dict[str, Any]) -> None:
    console = Console()
    verdict = "[green]ok[/]" if result["ok"] else f"[red]{result['error_count']} bad line(s)[/]"
    console.print(
        f"[bold]rem import[/] {result['file']}: {verdict}; {result['written']} message(s) written, "
        f"{result['already_imported']} already there, {result['sessions']} session(s)",
        highlight=False,
    )
    for error in result["errors"]:
        console.print(f"  line {error['line']}: {error['error']}", markup=False, highlight=False)
    if result["sessions_skipped"]:
        shown = ", ".join(result["sessions_skipped"][:10])
        console.print(f"  sessions left out whole: {shown}", markup=False, highlight=False)


def print_session(result: dict[str, Any]) -> None:
    console = Console()
    session, dream = result["session"], result["dream"] or {}
    console.print(
        f"[bold]session {session['id']}[/] in project {session['project']}: {session['message_count']} "
        f"message(s); Dream {dream.get('digest_state', '-')}, indexed {dream.get('indexed_revision') or '-'}",
        highlight=False,
    )
    for message in result["messages"]:
        data = message["data"] if isinstance(message["data"], dict) else {}
        status = f" ({data['status']})" if data.get("status") else ""
        who = data.get("speaker") or message["type"]
        text = escape(str(data.get("text", "")))
        console.print(f"[dim]{message['seq']:>4}[/] [bold]{escape(who)}[/]{status}: {text}", highlight=False)
        memory = data.get("memory") or {}
        for item in memory.get("items") or []:
            reused = " (reused after recovery)" if memory.get("reused") else ""
            console.print(
                f"       [cyan]memory[/] {item['kind']} {item['id']} ({item['session_id']}, "
                f"{item['score']:.2f}){reused}: {escape(item['text'][:120])}",
                highlight=False,
                markup=True,
            )
