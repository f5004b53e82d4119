"""`rem replay`: put summary receipts back on their Chroma rows, with no model call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common, output

if TYPE_CHECKING:
    from backend.ops.records import ReplayReport


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


SummaryIdsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="SUMMARY_ID", help="Receipts to replay, e.g. summary_s1.", show_default=False),
]
AllOpt = Annotated[bool, typer.Option("--all", help="Every receipt whose Chroma row does not match.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show which owned keys differ; write nothing.")]


def replay(
    cli: typer.Context,
    summary_ids: SummaryIdsArg = None,
    all_: AllOpt = False,
    dry_run: DryRunOpt = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """Replay summary receipts into Chroma with no model call; `--dry-run` shows the diff.

    Exits 1 when a receipt could not be verified or was quarantined.

    Example: rem replay --all --dry-run --json
    """
    ctx = common.make_context(cli, data, chroma_url, read_only=dry_run)
    result = common.run(
        lambda: common.with_context(
            ctx, lambda c: ops.replay(c, summary_ids, all_mismatched=all_, dry_run=dry_run)
        )
    )
    output.show(result, json, _print_replay)
    return 0 if result["ok"] else 1


def _print_replay(result: ReplayReport) -> None:
    from backend.cli.render import print_replay  # import time: rich, only for the human view

    print_replay(result)
