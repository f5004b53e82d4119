"""`rem show`: one session's transcript, with usage, cost, model errors and recovery markers."""

from __future__ import annotations

from typing import Annotated

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def show(
    cli: typer.Context,
    session_id: Annotated[str, typer.Argument(metavar="SESSION", help="The session to show.")],
    last: Annotated[int, typer.Option("--last", min=0, help="Only the last N messages (0: all).")] = 0,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Show a session's transcript: messages, parts, usage, cost, model errors, recovery markers, tool calls.

    With --server URL (or REM_SERVER) it shows what that `rem serve` gives: the
    session, its messages and parts, its hold (waiting inputs' texts, recoveries
    and the tool-call history are shown on the store's host only).

    Example: rem show demo-billing-1 --last 10
    """
    url = common.server_of(cli, server, data=data)
    if url is not None:
        from backend.api import client  # import time: httpx2, only with --server

        result = client.through(url, lambda r: client.show(r, session_id, last=last))
    else:
        ctx = common.make_context(cli, data, None, read_only=True)
        result = common.run(lambda: common.with_context(ctx, lambda c: ops.show(c, session_id, last=last)))
    if json:
        common.emit_json(result)
    else:
        from backend.cli.render_transcript import (
            print_transcript,
        )  # import time: rich, only for the human view

        print_transcript(result)
