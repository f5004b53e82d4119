"""`rem import`: import conversations from a JSON Lines file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from backend import ops
from backend.cli import common
from backend.cli.render import byte_progress, print_import


def register(app: typer.Typer) -> None:
    app.command("import")(import_)


def import_(
    file: Annotated[Path, typer.Argument(help="JSON Lines, one message per line.", show_default=False)],
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """Import conversations: one JSON object per line with project, session, id, role, speaker, text, time.

    Idempotent on ids; a bad line is reported with its number and its whole
    session is left out. Exits 1 when any line was bad (the good sessions
    are imported). A progress bar goes to stderr.

    Example: rem import chats.jsonl --json
    """
    ctx = common.make_context(data, None)
    with byte_progress(f"importing {file.name}") as progress:
        result = common.run(
            lambda: common.with_context(ctx, lambda c: ops.import_file(c, file, progress=progress))
        )
    if json:
        common.emit_json(result)
    else:
        print_import(result)
    return 0 if result["ok"] else 1
