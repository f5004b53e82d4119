"""`rem check`: verify the invariants on a live data dir."""

from __future__ import annotations

from typing import Annotated

import typer

from backend import ops
from backend.cli import common, output
from backend.core.errors import ExitCode


def register(app: typer.Typer) -> None:
    app.command("check")(check)


SettledOpt = Annotated[
    bool, typer.Option("--settled", help="Also fail on work still in flight (use once load has stopped).")
]


def check(
    cli: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    settled: SettledOpt = False,
    json: common.JsonOpt = False,
) -> int:
    """Verify the invariants on the live data dir (docs/architecture.md); exit 1 on any violation.

    Exit 3 when there is none but Chroma could not be reached, so its part (receipts, Dream's
    keys, turn vectors) was not checked: start it (`rem up`) and check again.

    Example: rem check --settled --json
    """
    # import time: rich and the records, not for --help
    from backend.cli.render_check import check_progress_bar, print_check

    ctx = common.make_context(cli, data, chroma_url, read_only=True)
    with check_progress_bar() as progress:  # on stderr, and only on a terminal
        result = common.run(
            lambda: common.with_context(ctx, lambda c: ops.check(c, settled=settled, progress=progress))
        )
    output.show(result, json, print_check)
    if result["violations"]:
        return int(ExitCode.FAILED)
    return int(ExitCode.UNREACHABLE if result["not_checked"] else ExitCode.OK)
