"""`rem show`: a session's transcript, with the memory each step was given."""

from __future__ import annotations

from typing import Annotated

import typer

from backend import ops
from backend.cli import common
from backend.cli.render import print_session


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def show(
    session: Annotated[str, typer.Argument(help="The session id.", show_default=False)],
    limit: Annotated[int, typer.Option("--limit", help="The newest N messages.")] = 200,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Show a session's transcript: messages, recovery markers, and the memory each step was given.

    Example: rem show s1 --limit 20
    """
    ctx = common.make_context(data, None, read_only=True)
    result = common.run(lambda: common.with_context(ctx, lambda c: ops.show_session(c, session, limit=limit)))
    if json:
        common.emit_json(result)
    else:
        print_session(result)
