"""`rem send`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from backend import ops
from backend.cli import common
from backend.store.states import Delivery


def register(app: typer.Typer) -> None:
    app.command("send")(send)


SessionArg = Annotated[
    str, typer.Argument(metavar="SESSION", help="Session id (created on first use).", show_default=False)
]
TextArg = Annotated[
    str,
    typer.Argument(
        metavar="TEXT",
        help="The prompt (at most 256 KiB of UTF-8); - reads it from stdin.",
        show_default=False,
    ),
]


def send(
    cli: typer.Context,
    session: SessionArg,
    text: TextArg,
    delivery: Annotated[
        Delivery,
        typer.Option(
            "--delivery", help="queue: start the next turn when idle; steer: join the running turn."
        ),
    ] = Delivery.QUEUE,
    input_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="Input id, for idempotent resends (letters, digits, . _ -; at most 100).",
            show_default=False,
        ),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            help="The project a new session belongs to (default: default); recall is scoped by it.",
            show_default=False,
        ),
    ] = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Admit an input into a session (idempotent on --id).

    Example: rem send s1 "summarise yesterday's run" --delivery queue
    """
    if text == "-":
        from backend.execution import sessions  # import time: the library loads when a command runs

        text = sessions.decode_text(sessions.read_bounded(sys.stdin.buffer))
    ctx = common.make_context(cli, data, None)
    result = common.run(
        lambda: common.with_context(
            ctx,
            lambda c: ops.send(c, session, text, delivery=delivery, input_id=input_id, project=project),
        )
    )
    if json:
        common.emit_json(result)
        return
    verb = "already admitted" if result["duplicate"] else "admitted"
    common.note(
        f"rem: {verb} {result['input_id']} into session {result['session_id']} "
        f"({result['delivery']}, seq {result['admitted_seq']})"
    )
