"""`rem resume`: lift the hold a model error put on sessions, once its cause is fixed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common, output

if TYPE_CHECKING:
    from backend.ops.results import ResumeReport


def register(app: typer.Typer) -> None:
    app.command("resume")(resume)


SessionsArg = Annotated[
    list[str] | None, typer.Argument(metavar="SESSION", help="Held sessions to resume.", show_default=False)
]
AllOpt = Annotated[bool, typer.Option("--all", help="Every held session.")]
ReaskOpt = Annotated[
    bool, typer.Option("--reask/--no-reask", help="Ask the prompt that got the error reply again (default).")
]


def resume(
    cli: typer.Context,
    session_ids: SessionsArg = None,
    all_: AllOpt = False,
    reask: ReaskOpt = True,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Resume sessions held after a model error an operator had to fix (a bad key, an unknown model).

    Their waiting inputs run again, and the prompt that got the error reply is asked again
    as a new input (`--no-reask` to skip that). `rem status` lists the held sessions.

    Example: rem resume --all
    """
    ctx = common.make_context(cli, data, None)
    result = common.run(
        lambda: common.with_context(ctx, lambda c: ops.resume(c, session_ids, all_held=all_, reask=reask))
    )
    output.show(result, json, _note_resumed)


def _note_resumed(result: ResumeReport) -> None:
    """One line a resumed session (or that none was held)."""
    if not result["resumed"]:
        common.note("rem: no session is held; nothing to resume")
    for item in result["resumed"]:
        again = f", asked again as {', '.join(item['reasked'])}" if item["reasked"] else ""
        common.note(
            f"rem: resumed {item['session_id']} (held for {item['held_reason']}); "
            f"{item['inputs_woken']} waiting input(s) woken{again}"
        )
