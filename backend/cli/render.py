"""Human renderings of `rem` results (rich, on stdout: they are the data without --json).

Every value that comes from the data (ids, paths, turns, Chroma values, errors)
goes through `_e` (inside markup) or `_cell` (a `Text`): both show control
characters as escapes (`backend.core.inert.visible`: an `ESC]0;` in a turn
must not retitle the operator's terminal) and neither is read as markup (a
`[/oops]` in a summary title prints as itself; it used to crash `rem replay`,
and a `[/]` in a turn crashed `rem recall`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from backend.cli.render_tools import print_server_health, print_waiting_calls
from backend.core.inert import visible
from backend.memory.index import IndexLag
from backend.models.health import ModelState
from backend.ops.records import ModelHealth, ReplayReport, Status
from backend.ops.results import DrainReport
from backend.ops.tool_status import elapsed
from backend.runtime import refusals
from backend.store.workers import WorkerState


def _console(*, stderr: bool = False) -> Console:
    # no emoji codes either: `:thumbs_up:` inside a value stays as typed
    return Console(stderr=stderr, emoji=False)


def _e(value: Any) -> str:
    """A data value as markup-safe text, its control characters shown as escapes."""
    return escape(visible(value))


def _cell(value: Any) -> Text:
    """A data value as a table cell: plain text, its control characters shown as escapes."""
    return Text(visible(value))


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"${value:.6f}"
    return f"${value:,.4f}" if value < 100 else f"${value:,.2f}"


def _tokens(tokens: dict[str, int]) -> str:
    cache = tokens.get("cache_read", 0) + tokens.get("cache_write", 0)
    parts = [f"in {tokens.get('input', 0):,}", f"out {tokens.get('output', 0):,}"]
    if tokens.get("reasoning"):
        parts.append(f"reasoning {tokens['reasoning']:,}")
    if cache:
        parts.append(f"cache {tokens.get('cache_read', 0):,}r/{tokens.get('cache_write', 0):,}w")
    return " ".join(parts)


MODEL_TONE = {ModelState.OK: "green", ModelState.DEGRADED: "yellow", ModelState.DOWN: "red"}


def model_lines(model: ModelHealth) -> list[str]:
    """The model-health block of `rem status`, in rich markup."""
    state = model["state"]
    if state == ModelState.UNUSED:
        return ["Model: none used (offline defaults)"]
    where = _e(", ".join(model["endpoints"]) or "-")
    head = (
        f"Model [{MODEL_TONE.get(state, 'dim')}]{state}[/] {where} ({_e(', '.join(model['models']) or '-')})"
    )
    if state == ModelState.IDLE:
        return [head + f": no request in the last {model['window_ms'] // 60_000} min"]
    lines = [head, _model_traffic_line(model)]
    last = model["last_error"]
    if last:
        lines.append(f"  last error: {_e(last['error_class'])} {_e(last['message'] or '')}".rstrip())
    return lines


def _model_traffic_line(model: ModelHealth) -> str:
    """Requests, errors by class, retries and time to first token over the window."""
    errors = _e(", ".join(f"{name} {count}" for name, count in sorted(model["errors_by_class"].items())))
    ttft = (
        f"p50 {model['ttft_ms_p50']:.0f} ms, p95 {model['ttft_ms_p95']:.0f} ms"
        if model["ttft_ms_p50"] is not None
        else "-"
    )
    return (
        f"  last {model['window_ms'] // 60_000} min: {model['requests']} requests, {model['errors']} errors "
        f"({model['error_rate']:.1%}){': ' + errors if errors else ''}, {model['retries']} retries; "
        f"time to first token {ttft}"
    )


STATUS_ROWS = 20  # rows per list; `--json` has them all


def print_status(result: Status) -> None:
    """The snapshot in a terminal: headline counts, then leases, receipts, drift and workers."""
    console = Console(highlight=False, emoji=False)  # values print as typed
    _print_headline(console, result)
    _print_model(console, result)
    print_waiting_calls(console, result["tools"], STATUS_ROWS)
    _print_tables(console, result)


def _print_headline(console: Console, result: Status) -> None:
    """The data dir, Chroma's health, the headline counts, the totals and the recall index."""
    chroma, counts = result["chroma"], result["counts"]
    health = "[green]healthy[/]" if chroma["healthy"] else f"[red]down[/] ({_e(chroma['error'])})"
    console.print(
        f"[bold]rem[/] data dir {_e(result['data_dir'])}  schema v{result['schema_version']}  "
        f"{counts['sessions']} sessions"
    )
    console.print(f"Chroma {_e(chroma['url'] or '-')}: {health}")
    refused = chroma.get("refused")  # (a moment recorded before it existed has none)
    if refused:
        console.print(f"[red]{_e(refusals.describe(refused))}[/]")
    console.print(
        f"backlog {counts['backlog']} · expired leases {counts['expired_leases']} · "
        f"receipt mismatches {counts['mismatches']} · Dream pending {counts['dream_pending']} · "
        f"workers alive {counts['workers_alive']}"
    )
    _print_totals(console, result)
    _print_recall_index(console, result["backlog"]["index"])


