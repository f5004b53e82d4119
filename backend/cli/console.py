"""`rem console` and `rem demo`."""

from __future__ import annotations

import typer

from backend.cli import common
from backend.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    app.command("console")(console)
    app.command("demo")(demo)


def console(data: common.DataOpt = None) -> None:
    """Open the on-call console over a data dir.

    Example: rem console --read-only
    """
    raise NotImplementedYet("`rem console` is not implemented yet")


def demo() -> None:
    """A fresh demo data dir, `rem up`, synthetic load, and the console.

    Example: rem demo
    """
    raise NotImplementedYet("`rem demo` is not implemented yet")
