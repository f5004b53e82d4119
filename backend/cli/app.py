"""The `rem` entry point: global options, command registration, error mapping."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer
from typer._click import exceptions as typer_click  # typer >= 0.24 parses with a vendored click

from backend.cli import common, lazy, params, rich_help
from backend.core import logfile, private
from backend.core.errors import ExitCode, RemError
from backend.core.inert import InertFormatter, visible
from backend.core.settings import Settings, settings, validate


def _real_click(name: str) -> tuple[type[BaseException], ...]:
    """The real click's exception `name` when something loaded click (plain click code raises
    those; rem itself never imports it: typer parses with a vendored click, and click costs time)."""
    click = sys.modules.get("click")
    return () if click is None else (getattr(click.exceptions, name),)


# `rem --help` ends with these; a blank line between them keeps each on a line of its own
EXAMPLES = """Examples:

  rem demo                              # try it: daemons, load, console

  rem --data ~/rem up                   # run the daemons (Ctrl-C drains)

  rem --data ~/rem send s1 "hello"      # admit an input into session s1

  rem --data ~/rem console --read-only  # watch without acting

  rem --data ~/rem check --settled      # verify the invariants

  rem --data ~/rem recall "payments"    # what memory holds

Every command: rem COMMAND --help. The docs: docs/index.md."""

# every command, in the order `rem --help` lists them (set up, run, operate, inspect, prove): the
# module in backend/cli that registers it, which only the invoked command imports, and the first
# paragraph of its help as `rem --help` lists it without importing any (tests/cli/test_lazy_commands.py
# keeps each equal to the command's own docstring)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("init", "Create the data dir and migrate the state store (state.db, or PostgreSQL with --db)."),
    "up": (
        "up",
        "Start the Chroma server and the daemons, restart any that die; Ctrl-C drains and stops them.",
    ),
    "daemon": (
        "daemon",
        "Run one daemon until drained (SIGTERM, Ctrl-C or `rem drain`); `--once` does one pass.",
    ),
    "send": ("send", "Admit an input into a session (idempotent on --id)."),
    "import": (
        "import_",
        "Import conversations: one JSON object per line with project, session, id, role, speaker, text, time.",
    ),
    "status": (
        "status",
        "Show the snapshot the console shows: backlog, leases, receipts, Dream drift, workers.",
    ),
    "metrics": (
        "metrics",
        "Serve Prometheus metrics (OpenMetrics) from the snapshot the console shows; read-only.",
    ),
    "show": (
        "show",
        "Show a session's transcript: messages, parts, usage, cost, model errors, recovery markers, tool calls.",
    ),
    "replay": (
        "replay",
        "Replay summary receipts into Chroma with no model call; `--dry-run` shows the diff.",
    ),
    "drain": (
        "drain",
        "Drain a worker: it stops claiming, finishes or hands back its work, releases its leases and exits.",
    ),
    "kill": (
        "kill",
        "SIGKILL a worker on this host (or `chroma`, the data dir's Chroma server), journaled: a drill.",
    ),
    "release": (
        "release",
        "Release a lease now (fenced on the epoch you saw) so another worker takes over at once.",
    ),
    "resume": (
        "resume",
        "Resume sessions held after a model error an operator had to fix (a bad key, an unknown model).",
    ),
    "approve": ("decisions", "Approve a tool call awaiting approval: it runs when its turn resumes."),
    "deny": ("decisions", "Deny a tool call awaiting approval: it never runs, and the model is told so."),
    "resolve": (
        "decisions",
        "Decide a tool call whose outcome is unknown (an effect in flight when its executor died).",
    ),
    "check": (
        "check",
        "Verify the invariants on the live data dir (docs/architecture.md); exit 1 on any violation.",
    ),
    "recall": (
        "recall",
        "Recall memory: hybrid dense + FTS5 over turns, session summaries and Dream's graph facts.",
    ),
    "reindex": (
        "reindex",
        "Rebuild the Chroma collections with the configured embedder (REM_EMBEDDER); no model call.",
    ),
    "mcp": (
        "mcp",
        "Serve rem's memory over MCP on stdio: recall, get_session, graph_neighbors, list_projects.",
    ),
    "tools": (
        "tools",
        "List every configured tool: server, effect class and its source, permission, timeout, server health.",
    ),
    "serve": (
        "serve",
        "Serve the HTTP API, its event streams and MCP over Streamable HTTP until drained (SIGTERM, Ctrl-C).",
    ),
    "token": ("token", "The application API's bearer tokens: create (shown once), list, revoke."),
    "console": ("console", "Open the live on-call console over a data dir (press ? inside for every key)."),
    "demo": (
        "demo",
        "A fresh demo data dir, `rem up --load` (Chroma, daemons, synthetic load) and the console.",
    ),
    "bench": ("bench", "Run the benchmarks of benchmarks/ and print their headline figures as a table."),
    "drill": ("drill", "Chaos drills: kill real processes and prove nothing is lost."),
}

app = typer.Typer(
    name="rem",
    cls=lazy.lazy_group(COMMANDS),
    help="rem: a durable runtime for agent sessions and their memory, and its on-call console.",
    epilog=EXAMPLES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _globals(
    cli: typer.Context,
    data: common.DataOpt = None,
    chroma_url: common.ChromaOpt = None,
    db: common.DbOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log to stderr.")] = False,
) -> None:
    if cli.invoked_subcommand == "drill":
        # a drill is a test: its system may run the unsafe switches (to prove the drill can fail)
        os.environ[Settings.test_mode.env] = "1"
    if db is not None:
        common.check_db_url(db)
    # a bad REM_* value fails here, in one line, before the command does anything (--db stands
    # in for REM_DB_URL: given, it is the one that counts)
    validate(os.environ if db is None else {**os.environ, Settings.db_url.env: db})
    config = common.Config(data=data, chroma_url=chroma_url, db_url=settings.db_url if db is None else db)
    cli.ensure_object(common.Invocation).config = config
    common.pin_relative_paths()
    level = logging.INFO if verbose or settings.log else logging.WARNING
    # a terminal, or a daemon's log file (capped: backend.core.logfile): inert lines either way
    handler = logfile.stderr_handler(settings.log_file, settings.log_max_bytes)
    handler.setFormatter(InertFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


params.install()  # plain option values without pydantic's import (backend/cli/params.py)
rich_help.install()  # typer's help panels without rich.markdown's import (backend/cli/rich_help.py)


def serve_default(args: list[str]) -> list[str]:
    """`rem up --serve` with no address means the default one (typer has no option with an optional
    value): the default is put in after a bare `--serve` of the `up` command."""
    if "up" not in args or "--serve" not in args:
        return args
    from backend.api.listen import DEFAULT_LISTEN  # import time: only for `rem up --serve`

    out = list(args)
    for i in range(out.index("up") + 1, len(out)):
        if out[i] == "--":
            break
        if out[i] == "--serve" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out.insert(i + 1, DEFAULT_LISTEN)
            break
    return out


def main(argv: list[str] | None = None) -> int:
    """Run `rem`; user errors print one line on stderr and map to an exit code."""
    private.apply_private_umask()  # everything this rem (and what it starts) creates is private
    invocation = common.Invocation()
    args = serve_default(sys.argv[1:] if argv is None else argv)
    try:
        result = app(args=args, standalone_mode=False, obj=invocation)
    except RemError as exc:
        sys.stderr.write(f"rem: error: {visible(exc)}\n")  # one line, whatever the data put in it
        code = int(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rem: interrupted\n")
        code = int(ExitCode.INTERRUPTED)
    except Exception as exc:
        code = _exit_code(exc, invocation.config.db_url if invocation.config else None)
    else:
        code = int(result) if isinstance(result, int) else 0
    if argv is None:
        sys.exit(code)
    return code


def _exit_code(exc: Exception, db_url: str | None) -> int:
    """A click outcome (usage error, abort, exit) or an escaped database error, as its exit code."""
    if isinstance(exc, (typer_click.UsageError, *_real_click("UsageError"))):
        exc.show()  # type: ignore[attr-defined]
        return int(ExitCode.USAGE)
    if isinstance(exc, (typer.Abort, *_real_click("Abort"))):
        sys.stderr.write("rem: interrupted\n")
        return int(ExitCode.INTERRUPTED)
    if isinstance(exc, (typer.Exit, *_real_click("Exit"))):
        return int(exc.exit_code)  # type: ignore[attr-defined]
    if isinstance(exc, (typer_click.ClickException, *_real_click("ClickException"))):
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    translated = _database_error(exc, db_url)
    if translated is None:
        raise exc
    sys.stderr.write(f"rem: error: {translated}\n")
    return int(translated.exit_code)


def _database_error(exc: Exception, db_url: str | None = None) -> RemError | None:
    """A PostgreSQL error that escaped every `postgres_errors` door, as its one line (no password)."""
    if type(exc).__module__.partition(".")[0] != "psycopg":
        return None
    # import time: psycopg, loaded only when one of its errors got this far
    import psycopg

    from backend.store.pg_errors import translate_postgres_error

    if not isinstance(exc, psycopg.Error):
        return None
    return translate_postgres_error(exc, db_url or settings.db_url or "postgresql://")


if __name__ == "__main__":
    main()
