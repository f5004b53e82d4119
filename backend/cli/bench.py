"""`rem bench`: run benchmarks/ and print their headline figures."""

from __future__ import annotations

from typing import Annotated

import typer

from backend.cli import common, output


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


BenchNamesArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="NAME",
        help="Benchmarks to run (turns, streaming, receipts, dream, status, console, console-load, "
        "scale, console-scale, check-cold, idle); default all.",
    ),
]
QuickOpt = Annotated[bool, typer.Option("--quick", help="Smaller sizes, for a fast look.")]


def bench(
    only: BenchNamesArg = None,
    quick: QuickOpt = False,
    json: common.JsonOpt = False,
) -> None:
    """Run the benchmarks of benchmarks/ and print their headline figures as a table.

    Example: rem bench --quick turns status
    """
    # import time: the benchmark runner and rich, only for this command
    from backend.cli.render import print_bench
    from backend.programs import bench as benches

    report = benches.run(only, quick, progress=common.note)
    output.show(report, json, print_bench)