def _print_recall_index(console: Console, index: IndexLag) -> None:
    """How far the recall index is behind the turns, in one line."""
    console.print(
        f"recall index: {index['sessions_behind']} session(s) behind"
        + (f" (oldest {index['oldest_ms'] / 1000:.1f} s)" if index["sessions_behind"] else "")
        + f", {index['vectors_pending']} turn vector(s) pending, ~{index['turns_indexed_approx']} turns indexed"
    )


def _print_tables(console: Console, result: Status) -> None:
    """Leases, receipt mismatches, Dream drift and workers, a table each (none when empty)."""
    now = result["generated_at"]
    _print_rows(
        console,
        "Leases",
        ("kind", "id", "owner", "epoch", "left"),
        [
            (
                lease["kind"],
                lease["id"],
                lease["owner_id"] or "-",
                lease["epoch"],
                "held" if lease["parked"] else f"{lease['time_left_ms'] / 1000:.0f} s",  # for a decision
            )
            for lease in result["leases"]
        ],
    )
    _print_rows(
        console,
        "Receipt mismatches",
        ("summary", "verdict", "keys"),
        [
            (r["summary_id"], r["verdict"], ", ".join(str(k["key"]) for k in r["keys"]) or "-")
            for r in result["receipts"]["mismatched"]
        ],
    )
    _print_rows(
        console,
        "Dream drift",
        ("session", "class", "attempts"),
        [(d["session_id"], d["class"], d["digest_attempts"]) for d in result["dream_drift"]],
    )
    _print_rows(
        console,
        "Workers",
        ("owner", "role", "state", "host", "pid", "heartbeat"),
        [
            (
                w["owner_id"],
                w["role"],
                w["state"] if w["alive"] or w["state"] == WorkerState.STOPPED else "dead",
                w["host"],
                w["pid"],
                f"{(now - w['heartbeat_at']) / 1000:.0f} s ago",
            )
            for w in result["workers"]
        ],
    )


