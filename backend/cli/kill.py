"""`rem kill`: SIGKILL a worker of this host, or the data dir's Chroma server, journaled (drills)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from backend import ops
from backend.cli import common, output

if TYPE_CHECKING:
    from backend.ops.results import KillReport


def register(app: typer.Typer) -> None:
    app.command("kill")(kill)


TargetArg = Annotated[
    str,
    typer.Argument(
        metavar="OWNER_ID",
        help="The worker's owner id (see `rem status`), or `chroma` for the data dir's server.",
    ),
]


def kill(
    cli: typer.Context, target: TargetArg, data: common.DataOpt = None, json: common.JsonOpt = False
) -> None:
    """SIGKILL a worker on this host (or `chroma`, the data dir's Chroma server), journaled: a drill.

    It dies as in a crash: its leases expire (or `rem release` them) and another worker takes
    over; an effect it had running becomes an unknown outcome. Refused for another host's worker,
    a worker already dead, or a pid that is no longer that worker's.

    Example: rem kill executor-host-1234-ab12cd
    """
    ctx = common.make_context(cli, data, None, existing=True, start_chroma=False)
    report = common.run(lambda: common.with_context(ctx, lambda c: ops.kill(c, target)))
    output.show(report, json, _note)


def _note(report: KillReport) -> None:
    held = f"{len(report['leases'])} lease(s), {len(report['running_calls'])} tool call(s) running"
    dead = "dead now" if report["exited"] else "not seen to exit yet"
    common.note(
        f"rem: {report['signal']} to {report['target']} ({report['role']}, pid {report['pid']} on "
        f"{report['host']}): {dead}; it held {held}"
    )
