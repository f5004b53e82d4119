"""`rem import`: import conversations from a JSON Lines file."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from backend import ops
from backend.cli import common
from backend.core.errors import ExitCode

if TYPE_CHECKING:
    from backend.execution.importer import Progress
    from backend.runtime.context import Context


def register(app: typer.Typer) -> None:
    app.command("import")(import_)


def import_(
    cli: typer.Context,
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="JSON Lines, one message per line.", show_default=False)
    ],
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """Import conversations: one JSON object per line with project, session, id, role, speaker, text, time.

    All or nothing per session: a bad line is reported with its number and its
    whole session is left out; each session is written whole in one
    transaction. Idempotent on ids. Exits 1 when any line was bad (the good
    sessions are imported). Ctrl-C stops after the transaction in flight and
    says which sessions were written and which were not (exit 130); a second
    Ctrl-C quits at once. Running the same import again finishes it. A
    progress bar goes to stderr.

    Example: rem import chats.jsonl --json
    """
    # import time: the importer and rich (its progress bar), not for --help
    from backend.cli.render import byte_progress
    from backend.execution.importer import ImportFailed

    ctx = common.make_context(cli, data, None)
    stop = threading.Event()
    try:
        with byte_progress(f"importing {file.name}") as progress:
            result = common.run(lambda: common.with_context(ctx, lambda c: _run(c, file, progress, stop)))
    except ImportFailed as exc:
        _report(exc.report, json)
        raise
    _report(result, json)
    if result["interrupted"]:
        return int(ExitCode.INTERRUPTED)
    return 0 if result["ok"] else 1


async def _run(ctx: Context, file: Path, progress: Progress, stop: threading.Event) -> dict[str, Any]:
    """The import, with SIGINT asking it to stop between two transactions (a second one: at once)."""
    import asyncio  # import time: not for `--help` (common.run loaded it already)

    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        if stop.is_set():
            loop.remove_signal_handler(signal.SIGINT)
            raise KeyboardInterrupt
        stop.set()
        common.note("rem: interrupted: stopping after the transaction in flight (Ctrl-C again: at once)")

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        return await ops.import_file(ctx, file, progress=progress, stop=stop.is_set)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _report(result: dict[str, Any], json: bool) -> None:
    if json:
        common.emit_json(result)
    else:
        from backend.cli.render import print_import  # import time: rich, only for the human view

        print_import(result)
    if result["interrupted"] and result["stopped_while"] == "validating":
        common.note(f"rem: interrupted while validating line {result['lines'] + 1}: nothing was written")
    elif result["interrupted"]:
        common.note(
            f"rem: interrupted: {result['sessions_written']} session(s) written whole, "
            f"{result['sessions_not_written']} not written; run the same import again to finish"
        )
