"""`rem daemon`: run one executor, summarizer or Dream daemon."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

from backend.cli import common

if TYPE_CHECKING:  # the daemons import Chroma: only `rem daemon` pays for it
    from backend.runtime.daemon import Daemon


def register(app: typer.Typer) -> None:
    app.command("daemon")(daemon)


class Role(str, Enum):
    executor = "executor"
    summarizer = "summarizer"
    dream = "dream"


def daemon(
    role: Annotated[Role, typer.Option("--role", help="Which daemon to run.")],
    once: Annotated[bool, typer.Option("--once", help="Do one full pass and exit.")] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> int:
    """Run one daemon until drained (SIGTERM, Ctrl-C or `rem drain`); `--once` does one pass.

    Example: rem daemon --role executor --once
    """
    cls = daemon_class(role)
    ctx = common.make_context(data, chroma_url)
    return common.run(lambda: common.with_context(ctx, lambda c: cls(c, once=once).run()))


def daemon_class(role: Role) -> type[Daemon]:
    """The `Daemon` subclass for a role, imported only now: `rem send` never pays for Chroma's import."""
    if role is Role.executor:
        from backend.execution.executor import Executor

        return Executor
    if role is Role.summarizer:
        from backend.summaries.summarizer import Summarizer

        return Summarizer
    from backend.dream.digester import Dreamer

    return Dreamer
