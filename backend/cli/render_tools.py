"""`rem tools`'s human view: the sources and tools tables, every value as plain text."""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from backend.core.inert import visible
from backend.ops.records import ToolCallRecord, ToolCalls
from backend.ops.tool_list import ToolsReport
from backend.ops.tool_status import elapsed, server_down_lines

STATE_STYLE = {"up": "green", "down": "red", "starting": "yellow", "idle": "dim", "closed": "dim"}


def print_tools(report: ToolsReport) -> None:
    """The report as two tables (sources, tools) plus refused tools and warnings; every value inert text."""
    console = Console(highlight=False, emoji=False)
    console.print(_plain(f"tool configuration: {report['config'] or 'none (REM_MCP_CONFIG is not set)'}"))
    if not report["servers"]:
        console.print(
            Text("no tool sources: set REM_MCP_CONFIG, or install a package with rem.tools entry points")
        )
        return
    console.print(_servers_table(report["servers"]))
    if report["tools"]:
        console.print(_tools_table(report["tools"]))
        console.print(
            Text("* timeout from the config; a tool that is not up has its server's error above", style="dim")
        )
    for refused in (r for server in report["servers"] for r in server.get("refused", [])):
        console.print(
            _plain(f"refused: {refused['server']}.{refused['tool']}: it {refused['reason']}", style="yellow")
        )
    for warning in report["warnings"]:
        console.print(_plain(f"warning: {warning}", style="yellow"))


def _plain(value: object, style: str = "") -> Text:
    """A value from a server or a config as one line of plain text: escapes shown, never obeyed."""
    return Text(visible(value), style=style)


def _table(*headers: str) -> Table:
    return Table(*headers, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)


def _servers_table(servers: list[dict[str, Any]]) -> Table:
    table = _table("source", "state", "transport", "tools", "restarts", "pid", "last error")
    for column in table.columns[:-1]:
        column.no_wrap = True
    for server in servers:
        state = server["state"]
        table.add_row(
            _plain(server["server"]),
            _plain(state, style=STATE_STYLE.get(state, "")),
            _plain(server["transport"]),
            _plain("-" if server["tools"] is None else server["tools"]),
            _plain(server["restarts"]),
            _plain("-" if server["pid"] is None else server["pid"]),
            _plain(server["last_error"] or "-"),
        )
    return table


def _tools_table(rows: list[dict[str, Any]]) -> Table:
    table = _table("tool", "effect", "from", "permission", "from", "timeout", "up")
    for column in table.columns:
        column.no_wrap = True
    for tool in rows:
        timeout = f"{tool['timeout_ms'] / 1000:g} s" + ("*" if tool["timeout_source"] == "config" else "")
        table.add_row(
            _plain(tool["name"]),
            _plain(tool["effect"]),
            _plain(tool["effect_source"], style="dim"),
            _plain(tool["permission"]),
            _plain(tool["permission_source"], style="dim"),
            _plain(timeout),
            Text("yes", style="green") if tool["available"] else Text("no", style="red"),
        )
    return table


def arguments_text(arguments: object, limit: int = 120) -> str:
    """A call's arguments as one line of compact JSON, cut at `limit` characters, controls escaped."""
    text = visible(json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _waiting_row(call: ToolCallRecord) -> list[Text]:
    owner = f"{call['owner_id'] or '-'} e{call['epoch'] if call['epoch'] is not None else '-'}"
    return [
        Text(visible(call["call_id"])),
        Text(visible(call["session_id"])),
        Text(visible(call["tool"])),
        Text(call["effect"]),
        Text(elapsed(call["age_ms"])),
        Text(visible(owner) + ("" if call["owner_alive"] else " (dead)")),
        Text(arguments_text(call["arguments"])),
    ]


def print_server_health(console: Console, tools: ToolCalls, now: int) -> None:
    """`rem status`'s line per tool source down in a live executor (none when all are up or none is used)."""
    for line in server_down_lines(tools.get("servers", []), now):
        console.print(Text(visible(line), style="red"))


def print_waiting_calls(console: Console, tools: ToolCalls, rows: int) -> None:
    """`rem status`'s tool calls: the counts, then each call waiting for a person, then each one
    running, oldest first."""
    counts = tools["counts"]
    if not any(counts.values()):
        return
    console.print(Text("tool calls: " + ", ".join(f"{state} {n}" for state, n in counts.items() if n)))
    for title, state, calls, verb in (
        ("awaiting approval", "awaiting_approval", tools["awaiting_approval"], "rem approve|deny CALL"),
        ("unknown outcome", "unknown", tools["unknown_outcome"], "rem resolve CALL --done|--retry|--fail"),
        ("running", "running", tools["running"], "in flight in the executor named (owner)"),
    ):
        if not calls:
            continue
        table = Table(
            *("call", "session", "tool", "effect", "waiting", "owner epoch", "arguments"),
            title=f"Tool calls {title} ({counts[state]}): {verb}",
            title_justify="left",
            box=None,
        )
        for call in calls[:rows]:
            table.add_row(*_waiting_row(call))
        console.print(table)


STATE_TONE = {"completed": "green", "error": "red", "denied": "red", "unknown": "red bold"}
SHOW_RESULT_CHARS = 2_000  # a result longer than this prints cut; `rem show --json` has it whole


def print_session_calls(console: Console, calls: list[dict[str, Any]]) -> None:
    """`rem show`'s tool calls: each with its state, arguments, key, owner and epoch, and result."""
    if not calls:
        return
    console.print(Text(f"Tool calls ({len(calls)})", style="bold"))
    for call in calls:
        head = Text(f"  {visible(call['call_id'])} ")
        head.append(visible(call["state"]), style=STATE_TONE.get(call["state"], "yellow"))
        head.append(
            visible(
                f" {call['tool']} ({call['effect']}, {call['permission']}) step {call['step']}.{call['idx']}"
                f" starts {call['starts']} retries {call['retries']}"
                f" owner {call['owner_id'] or '-'} epoch {call['epoch'] if call['epoch'] is not None else '-'}"
            )
        )
        console.print(head)
        console.print(Text(f"    arguments {arguments_text(call['arguments'], 400)}"))
        console.print(Text(f"    key {visible(call['idempotency_key'])}", style="dim"))
        if call["result"] is not None:
            console.print(Text("    result " + _result_text(call)))
        if call["reason"]:
            console.print(Text(f"    reason {visible(call['reason'])}"))
        if call["decided_by"]:
            console.print(Text(f"    decided by {visible(call['decided_by'])}", style="dim"))


def _result_text(call: dict[str, Any]) -> str:
    text = visible(call["result"], multiline=False)
    notes = ["tool error"] if call["is_error"] else []
    if call["result_truncated"]:
        notes.append(f"kept truncated, {call['result_bytes']} bytes")
    if len(text) > SHOW_RESULT_CHARS:
        text = text[:SHOW_RESULT_CHARS] + "…"
        notes.append("cut here: rem show --json has it whole")
    return text + (f" ({'; '.join(notes)})" if notes else "")
