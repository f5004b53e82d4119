"""`rem tools`'s human view: the sources and tools tables, every value as plain text."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from backend.ops.tool_list import ToolsReport

STATE_STYLE = {"up": "green", "down": "red", "starting": "yellow", "idle": "dim", "closed": "dim"}


def print_tools(report: ToolsReport) -> None:
    """The report as two tables (sources, tools) plus refused tools and warnings; every value as plain text."""
    console = Console(highlight=False, emoji=False)
    console.print(Text(f"tool configuration: {report['config'] or 'none (REM_MCP_CONFIG is not set)'}"))
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
            Text(f"refused: {refused['server']}.{refused['tool']}: it {refused['reason']}", style="yellow")
        )
    for warning in report["warnings"]:
        console.print(Text(f"warning: {warning}", style="yellow"))


def _table(*headers: str) -> Table:
    return Table(*headers, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False)


def _servers_table(servers: list[dict[str, Any]]) -> Table:
    table = _table("source", "state", "transport", "tools", "restarts", "pid", "last error")
    for column in table.columns[:-1]:
        column.no_wrap = True
    for server in servers:
        state = server["state"]
        table.add_row(
            Text(server["server"]),
            Text(state, style=STATE_STYLE.get(state, "")),
            Text(server["transport"]),
            Text("-" if server["tools"] is None else str(server["tools"])),
            Text(str(server["restarts"])),
            Text("-" if server["pid"] is None else str(server["pid"])),
            Text(server["last_error"] or "-"),
        )
    return table


def _tools_table(rows: list[dict[str, Any]]) -> Table:
    table = _table("tool", "effect", "from", "permission", "from", "timeout", "up")
    for column in table.columns:
        column.no_wrap = True
    for tool in rows:
        timeout = f"{tool['timeout_ms'] / 1000:g} s" + ("*" if tool["timeout_source"] == "config" else "")
        table.add_row(
            Text(tool["name"]),
            Text(tool["effect"]),
            Text(tool["effect_source"], style="dim"),
            Text(tool["permission"]),
            Text(tool["permission_source"], style="dim"),
            Text(timeout),
            Text("yes", style="green") if tool["available"] else Text("no", style="red"),
        )
    return table
