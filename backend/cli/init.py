"""`rem init`: create the data dir and migrate the state store."""

from __future__ import annotations

import typer

from backend import ops
from backend.cli import common


def register(app: typer.Typer) -> None:
    app.command("init")(init)


def init(cli: typer.Context, data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """Create the data dir and migrate the state store (state.db, or PostgreSQL with --db).

    Example: rem init --data ./demo
    Example: rem --db postgresql://rem@db-host/rem init
    """
    ctx = common.make_context(cli, data, None)
    result = common.run(lambda: common.with_context(ctx, ops.init))
    if json:
        common.emit_json(result)
    else:
        verb = "created" if result["created"] else "up to date"
        where = result["state_db"]
        if result["store"] == "postgresql":
            where = f"PostgreSQL store {where} (data dir {result['data_dir']})"
        common.note(f"rem: {where} {verb} (schema v{result['schema_version']})")
