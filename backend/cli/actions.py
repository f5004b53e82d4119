"""Operator action `rem replay` (drain and release live in `backend.cli.leases`)."""

from __future__ import annotations

import typer

from backend.cli import common
from backend.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Replay summary receipts into Chroma with no model call; `--dry-run` shows the diff.

    Example: rem replay --all --dry-run --json
    """
    raise NotImplementedYet("`rem replay` is not implemented yet")
