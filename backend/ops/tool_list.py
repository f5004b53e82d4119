"""`rem tools`: every configured tool, how rem treats its calls, and whether its server is up.

It loads the registry from `REM_MCP_CONFIG` (or `config_path`) and the
installed `rem.tools` entry points, starts every server once to list its
tools, and reports, as plain JSON:

* `tools`: each tool's names, effect class and where it came from
  (annotation, config, default), permission and its source, timeout, and
  whether it is available now (with the reason when not);
* `servers`: each source's health (state, last error, restarts, pid, tools,
  the tools it had refused because their names cannot be function names);
* `warnings`: `rem.tools` entries naming a tool its server does not offer, and
  tools whose annotations contradict each other (rem treats them as `effect`);
* `ok`: every source is up. `rem tools` exits 3 (a dependency unreachable)
  when one is not: it is the command a deploy or a runbook runs to check the
  tool configuration, and a broken server must not pass silently.

It needs no data dir and writes nothing; the servers it started are stopped
before it returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from backend.core.settings import settings


class ToolsReport(TypedDict):
    config: str | None
    ok: bool
    servers: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    warnings: list[str]


async def tools(*, config_path: Path | None = None) -> ToolsReport:
    """The configured tools and their servers' health (servers are started, listed and stopped)."""
    from backend.tools.registry import ToolRegistry  # import time: the MCP SDK, only for tool commands

    path = config_path if config_path is not None else settings.mcp_config
    registry = await ToolRegistry.load(config_path=path)
    try:
        specs = await registry.catalogue()
        servers = [dict(health) for health in registry.health()]
        return {
            "config": None if registry.config.path is None else str(registry.config.path),
            "ok": all(server["state"] == "up" for server in servers),
            "servers": servers,
            "tools": [spec.as_json() for spec in specs],
            "warnings": registry.config_warnings() + [w for s in specs if (w := s.annotation_warning())],
        }
    finally:
        await registry.aclose()
