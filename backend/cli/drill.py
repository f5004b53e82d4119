"""`rem drill` and `rem bench`."""

from __future__ import annotations

import typer

from backend.cli import common
from backend.errors import NotImplementedYet

drill_app = typer.Typer(help="Chaos drills: kill real processes and prove nothing is lost.",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(drill_app, name="drill")
    app.command("bench")(bench)


@drill_app.command("sigkill")
def sigkill(data: common.DataOpt = None, json: common.JsonOpt = False) -> None:
    """SIGKILL daemons at random points under load, restart them, then `rem check`.

    Example: rem drill sigkill --role all --rounds 20 --json
    """
    raise NotImplementedYet("`rem drill sigkill` is not implemented yet")


def bench(json: common.JsonOpt = False) -> None:
    """Run the benchmarks and print them as a table.

    Example: rem bench --json
    """
    raise NotImplementedYet("`rem bench` is not implemented yet")
