"""Shared pieces of the CLI: the global options and the configuration they make, contexts, output.

The global options are read once, by the app's callback, into a `Config` that
every command builds its library `Context` from, explicitly: nothing reaches
this process's library through its environment. Children get the state store
in theirs (`Context.store_env`), never in argv.

Light to import on purpose: `rem --help` imports every command module, and each
imports this one; the library and asyncio load when a command runs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from backend.core.datadir import DataDir
from backend.core.errors import BadInput
from backend.core.inert import visible
from backend.core.redact import has_password, redact_url
from backend.core.settings import Settings, settings

if TYPE_CHECKING:
    import asyncio

    from backend.runtime.context import Context

T = TypeVar("T")


def _data_path(value: str) -> Path:
    """`--data` as a path; an empty value (an unset shell variable) is refused, not read as `.`."""
    if not value.strip():
        raise BadInput("--data is empty: pass the data dir's path (is a shell variable unset?)")
    return Path(value)


DataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Data dir (default: $REM_DATA, else the user data dir).",
        show_default=False,
        parser=_data_path,
    ),
]
ChromaOpt = Annotated[
    str | None,
    typer.Option(
        "--chroma-url",
        help="Use this Chroma server instead of the data dir's own (default: $REM_CHROMA_URL).",
        show_default=False,
    ),
]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="The state store: a postgresql:// URL (default: $REM_DB_URL, else state.db in the data dir).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="Go through this `rem serve` (its URL) instead of the local store, with the token in the "
        "file REM_TOKEN_FILE names (default: $REM_SERVER).",
        show_default=False,
    ),
]
# `rem demo` and `rem drill sigkill` start (and kill) a whole system: never on $REM_DATA by default
DemoDataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="A new or empty dir for the demo (default: a fresh private temp dir, /tmp/rem-demo-...; "
        "$REM_DATA is not used).",
        show_default=False,
        parser=_data_path,
    ),
]
DrillDataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="The drill's data dir (default: a private temp dir, /tmp/rem-drill-..., removed when "
        "the drill passes; $REM_DATA and the global --data are not used).",
        show_default=False,
        parser=_data_path,
    ),
]


@dataclass(frozen=True)
class Config:
    """The global options of one `rem` run, read once: what every command's `Context` is built from."""

    data: Path | None = None
    chroma_url: str | None = None
    # the state store: `--db`, else $REM_DB_URL; None: state.db in the data dir
    db_url: str | None = None

    @classmethod
    def from_environment(cls) -> Config:
        """No global option given: the defaults, with $REM_DB_URL."""
        return cls(db_url=settings.db_url)


@dataclass
class Invocation:
    """One run of the `rem` app (click's context object): the `Config` its callback read (None
    until then: nothing is read from the environment before the callback has validated it)."""

    config: Config | None = None


def config_of(cli: typer.Context) -> Config:
    """The `Config` of the run `cli` belongs to."""
    invocation = cli.find_object(Invocation)
    if invocation is None or invocation.config is None:
        return Config.from_environment()
    return invocation.config


def check_db_url(url: str) -> str:
    """`--db URL` (returned): refused in one line unless PostgreSQL can parse it; its password is hidden
    from this process's own command line from here on (REM_DB_URL or ~/.pgpass never show it at all)."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput(
            f"--db {redact_url(url)!r} is not a postgresql:// URL; without --db rem uses state.db in --data"
        )
    from backend.store.pg_errors import check_url  # import time: psycopg, only when --db is given

    check_url(url)  # a URL libpq cannot parse: one line now, not a traceback quoting it later
    if has_password(url):  # `ps` shows argv to every user: this process's own shows `***` instead
        from backend.core import processes  # import time: psutil, only for a URL with a password

        processes.hide_in_title(url, redact_url(url))
    return url


def pin_relative_paths() -> None:
    """Make a relative REM_MCP_CONFIG absolute in this process's environment: the daemons and tool
    servers rem starts run in other working directories (the data dir), where it would name nothing."""
    raw = os.environ.get(Settings.mcp_config.env, "").strip()
    if raw and not Path(raw).expanduser().is_absolute():
        os.environ[Settings.mcp_config.env] = str(Path(raw).expanduser().absolute())


def server_of(cli: typer.Context, server: str | None, **local: object) -> str | None:
    """The server a command goes through (`--server`, else $REM_SERVER), or None for the local store;
    `local`: the command's options that name a local store or Chroma (`data`, `chroma_url`), refused
    beside a server (the data is the server's)."""
    if server is not None and not server.strip():
        raise BadInput("--server is empty: give the URL `rem serve` printed (is a shell variable unset?)")
    url = server if server is not None else settings.server
    if url is None:
        return None
    given = [f"--{name.replace('_', '-')}" for name, value in local.items() if value is not None]
    if config_of(cli).data is not None:
        given.append("--data")
    if given:
        where = "--server" if server is not None else "REM_SERVER"
        raise BadInput(
            f"{given[0]} names a local store and {where} a server: give one (unset REM_SERVER for a "
            "command on the local store)"
        )
    return url


def make_context(cli: typer.Context, data: Path | None, chroma_url: str | None, **kwargs: Any) -> Context:
    """The library's `Context` for a command: its own options first, then the run's `Config`."""
    from backend.runtime.context import Context  # import time: the library loads when a command runs

    config = config_of(cli)
    kwargs.setdefault("db_url", config.db_url)
    return Context(DataDir.resolve(data or config.data), chroma_url=chroma_url or config.chroma_url, **kwargs)


def run(
    factory: Callable[[], Awaitable[T]], loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
) -> T:
    """Run one coroutine to completion (the CLI is synchronous at its edge), on a new loop of
    `loop_factory`'s (default: asyncio's own)."""
    import asyncio  # import time: not for `--help`

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(factory())  # type: ignore[arg-type]


async def with_context(ctx: Context, fn: Callable[[Context], Awaitable[T]]) -> T:
    try:
        return await fn(ctx)
    finally:
        await ctx.close()


def emit_json(value: Any) -> None:
    """The one JSON document a `--json` command prints on stdout."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def note(message: str) -> None:
    """Human notes and progress go to stderr, never stdout (control characters shown as escapes)."""
    sys.stderr.write(visible(message, multiline=True) + "\n")
