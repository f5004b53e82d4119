"""`rem release`: expire a lease now, fenced on the epoch the operator saw."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common, output

if TYPE_CHECKING:
    from backend.ops.results import LeaseReleased


def register(app: typer.Typer) -> None:
    app.command("release")(release)


LeaseIdArg = Annotated[
    str,
    typer.Argument(
        metavar="EXECUTION_ID", help="An execution id, or a session id for its summary-job or Dream lease."
    ),
]
KindOpt = Annotated[
    str | None, typer.Option(help="execution, summary_job or dream (default: whichever the id names).")
]
EpochOpt = Annotated[
    int | None, typer.Option(help="The epoch you saw; refused if the lease moved since (unless --force).")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Release even if renewed since.")]


def release(
    cli: typer.Context,
    lease_id: LeaseIdArg,
    kind: KindOpt = None,
    expected_epoch: EpochOpt = None,
    force: ForceOpt = False,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Release a lease now (fenced on the epoch you saw) so another worker takes over at once.

    Example: rem release exe_01J9Z3 --expected-epoch 3
    """
    ctx = common.make_context(cli, data, None, existing=True)
    result = common.run(
        lambda: common.with_context(
            ctx, lambda c: ops.release(c, lease_id, kind=kind, expected_epoch=expected_epoch, force=force)
        )
    )
    output.show(result, json, _note_released)


def _note_released(result: LeaseReleased) -> None:
    common.note(
        f"rem: released {result['kind']} lease {result['id']} of {result['owner_id']} "
        f"(epoch {result['old_epoch']} -> {result['new_epoch']})"
    )
