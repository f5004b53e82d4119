"""`rem send`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from backend import ops
from backend.cli import common
from backend.core.errors import BadInput, Refused
from backend.core.inert import visible
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


DeliveryOpt = Annotated[
    Delivery,
    typer.Option("--delivery", help="queue: start the next turn when idle; steer: join the running turn."),
]
IdOpt = Annotated[
    str | None,
    typer.Option(
        "--id",
        help="Input id, for idempotent resends (letters, digits, . _ -; at most 100).",
        show_default=False,
    ),
]
ProjectOpt = Annotated[
    str | None,
    typer.Option(
        "--project",
        help="The project a new session belongs to (default: default); recall is scoped by it.",
        show_default=False,
    ),
]
FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow",
        help="Print the reply as it streams, to its end (with --server: through a server restart too).",
    ),
]


def send(
    cli: typer.Context,
    session: SessionArg,
    text: TextArg,
    delivery: DeliveryOpt = Delivery.QUEUE,
    input_id: IdOpt = None,
    project: ProjectOpt = None,
    follow: FollowOpt = False,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Admit an input into a session (idempotent on --id).

    With --server URL (or REM_SERVER) it goes through that `rem serve`, with the
    token in REM_TOKEN_FILE; --follow then prints the reply as it streams.

    Example: rem send s1 "summarise yesterday's run" --delivery queue
    """
    if text == "-":
        from backend.execution import sessions  # import time: the library loads when a command runs

        text = sessions.decode_text(sessions.read_bounded(sys.stdin.buffer))
    url = common.server_of(cli, server, data=data)
    if url is not None:
        _send_remote(url, session, text, delivery, input_id, project, follow=follow, json=json)
        return
    if follow:
        raise BadInput(
            "--follow reads the reply from a server's event stream: give --server URL (or REM_SERVER)"
        )
    ctx = common.make_context(cli, data, None)
    result = common.run(
        lambda: common.with_context(
            ctx,
            lambda c: ops.send(c, session, text, delivery=delivery, input_id=input_id, project=project),
        )
    )
    if json:
        common.emit_json(result)
    else:
        _admitted(result)


def _admitted(result: dict[str, Any]) -> None:
    verb = "already admitted" if result["duplicate"] else "admitted"
    common.note(
        f"rem: {verb} {result['input_id']} into session {result['session_id']} "
        f"({result['delivery']}, seq {result['admitted_seq']})"
    )


def _send_remote(
    url: str,
    session: str,
    text: str,
    delivery: str,
    input_id: str | None,
    project: str | None,
    *,
    follow: bool,
    json: bool,
) -> None:
    """`rem send --server URL [--follow]`: the same admission (and output) through the API."""
    # import time: httpx2, only with --server
    from backend.api import client
    from backend.api import follow as following

    if not follow:
        result = client.through(
            url,
            lambda r: client.send(r, session, text, delivery=delivery, input_id=input_id, project=project),
        )
        if json:
            common.emit_json(result)
        else:
            _admitted(result)
        return
    result = client.through(
        url,
        lambda r: following.send(
            r,
            session,
            text,
            delivery=delivery,
            input_id=input_id,
            project=project,
            admitted=(lambda _: None) if json else _admitted,
            write=(lambda _: None) if json else _print_part,
            note=common.note,
        ),
    )
    if json:
        common.emit_json(result)
    elif result["reply"]["text"] and not result["reply"]["text"].endswith("\n"):
        _print_part("\n")
    failure = result["reply"]["failure"]
    if failure is not None:
        raise Refused(
            f"the turn answering {result['input_id']} failed ({failure['class']}): {failure['message']}"
        )


def _print_part(text: str) -> None:
    """A streamed part of the reply on stdout, as it comes (control characters shown as escapes)."""
    sys.stdout.write(visible(text, multiline=True))
    sys.stdout.flush()
