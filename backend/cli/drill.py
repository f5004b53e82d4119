"""`rem drill sigkill`: kill real processes under load and prove nothing is lost."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from backend.cli import common
from backend.core.datadir import DataDir

drill_app = typer.Typer(
    help="Chaos drills: kill real processes and prove nothing is lost.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(drill_app, name="drill")


# the drill's options (each with its --help text)
RoleOpt = Annotated[str, typer.Option(help="executor, summarizer, dream, chroma, zombie or all.")]
RoundsOpt = Annotated[int, typer.Option(min=1, help="How many processes to kill.")]
SeedOpt = Annotated[int, typer.Option(help="Seed for victims and kill moments.")]
ReleaseOpt = Annotated[
    bool,
    typer.Option("--release", help="Release the dead process's leases via `rem release` instead of waiting."),
]
LeaseOpt = Annotated[int, typer.Option(min=500, help="Lease length of the drill's system.")]
SettleOpt = Annotated[
    float, typer.Option(min=5, help="Seconds to wait for the system to settle before checking.")
]
PauseOpt = Annotated[
    bool,
    typer.Option(
        "--pause", help="Add zombie rounds: SIGSTOP an executor past its lease, SIGCONT after takeover."
    ),
]

ToolsOpt = Annotated[
    bool,
    typer.Option(
        "--tools",
        help="A tool-using load on rem's demo tools server; the report counts sends done twice (0).",
    ),
]

MidSendOpt = Annotated[
    bool,
    typer.Option(
        "--mid-send",
        help="With --tools: kill each executor while it holds a send in flight, so its outcome is unknown.",
    ),
]

StopOpt = Annotated[
    bool,
    typer.Option(
        "--stop-at-violation",
        help="End the rounds at the first one after which `rem check` finds a violation (a failed drill).",
    ),
]


@drill_app.command("sigkill")
def sigkill(
    cli: typer.Context,
    role: RoleOpt = "all",
    rounds: RoundsOpt = 8,
    seed: SeedOpt = 1,
    release: ReleaseOpt = False,
    lease_ms: LeaseOpt = 4000,
    settle_timeout: SettleOpt = 180.0,
    pause: PauseOpt = False,
    tools: ToolsOpt = False,
    mid_send: MidSendOpt = False,
    stop_at_violation: StopOpt = False,
    data: common.DrillDataOpt = None,
    db: common.DbOpt = None,
    json: common.JsonOpt = False,
) -> int:
    """SIGKILL daemons at random points under load, restart them, let it settle, then `rem check`.

    Uses a private temporary data dir unless --data is given: removed when the
    drill passes, kept (and named) when it fails. Exit 1 on any violation.

    With --db (or $REM_DB_URL) a PostgreSQL store: two host identities, host-a and
    host-b, each a `rem up` with its own data dir, share the store and host-a's Chroma.

    Example: rem drill sigkill --role all --rounds 20 --json
    Example: rem drill sigkill --db postgresql://localhost/rem --role all --rounds 20
    """
    # import time: the drill program and rich, only for this command
    from backend.cli.render_drill import drill_round_printer, print_drill
    from backend.programs.drill import PG_HOSTS, DrillConfig, private_data_dir, run_drill
    from backend.runtime.context import Context

    db_url = common.check_db_url(db) if db is not None else common.config_of(cli).db_url
    config = DrillConfig(
        role=role,
        rounds=rounds,
        seed=seed,
        release=release,
        lease_ms=lease_ms,
        pause=pause,
        settle_timeout_s=settle_timeout,
        hosts=PG_HOSTS if db_url else (),
        tools=tools or mid_send,
        mid_send=mid_send,
        stop_at_violation=stop_at_violation,
    )
    config.victims()
    # the drill's own --data only (never the global one): a drill kills what runs on its data dir
    ctx = Context(DataDir.resolve(data) if data is not None else private_data_dir(), db_url=db_url)
    common.note(f"rem drill: data dir {ctx.data.root}")
    printer: Any = drill_round_printer()
    report = common.run(lambda: common.with_context(ctx, lambda c: run_drill(c, config, printer)))
    if json:
        common.emit_json(report)
    else:
        print_drill(report)
    if data is None:
        _private_dir_done(ctx.data.root, bool(report["ok"]))
    return 0 if report["ok"] else 1


def _private_dir_done(root: Path, ok: bool) -> None:
    """The drill's private data dir: removed when it passed, kept (and named) when it failed."""
    if ok:
        shutil.rmtree(root.parent, ignore_errors=True)
    else:
        common.note(f"rem drill: kept {root} (state.db, logs/) for inspection")
