"""`rem daemon`: run one executor, summarizer or Dream daemon."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from backend.cli import common


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
    from backend.runtime.daemon import daemon_class

    cls = daemon_class(role.value)
    ctx = common.make_context(data, chroma_url)
    return common.run(lambda: common.with_context(ctx, lambda c: cls(c, once=once).run()))
