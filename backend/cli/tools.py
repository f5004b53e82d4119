"""`rem tools`: the agent's configured tools, their effect classes and permissions, and their servers' health."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from backend import ops
from backend.cli import common
from backend.core.errors import ExitCode


def register(app: typer.Typer) -> None:
    app.command("tools")(tools)


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config", help="Check this MCP config file instead of $REM_MCP_CONFIG.", show_default=False
    ),
]


def tools(
    config: ConfigOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """List every configured tool: server, effect class and its source, permission, timeout, server health.

    Starts each MCP server once to list its tools (and stops it). Exits 3 when a
    server is down, 2 when the configuration is wrong.

    Example: rem tools --config ./mcp.json --json
    """
    report = common.run(lambda: ops.tools(config_path=config))
    if json:
        common.emit_json(report)
    else:
        from backend.cli.render_tools import print_tools  # import time: rich, only for the human view

        print_tools(report)
    return int(ExitCode.OK if report["ok"] else ExitCode.UNREACHABLE)