def _print_rows(console: Console, title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    table = Table(*columns, title=f"{title} ({len(rows)})", title_justify="left", box=None)
    for row in rows[:STATUS_ROWS]:
        table.add_row(*(_cell(cell) for cell in row))
    console.print(table)
    if len(rows) > STATUS_ROWS:
        console.print(f"  … {len(rows) - STATUS_ROWS} more (rem status --json has them all)")


def _age(ms: int) -> str:
    return elapsed(ms) if ms else "-"


def _print_totals(console: Console, result: Status) -> None:
    """Every lease and every backlog, counted (the lists below stop at what a panel shows)."""
    totals = result["totals"]
    table = Table("backlog", "waiting", "oldest", box=None)
    for kind, count in totals["backlog"].items():
        table.add_row(_cell(kind), str(count), _age(totals["backlog_oldest_ms"][kind]))
    console.print(table)
    leases = Table("leases", "held", "expired", "dead owner", "longest expired", box=None)
    for kind, lease in totals["leases"].items():
        leases.add_row(
            _cell(kind),
            str(lease["held"]),
            str(lease["expired"]),
            str(lease["dead_owner"]),
            _age(lease["expired_max_ms"]),
        )
    console.print(leases)
    recoveries = totals["recoveries"]
    console.print(f"recoveries: {recoveries['waiting']} waiting, {recoveries['parked']} parked")


def _print_model(console: Console, result: Status) -> None:
    """The model endpoint's health, the tool sources down, the sessions held for an operator, tokens and cost."""
    for line in model_lines(result["model"]):
        console.print(line)
    print_server_health(console, result["tools"], result["generated_at"])
    for held in result["backlog"]["held"]:
        sid, reason = held["session_id"], held["reason"]
        console.print(
            f"[red]held[/] {_e(sid)}: {_e(reason)} ({held['waiting']} waiting); {unhold_hint(sid, reason)}"
        )
    _print_usage(console, result)


def unhold_hint(session_id: str, reason: str | None) -> str:
    """What lifts a session's hold: a decision on its tool call (`rem resume` refuses a tool hold:
    `tool_awaiting_approval`, `tool_outcome_unknown`), or `rem resume` once a model error is fixed."""
    if str(reason or "").startswith("tool_"):
        return "decide its tool call below: `rem approve`, `rem deny` or `rem resolve`"
    return f"`rem resume {_e(session_id)}` once fixed"


def _print_usage(console: Console, result: Status) -> None:
    usage = result["usage"]
    total = usage["total"]
    if not total["sessions"]:
        return
    console.print(
        f"Usage: {total['sessions']:,} sessions, {_tokens(total['tokens'])}, cost {_money(total['cost'])}"
    )
    table = Table("session", "model", "turns", "tokens", "cost", "last model error", box=None)
    for row in usage["sessions"][:STATUS_ROWS]:
        error = row["last_error"] or {}
        table.add_row(
            _cell(row["session_id"]),
            _cell(row["model"] or "-"),
            str(row["turns"]),
            _tokens(row["tokens"]),
            _money(row["cost"]),
            _cell(str(error.get("class") or "") + (" (held)" if row["held"] else "")),
        )
    console.print(table)


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


def print_replay(result: ReplayReport) -> None:
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


def drain_progress_printer() -> Callable[[DrainReport], None]:
    last: list[str] = []

    def show(report: DrainReport) -> None:
        line = (
            f"\r{visible(report['owner_id'])}: {report['state']}, {report['leases_held']} leases held, "
            f"{report['waited_ms'] / 1000:.1f} s"
        )
        if line != (last[0] if last else None):
            sys.stderr.write(line.ljust(90))
            sys.stderr.flush()
            last[:] = [line]
        if report["state"] == WorkerState.STOPPED:
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
        f"[bold]rem reindex[/] with {_e(result['embedder'])} ({result['dim']}-d) in {result['seconds']:.1f} s"
    )
    console.print(
        f"summaries: {receipts['scanned']} receipts replayed ({receipts['quarantined']} quarantined), "
        f"{summaries['legacy_rows']} legacy rows kept, {summaries['overlays']} Dream overlays rewritten"
    )
    pending = f", [yellow]{turns['pending']} pending[/]" if turns["pending"] else ""
    console.print(f"turns: {turns['vectors']} vectors written{pending}")


def _when(ms: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ms / 1000)) if isinstance(ms, int) else "-"


def print_recall(result: dict[str, Any]) -> None:
    """`rem recall`: each item's line, then its text (up to 160 characters, as stored, escaped, never
    markup) wrapped under it: it fits the terminal's width, 80 columns when not a terminal."""
    console = Console(highlight=False, emoji=False)  # values print as typed
    scope = f"session {result['session']}" if result["session"] else f"project {result['project'] or '(all)'}"
    console.print(
        f"[bold]rem recall[/] {_e(repr(result['query']))} in {_e(scope)}: {len(result['items'])} item(s) "
        f"in {result['took_ms']:.1f} ms"
    )
    for note in _degraded_lines(result["degraded"]):
        console.print(Text.assemble(("degraded ", "yellow"), visible(note)))
    waiting = result.get("not_indexed")
    if waiting and waiting["turns"]:
        console.print(
            f"[yellow]not indexed yet[/] {waiting['turns']} turn(s) in {waiting['sessions']} session(s) "
            "wait for the summarizer and Dream: `rem up` runs them (one pass: `rem daemon --role "
            "summarizer --once`, then `--role dream --once`)"
        )
    for rank, item in enumerate(result["items"], 1):
        _print_recall_item(console, rank, item)


