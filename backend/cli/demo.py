"""`rem demo`: a fresh data dir, `rem up --load`, and the console over it."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from backend.cli import common
from backend.core.datadir import DataDir


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def open_console(data: DataDir, db_url: str | None = None) -> None:
    """Run the console until the operator quits; SIGTERM quits it too."""
    # import time: the demo program and textual, only for this command
    from backend.programs import demo as demo_run
    from tui.app import ConsoleApp

    app = ConsoleApp(data, db_url=db_url)
    previous = demo_run.set_signal_handlers(lambda *_: app.call_later(app.exit))
    try:
        app.run()
    finally:
        demo_run.restore_signal_handlers(previous)


def demo(
    cli: typer.Context,
    data: common.DemoDataOpt = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo data dir on exit.")] = False,
    model_url: Annotated[
        str | None,
        typer.Option("--model-url", help="An OpenAI-compatible endpoint to answer with (its .../v1 URL)."),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="The chat model to ask there.")] = None,
    embedding_model: Annotated[
        str | None, typer.Option("--embedding-model", help="Also embed summaries with this model there.")
    ] = None,
) -> int:
    """A fresh demo data dir, `rem up --load` (Chroma, daemons, synthetic load) and the console.

    With --model-url and --model, the agent and the synthesizer are a real model
    (REM_AGENT=openai, REM_SYNTHESIZER=openai); without them, nothing changes (offline).

    Example: rem demo --model-url http://127.0.0.1:11434/v1 --model llama3.2
    """
    from backend.programs import demo as demo_run  # import time: only for this command

    config = common.config_of(cli)
    env = demo_run.model_env(model_url, model, embedding_model)
    return demo_run.run_demo(
        data or config.data,
        keep=keep,
        console=functools.partial(open_console, db_url=config.db_url),
        model=env,
        db_url=config.db_url,
    )
