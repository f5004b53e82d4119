"""`rem send`."""

from __future__ import annotations

import typer

from backend.cli import common
from backend.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    app.command("send")(send)


def send(session: str, text: str, data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Admit an input into a session (idempotent on --id).

    Example: rem send s1 "summarise yesterday's run" --delivery queue
    """
    raise NotImplementedYet("`rem send` is not implemented yet")
