"""`rem recall`: ranked memory items (turns, summaries, graph facts) for a query."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("recall")(recall)


def recall(
    cli: typer.Context,
    query: Annotated[
        str, typer.Argument(metavar="QUERY", help="What to look for, in plain words.", show_default=False)
    ],
    project: Annotated[
        str | None,
        typer.Option("--project", help="The project to search (default: default).", show_default=False),
    ] = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Only this session's memory.", show_default=False)
    ] = None,
    k: Annotated[int, typer.Option("--k", help="How many items (1-200).")] = 10,
    all_projects: Annotated[bool, typer.Option("--all-projects", help="Search every project.")] = False,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind", help="Only items of this kind: turn, summary, fact (repeatable).", show_default=False
        ),
    ] = None,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Recall memory: hybrid dense + FTS5 over turns, session summaries and Dream's graph facts.

    Each item shows its kind, session, score and which retrievers found it.

    Example: rem recall "when did we move the payments service" --project ops --k 5
    """
    url = common.server_of(cli, server, data=data, chroma_url=chroma_url)
    if url is not None:
        result = _recall_remote(url, query, project, session, k, all_projects, kind)
    else:
        ctx = common.make_context(cli, data, chroma_url, read_only=True)
        kinds = tuple(kind) if kind else ("turn", "summary", "fact")
        result = common.run(
            lambda: common.with_context(
                ctx,
                lambda c: ops.recall(
                    c, query, project=project, session_id=session, k=k, all_projects=all_projects, kinds=kinds
                ),
            )
        )
    if json:
        common.emit_json(result)
    else:
        from backend.cli.render import print_recall  # import time: rich, only for the human view

        print_recall(result)


def _recall_remote(
    url: str,
    query: str,
    project: str | None,
    session: str | None,
    k: int,
    all_projects: bool,
    kind: list[str] | None,
) -> dict[str, Any]:
    """`rem recall --server URL`: the same items, recalled by the server."""
    from backend.api import client  # import time: httpx2, only with --server

    return client.through(
        url,
        lambda r: client.recall(
            r,
            query,
            project=project,
            session_id=session,
            k=k,
            all_projects=all_projects,
            kinds=tuple(kind) if kind else None,
        ),
    )
