"""Shared pieces of the CLI: global options, context creation, output helpers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from backend.core import processes
from backend.core.datadir import DataDir
from backend.core.errors import BadInput
from backend.core.inert import visible
from backend.core.redact import has_password, redact_url
from backend.core.settings import Settings
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


class Globals:
    """Values of the global options given before the command name."""

    data: Path | None = None
    chroma_url: str | None = None


def use_db_url(url: str | None) -> None:
    """`--db URL`: the state store for this process and every rem process it starts (as REM_DB_URL,
    in their environment, which only their user can read), with the password hidden from this
    process's own command line from here on (REM_DB_URL or ~/.pgpass never show it at all)."""
    if url is None:
        return
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput(
            f"--db {redact_url(url)!r} is not a postgresql:// URL; without --db rem uses state.db in --data"
        )
    from backend.store.pg_errors import check_url

    check_url(url)  # a URL libpq cannot parse: one line now, not a traceback quoting it later
    os.environ[Settings.db_url.env] = url  # how every rem process this one starts gets it: never argv
    if has_password(url):  # `ps` shows argv to every user: this process's own shows `***` instead
        processes.hide_in_title(url, redact_url(url))


def pin_relative_paths() -> None:
    """Make a relative REM_MCP_CONFIG absolute in this process's environment: the daemons and tool
    servers rem starts run in other working directories (the data dir), where it would name nothing."""
    raw = os.environ.get(Settings.mcp_config.env, "").strip()
    if raw and not Path(raw).expanduser().is_absolute():
        os.environ[Settings.mcp_config.env] = str(Path(raw).expanduser().absolute())


def make_context(data: Path | None, chroma_url: str | None, **kwargs: Any) -> Context:
    """A Context from command-level options, falling back to the global ones."""
    path = data or Globals.data
    url = chroma_url or Globals.chroma_url
    return Context(DataDir.resolve(path), chroma_url=url, **kwargs)


def run(factory: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine to completion (the CLI is synchronous at its edge)."""
    return asyncio.run(factory())  # type: ignore[arg-type]


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
