"""`rem drain`: a worker stops claiming, hands back its work and exits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common, output

if TYPE_CHECKING:
    from backend.ops.results import DrainReport


def register(app: typer.Typer) -> None:
    app.command("drain")(drain)


OwnerIdArg = Annotated[
    str, typer.Argument(metavar="OWNER_ID", help="The worker's owner id (see `rem status`).")
]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Block until the worker has stopped.")]
TimeoutOpt = Annotated[float, typer.Option(min=1, help="Seconds --wait waits at most.")]


def _progress_printer() -> Callable[[DrainReport], None]:
    from backend.cli.render import drain_progress_printer  # import time: rich, only for --wait's progress

    return drain_progress_printer()


def drain(
    cli: typer.Context,
    owner_id: OwnerIdArg,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 60.0,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Drain a worker: it stops claiming, finishes or hands back its work, releases its leases and exits.

    Example: rem drain executor-host-1234-ab12cd --wait
    """
    ctx = common.make_context(cli, data, None)
    show = _progress_printer() if wait and not json else None
    result = common.run(
        lambda: common.with_context(
            ctx, lambda c: ops.drain(c, owner_id, wait=wait, timeout_s=timeout, progress=show)
        )
    )
    output.show(result, json, lambda r: common.note(f"rem: {owner_id} is {r['state']}"))
