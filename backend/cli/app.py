"""The `rem` entry point: global options, command registration, error mapping."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import click
import typer
from typer._click import exceptions as typer_click  # typer >= 0.24 parses with a vendored click

from backend.cli import (
    bench,
    check,
    common,
    console,
    daemon,
    demo,
    drain,
    drill,
    import_,
    init,
    mcp,
    metrics,
    recall,
    reindex,
    release,
    replay,
    resume,
    send,
    show,
    status,
    tools,
    up,
)
from backend.core import private
from backend.core.errors import ExitCode, RemError
from backend.core.inert import visible
from backend.core.settings import Settings, settings, validate

# Both clicks: typer raises its vendored click's exceptions, plain click code the real ones.
USAGE_ERRORS = (click.exceptions.UsageError, typer_click.UsageError)
CLICK_ERRORS = (click.exceptions.ClickException, typer_click.ClickException)
ABORTS = (click.exceptions.Abort, typer.Abort)
EXITS = (click.exceptions.Exit, typer.Exit)

# `rem --help` ends with these; a blank line between them keeps each on a line of its own
EXAMPLES = """Examples:

  rem demo                              # try it: daemons, load, console

  rem --data ~/rem up                   # run the daemons (Ctrl-C drains)

  rem --data ~/rem send s1 "hello"      # admit an input into session s1

  rem --data ~/rem console --read-only  # watch without acting

  rem --data ~/rem check --settled      # verify the invariants

  rem --data ~/rem recall "payments"    # what memory holds

Every command: rem COMMAND --help. The docs: docs/index.md."""

app = typer.Typer(
    name="rem",
    help="rem: a durable runtime for agent sessions and their memory, and its on-call console.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _globals(
    ctx: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    db: common.DbOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log to stderr.")] = False,
) -> None:
    if ctx.invoked_subcommand == "drill":
        # a drill is a test: its system may run the unsafe switches (to prove the drill can fail)
        os.environ[Settings.test_mode.env] = "1"
    common.use_db_url(db)
    validate()  # a bad REM_* value fails here, in one line, before the command does anything
    common.pin_relative_paths()
    common.Globals.data = data
    common.Globals.chroma_url = chroma_url
    level = logging.INFO if verbose or settings.log else logging.WARNING
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


# in the order `rem --help` lists them: set up, run, operate, inspect, prove
for command in (
    init,
    up,
    daemon,
    send,
    import_,
    status,
    metrics,
    show,
    replay,
    drain,
    release,
    resume,
    check,
    recall,
    reindex,
    mcp,
    tools,
    console,
    demo,
    drill,
    bench,
):
    command.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run `rem`; user errors print one line on stderr and map to an exit code."""
    private.apply_private_umask()  # everything this rem (and what it starts) creates is private
    try:
        result = app(args=argv, standalone_mode=False)
    except RemError as exc:
        sys.stderr.write(f"rem: error: {visible(exc)}\n")  # one line, whatever the data put in it
        code = int(exc.exit_code)
    except USAGE_ERRORS as exc:
        exc.show()
        code = int(ExitCode.USAGE)
    except ABORTS:
        sys.stderr.write("rem: interrupted\n")
        code = int(ExitCode.INTERRUPTED)
    except EXITS as exc:
        code = int(exc.exit_code)
    except CLICK_ERRORS as exc:
        exc.show()
        code = int(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rem: interrupted\n")
        code = int(ExitCode.INTERRUPTED)
    except Exception as exc:
        translated = _database_error(exc)
        if translated is None:
            raise
        sys.stderr.write(f"rem: error: {translated}\n")
        code = int(translated.exit_code)
    else:
        code = int(result) if isinstance(result, int) else 0
    if argv is None:
        sys.exit(code)
    return code


def _database_error(exc: Exception) -> RemError | None:
    """A PostgreSQL error that escaped every `postgres_errors` door, as its one line (no password)."""
    if type(exc).__module__.partition(".")[0] != "psycopg":
        return None
    import psycopg

    from backend.store.pg_errors import translate_postgres_error

    if not isinstance(exc, psycopg.Error):
        return None
    return translate_postgres_error(exc, settings.db_url or "postgresql://")


if __name__ == "__main__":
    main()
