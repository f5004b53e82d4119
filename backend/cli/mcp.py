"""`rem mcp`: the Model Context Protocol server over stdio."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from backend.cli import common
from backend.core.errors import BadInput

ProjectOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--project",
        help="A project the client may see (repeatable); nothing of any other project is served.",
        show_default=False,
    ),
]
AllProjectsOpt = Annotated[
    bool, typer.Option("--all-projects", help="Let the client see every project (instead of --project).")
]
AllowWritesOpt = Annotated[
    bool, typer.Option("--allow-writes", help="Also offer add_memory (admits an input through rem send).")
]
AllowDecisionsOpt = Annotated[
    bool,
    typer.Option(
        "--allow-decisions",
        help="Also offer the operator's decisions on agent tool calls (approve, deny, resolve, and the "
        "list of calls waiting), journaled as `rem mcp (OPERATOR)`; needs --allow-writes.",
    ),
]
DebugOpt = Annotated[
    bool, typer.Option("--debug", help="Log a failing tool's traceback on stderr (the client gets one line).")
]


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)


def mcp(
    cli: typer.Context,
    project: ProjectOpt = None,
    all_projects: AllProjectsOpt = False,
    allow_writes: AllowWritesOpt = False,
    allow_decisions: AllowDecisionsOpt = False,
    debug: DebugOpt = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> None:
    """Serve rem's memory over MCP on stdio: recall, get_session, graph_neighbors, list_projects.

    The scope is explicit: --project P (repeatable) pins what a client may
    see; --all-projects serves every project. Read-only unless
    --allow-writes; the decisions on agent tool calls only with
    --allow-decisions as well. Point an MCP client at
    `rem mcp --data DIR --project P`.

    Example: rem mcp --data ./demo --project ops
    """
    _check_flags(project, all_projects, allow_writes, allow_decisions)
    if debug:
        logging.getLogger("rem.mcp").setLevel(logging.DEBUG)
    # import time: the MCP SDK, only for this command
    from backend.programs.mcp_server import mcp_operator, serve

    ctx = common.make_context(cli, data, chroma_url, read_only=not allow_writes, operator=mcp_operator())
    projects = None if all_projects else sorted(set(project or []))
    common.run(
        lambda: serve(
            ctx, allow_writes=allow_writes, allow_decisions=allow_decisions, projects=projects, debug=debug
        )
    )


def _check_flags(
    project: list[str] | None, all_projects: bool, allow_writes: bool, allow_decisions: bool
) -> None:
    """Refuse a scope or a grant said wrongly, before anything starts."""
    if all_projects and project:
        raise BadInput("--project and --all-projects contradict each other: pass one of them")
    if allow_decisions and not allow_writes:
        raise BadInput("--allow-decisions needs --allow-writes (a decision is a write): pass both")
    if not all_projects and not project:
        raise BadInput(
            "rem mcp needs a scope: pass --project P (repeatable) for the projects a client may see, "
            "or --all-projects to serve every project"
        )
    from backend.execution.sessions import validate_id  # import time: the library loads when a command runs

    for name in project or []:
        validate_id("project", name, "--project")
