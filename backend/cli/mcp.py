"""`rem mcp`: the Model Context Protocol server over stdio."""

from __future__ import annotations

from typing import Annotated

import typer

from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)


def mcp(
    allow_writes: Annotated[
        bool, typer.Option("--allow-writes", help="Also offer add_memory (admits an input through rem send).")
    ] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> None:
    """Serve rem's memory over MCP on stdio: recall, get_session, graph_neighbors, list_projects.

    Read-only unless --allow-writes. Point an MCP client at `rem mcp --data DIR`.

    Example: rem mcp --data ./demo
    """
    from backend.programs.mcp_server import serve  # the SDK loads only for this command

    ctx = common.make_context(data, chroma_url, read_only=not allow_writes)
    common.run(lambda: serve(ctx, allow_writes=allow_writes))
