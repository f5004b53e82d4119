"""`rem reindex`: rebuild every vector (summaries from their receipts, turns from state.db)."""

from __future__ import annotations

import typer

from backend import ops
from backend.cli import common, output


def register(app: typer.Typer) -> None:
    app.command("reindex")(reindex)


def reindex(
    cli: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Rebuild the Chroma collections with the configured embedder (REM_EMBEDDER); no model call.

    Run it after changing REM_EMBEDDER: until then rem refuses a collection
    written by another embedder. Safe to run again after a crash.

    Example: REM_EMBEDDER=wordllama rem reindex --json
    """
    # import time: rich and the records, not for --help
    from backend.cli.render import print_reindex, progress_printer

    ctx = common.make_context(cli, data, chroma_url)
    result = common.run(
        lambda: common.with_context(ctx, lambda c: ops.reindex(c, progress=progress_printer()))
    )
    output.show(result, json, print_reindex)
