"""`rem up`: the Chroma server and the daemons of one data dir, kept running."""

from __future__ import annotations

from typing import Annotated

import typer

from backend.api.listen import DEFAULT_LISTEN
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("up")(up)


def up(
    cli: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    executors: Annotated[int, typer.Option(min=0, help="Executor daemons.")] = 2,
    summarizers: Annotated[int, typer.Option(min=0, help="Summarizer daemons.")] = 1,
    dreams: Annotated[int, typer.Option(min=0, help="Dream daemons.")] = 1,
    load: Annotated[bool, typer.Option("--load", help="Also drive synthetic sessions.")] = False,
    load_sessions: Annotated[int, typer.Option(min=1, help="Sessions the load uses.")] = 6,
    load_rate: Annotated[float, typer.Option(min=0.01, help="Load inputs per second.")] = 1.0,
    serve: Annotated[
        str | None,
        typer.Option(
            "--serve",
            metavar="[HOST:PORT]",
            help=f"Also run the API server (`rem serve`) there (alone: {DEFAULT_LISTEN}), restarted like the daemons.",
        ),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help="Let --serve listen on a non-loopback address (behind a TLS proxy only)."
        ),
    ] = False,
    reap: Annotated[
        bool,
        typer.Option(
            "--reap/--no-reap",
            help="Record a dead daemon as stopped at once so its leases are taken "
            "over without waiting for expiry (--no-reap: they count down, or you release them).",
        ),
    ] = True,
) -> int:
    """Start the Chroma server and the daemons, restart any that die; Ctrl-C drains and stops them.

    Example: rem up --executors 2 --load --serve 127.0.0.1:8765
    """
    # import time: the supervisor, only for this command
    from backend.api.listen import parse_listen
    from backend.programs.supervisor import Supervisor, UpConfig, hold_up_lock

    if serve is not None:  # refused here, in one line, not by a child restarted in a loop
        parse_listen(serve, allow_remote=allow_remote)
    ctx = common.make_context(cli, data, chroma_url)
    config = UpConfig(
        executors=executors,
        summarizers=summarizers,
        dreams=dreams,
        load=load,
        load_sessions=load_sessions,
        load_rate=load_rate,
        reap=reap,
        serve=serve,
        allow_remote=allow_remote,
    )
    lock = hold_up_lock(ctx)  # a second `rem up` on this data dir: refused before it says anything
    common.note(f"rem up: data dir {ctx.data.root}; Ctrl-C drains and stops everything")
    supervisor = Supervisor(ctx, config, up_lock=lock)
    return common.run(lambda: common.with_context(ctx, lambda c: supervisor.run()))
