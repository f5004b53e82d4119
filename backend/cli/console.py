"""`rem console`: the live on-call console over a data dir (the CLI is where `tui` is imported)."""

from __future__ import annotations

from typing import Annotated

import typer

from backend.cli import common
from backend.core.datadir import DataDir
from backend.core.errors import DataDirError


def register(app: typer.Typer) -> None:
    app.command("console")(console)


def existing_data_dir(data: object) -> DataDir:
    """The data dir the console opens: it must already hold a rem state.db."""
    root = DataDir.resolve(data or common.Globals.data)  # type: ignore[arg-type]
    root.check_usable()
    if not root.exists():
        raise DataDirError(
            f"no rem data at {root.root} (state.db missing); "
            f"run `rem init --data {root.root}` or `rem up --data {root.root}`"
        )
    return root


def console(
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only", help="Watch only: every action is refused by the library and greyed out."
        ),
    ] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> None:
    """Open the live on-call console over a data dir (press ? inside for every key).

    Example: rem console --read-only --data ./demo-data
    """
    root = existing_data_dir(data)
    from tui.app import ConsoleApp

    ConsoleApp(root, read_only=read_only, chroma_url=chroma_url or common.Globals.chroma_url).run()
