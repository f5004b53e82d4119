"""`rem init`, `rem status`, `rem check`."""

from __future__ import annotations

from typing import Annotated

import typer

from backend import ops
from backend.cli import common
from backend.cli.render import print_check, print_status


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("status")(status)
    app.command("check")(check)


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


def status(data: common.DataOpt = None, chroma_url: common.ChromaOpt = None,
           json: common.JsonOpt = False) -> None:
    """Show the snapshot the console shows: backlog, leases, receipts, Dream drift, workers.

    Example: rem status --json --data ./demo
    """
    ctx = common.make_context(data, chroma_url, read_only=True)
    result = common.run(lambda: common.with_context(ctx, ops.status))
    if json:
        common.emit_json(result)
    else:
        print_status(result)


def check(
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    settled: Annotated[bool, typer.Option(
        "--settled", help="Also fail on work still in flight (use once load has stopped).")] = False,
    json: common.JsonOpt = False,
) -> int:
    """Verify the invariants of DESIGN section 5 on the live data dir; exit 1 on any violation.

    Example: rem check --settled --json
    """
    ctx = common.make_context(data, chroma_url, read_only=True)
    result = common.run(lambda: common.with_context(ctx, lambda c: ops.check(c, settled=settled)))
    if json:
        common.emit_json(result)
    else:
        print_check(result)
    return 0 if result["ok"] else 1
