"""`rem console`: the live on-call console over a data dir (the CLI is where `tui` is imported)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from backend.cli import common
from backend.core.datadir import DataDir
from backend.core.errors import DataDirError


def register(app: typer.Typer) -> None:
    app.command("console")(console)


def existing_data_dir(data: Path | None, config: common.Config) -> DataDir:
    """The data dir the console opens: it must already hold a rem state.db (unless the state is on `--db`)."""
    root = DataDir.resolve(data or config.data)
    root.check_usable()
    if not root.exists() and not config.db_url:
        raise DataDirError(
            f"no rem data at {root.root} (state.db missing); "
            f"run `rem init --data {root.root}` or `rem up --data {root.root}`"
        )
    return root


def console(
    cli: typer.Context,
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only", help="Watch only: every action is refused by the library and greyed out."
        ),
    ] = False,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Open on the timeline at TIME (2026-11-30T03:12:00, 03:12, -15m): the panels as "
            "`rem up` recorded them; t goes live.",
            show_default=False,
        ),
    ] = None,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> None:
    """Open the live on-call console over a data dir (press ? inside for every key).

    Example: rem console --read-only --data ./demo-data
    Example: rem --db postgresql://rem@db-host/rem console   (the shared store on PostgreSQL)
    Example: rem console --at 03:12 --read-only --data ./copy-of-data   (the post-mortem timeline)
    """
    config = common.config_of(cli)
    root = existing_data_dir(data, config)
    when = None if at is None else recorded_time(root, at)
    from tui.app import ConsoleApp  # import time: textual, only for this command

    ConsoleApp(
        root, read_only=read_only, chroma_url=chroma_url or config.chroma_url, at=when, db_url=config.db_url
    ).run()


def recorded_time(root: DataDir, at: str) -> int:
    """`--at` as ms, refused in one line when the data dir has no status history to show."""
    # import time: the timeline and the history store, only for --at
    from backend.ops.timeline import parse_time
    from backend.store.history import HistoryStore

    when = parse_time(at)
    history = HistoryStore.open(root.root, read_only=True)
    try:
        bounds = history.bounds()
    finally:
        history.close()
    if not bounds["count"]:
        raise DataDirError(f"{history.path} holds no snapshot yet; `rem up` records one every few seconds")
    return when
