"""`rem mcp`: the Model Context Protocol server over stdio."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from backend.cli import common
from backend.core.errors import BadInput


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)


def mcp(
    cli: typer.Context,
    project: Annotated[
        list[str] | None,
        typer.Option(
            "--project",
            help="A project the client may see (repeatable); nothing of any other project is served.",
            show_default=False,
        ),
    ] = None,
    all_projects: Annotated[
        bool, typer.Option("--all-projects", help="Let the client see every project (instead of --project).")
    ] = False,
    allow_writes: Annotated[
        bool, typer.Option("--allow-writes", help="Also offer add_memory (admits an input through rem send).")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Log a failing tool's traceback on stderr (the client gets one line)."),
    ] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> None:
    """Serve rem's memory over MCP on stdio: recall, get_session, graph_neighbors, list_projects.

    The scope is explicit: --project P (repeatable) pins what a client may
    see; --all-projects serves every project. Read-only unless
    --allow-writes. Point an MCP client at `rem mcp --data DIR --project P`.

    Example: rem mcp --data ./demo --project ops
    """
    if all_projects and project:
        raise BadInput("--project and --all-projects contradict each other: pass one of them")
    if not all_projects and not project:
        raise BadInput(
            "rem mcp needs a scope: pass --project P (repeatable) for the projects a client may see, "
            "or --all-projects to serve every project"
        )
    from backend.execution.sessions import validate_id  # import time: the library loads when a command runs

    for name in project or []:
        validate_id("project", name, "--project")
    if debug:
        logging.getLogger("rem.mcp").setLevel(logging.DEBUG)
    # import time: the MCP SDK, only for this command
    from backend.programs.mcp_server import serve

    ctx = common.make_context(cli, data, chroma_url, read_only=not allow_writes)
    projects = None if all_projects else sorted(set(project or []))
    common.run(lambda: serve(ctx, allow_writes=allow_writes, projects=projects, debug=debug))
