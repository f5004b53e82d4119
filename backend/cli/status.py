"""`rem status`: the snapshot the console shows."""

from __future__ import annotations

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("status")(status)


def status(
    cli: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Show the snapshot the console shows: backlog, leases, receipts, Dream drift, workers.

    Example: rem status --json --data ./demo
    """
    ctx = common.make_context(cli, data, chroma_url, read_only=True)
    result = common.run(lambda: common.with_context(ctx, ops.status))
    if json:
        common.emit_json(result)
    else:
        from backend.cli.render import print_status  # import time: rich, only for the human view

        print_status(result)