def _print_recall_item(console: Console, rank: int, item: dict[str, Any]) -> None:
    """The item's line (rank, kind, score, session, who and when, found by), its text wrapped under it."""
    who = item.get("speaker") or item.get("title") or ""
    head = Text.assemble(
        (f"{rank:>2} ", "bold"),
        (f"{visible(item['kind']):<7} ", "cyan"),
        f"{item['score']:.3f}  ",
        visible(item["session_id"]),
        ("  " + visible(f"{who} {_when(item.get('time'))}".strip()), "dim"),
        ("  " + visible(",".join(item["provenance"]["found_by"])), "dim"),
    )
    console.print(head, no_wrap=True, overflow="ellipsis")
    text = Text(visible(" ".join(str(item["text"]).split())[:160]))
    for line in text.wrap(console, max(20, console.width - 3)):
        line.rstrip()  # in place
        console.print(Text("   ").append_text(line), no_wrap=True, overflow="ellipsis")


def _degraded_lines(notes: list[str]) -> list[str]:
    """The degraded notes, one line per cause: `dense, summaries: Chroma not running ...`."""
    by_cause: dict[str, list[str]] = {}
    for note in notes:
        what, sep, cause = note.partition(": ")
        by_cause.setdefault(cause if sep else note, []).append(what if sep else "")
    return [
        ", ".join(sorted(w for w in whats if w)) + ": " + cause if any(whats) else cause
        for cause, whats in by_cause.items()
    ]


@contextmanager
def byte_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr driven by (done, total) bytes; silent when stderr is not a terminal."""
    # import time: rich.progress, only for a progress bar
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    console = Console(stderr=True)
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    description = "[progress.description]{task.description}"
    with Progress(
        description, *columns, console=console, transient=True, disable=not console.is_terminal
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def print_import(result: dict[str, Any]) -> None:
    console = Console(highlight=False, emoji=False)
    verdict = "[green]ok[/]" if result["ok"] else f"[red]{result['error_count']} bad line(s)[/]"
    if result.get("stopped_while") and not result["error_count"]:
        verdict = "[yellow]stopped early[/]"
    console.print(
        f"[bold]rem import[/] {_e(result['file'])}: {verdict}; {result['written']} message(s) written, "
        f"{result['already_imported']} already there, {result['sessions']} session(s)"
    )
    for error in result["errors"]:
        console.print(f"  line {error['line']}: {visible(error['error'])}", markup=False)
    if result["sessions_skipped"]:
        shown = ", ".join(result["sessions_skipped"][:10])
        console.print(f"  sessions left out whole: {visible(shown)}", markup=False)
    if result.get("interrupted") or result.get("failure"):
        _print_import_stop(console, result)


def _print_import_stop(console: Console, result: dict[str, Any]) -> None:
    """Why an import stopped early, and which sessions it wrote whole and which not at all."""
    why = "interrupted" if result.get("interrupted") else f"stopped by an error: {result['failure']}"
    if result["stopped_while"] == "validating":
        done = f" while validating, after line {result['lines']}: nothing written"
    else:
        done = (
            f": {result['sessions_written']} session(s) written whole, "
            f"{result['sessions_not_written']} not written (none in part)"
        )
    console.print(visible(f"  {why}{done}"), markup=False)
    if result["not_written"]:
        more = result["sessions_not_written"] - len(result["not_written"])
        tail = f" and {more} more" if more > 0 else ""
        console.print(visible(f"  not written: {', '.join(result['not_written'])}{tail}"), markup=False)
