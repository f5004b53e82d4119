"""`rem init`: create the data dir and migrate state.db."""

from __future__ import annotations

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("init")(init)


def init(data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Create the data dir and migrate state.db.

    Example: rem init --data ./demo
    """
    ctx = common.make_context(data, None)
    result = common.run(lambda: common.with_context(ctx, ops.init))
    if json:
        common.emit_json(result)
    else:
        verb = "created" if result["created"] else "up to date"
        common.note(f"rem: {result['state_db']} {verb} (schema v{result['schema_version']})")
