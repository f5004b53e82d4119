"""`rem daemon`: run one executor, summarizer or Dream daemon."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from backend.cli import common
from backend.store.states import WorkerRole

if TYPE_CHECKING:  # the daemons import Chroma: only `rem daemon` pays for it
    from backend.runtime.daemon import Daemon


def register(app: typer.Typer) -> None:
    app.command("daemon")(daemon)


def daemon(
    cli: typer.Context,
    role: Annotated[WorkerRole, typer.Option("--role", help="Which daemon to run.")],
    once: Annotated[bool, typer.Option("--once", help="Do one full pass and exit.")] = False,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
) -> int:
    """Run one daemon until drained (SIGTERM, Ctrl-C or `rem drain`); `--once` does one pass.

    Example: rem daemon --role executor --once
    """
    cls = daemon_class(role)
    ctx = common.make_context(cli, data, chroma_url)
    return common.run(lambda: common.with_context(ctx, lambda c: cls(c, once=once).run()))


def daemon_class(role: WorkerRole) -> type[Daemon]:
    """The `Daemon` subclass for a role, imported only now: `rem send` never pays for Chroma's import."""
    if role is WorkerRole.SERVER:
        from backend.core.errors import BadInput  # import time: only for the refusal

        raise BadInput("the API server is not a daemon role: run it with `rem serve`")
    if role is WorkerRole.EXECUTOR:
        # import time: the executor (and Chroma, the agent), only for its role
        from backend.execution.executor import Executor

        return Executor
    if role is WorkerRole.SUMMARIZER:
        # import time: the summarizer (and Chroma, the synthesizer), only for its role
        from backend.summaries.summarizer import Summarizer

        return Summarizer
    # import time: Dream (and Chroma), only for its role
    from backend.dream.digester import Dreamer

    return Dreamer
