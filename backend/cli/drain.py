"""`rem drain`: a worker stops claiming, hands back its work and exits."""

from __future__ import annotations

from typing import Annotated

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("drain")(drain)


def drain(
    cli: typer.Context,
    owner_id: Annotated[str, typer.Argument(help="The worker's owner id (see `rem status`).")],
    wait: Annotated[bool, typer.Option("--wait", help="Block until the worker has stopped.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")] = 60.0,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Drain a worker: it stops claiming, finishes or hands back its work, releases its leases and exits.

    Example: rem drain executor-host-1234-ab12cd --wait
    """
    ctx = common.make_context(cli, data, None)
    show = None
    if wait and not json:
        from backend.cli.render import drain_progress_printer  # import time: rich, only for --wait's progress

        show = drain_progress_printer()
    result = common.run(
        lambda: common.with_context(
            ctx, lambda c: ops.drain(c, owner_id, wait=wait, timeout_s=timeout, progress=show)
        )
    )
    if json:
        common.emit_json(result)
    else:
        common.note(f"rem: {owner_id} is {result['state']}")
