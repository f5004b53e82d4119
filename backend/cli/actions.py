"""Operator actions: `rem replay`, `rem drain`, `rem release`."""

from __future__ import annotations

import typer

from backend.cli import common
from backend.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)
    app.command("drain")(drain)
    app.command("release")(release)


def replay(data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Replay summary receipts into Chroma with no model call; `--dry-run` shows the diff.

    Example: rem replay --all --dry-run --json
    """
    raise NotImplementedYet("`rem replay` is not implemented yet")


def drain(owner_id: str, data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Drain a worker: it stops claiming, finishes or hands back its work, and exits.

    Example: rem drain executor-host-1234-ab12cd --wait
    """
    raise NotImplementedYet("`rem drain` is not implemented yet")


def release(execution_id: str, data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Release a lease now (fenced on the epoch you saw) so another worker takes over.

    Example: rem release exe_01H... --expected-epoch 3
    """
    raise NotImplementedYet("`rem release` is not implemented yet")
