"""`rem token create|list|revoke`: the bearer tokens of the application API (`rem serve`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from backend import ops
from backend.cli import common

token_app = typer.Typer(
    help="The application API's bearer tokens: create (shown once), list, revoke.", no_args_is_help=True
)

NameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="The token's name (1-64 letters, digits, . _ -).")
]


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")


@token_app.command("create")
def create(
    cli: typer.Context,
    name: NameArg,
    project: Annotated[
        list[str] | None, typer.Option("--project", help="A project it reaches (repeatable).")
    ] = None,
    all_projects: Annotated[bool, typer.Option("--all-projects", help="It reaches every project.")] = False,
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", help="read, write or decide (repeatable; default: read)."),
    ] = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Create a token and print it, alone on one line of stdout, this once (the store keeps its hash).

    Example: rem token create chat-frontend --project support --scope read --scope write > token
    """
    ctx = common.make_context(cli, data, None)
    made = common.run(
        lambda: common.with_context(
            ctx,
            lambda c: ops.token_create(
                c, name, projects=project, all_projects=all_projects, scopes=scope or ()
            ),
        )
    )
    if json:
        common.emit_json(made)
        return
    print(made["token"], flush=True)
    reach = "every project" if made["projects"] is None else ", ".join(made["projects"])
    common.note(f"rem: token {made['name']} ({', '.join(made['scopes'])}) reaches {reach}; keep it secret")


@token_app.command("list")
def list_(
    cli: typer.Context,
    revoked: Annotated[bool, typer.Option("--revoked", help="List revoked tokens too.")] = False,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """List the tokens: name, projects, scopes, who created them and when (never a secret).

    Example: rem token list --json
    """
    ctx = common.make_context(cli, data, None, read_only=True, existing=True)
    rows = common.run(lambda: common.with_context(ctx, lambda c: ops.token_list(c, revoked=revoked)))
    if json:
        common.emit_json(rows)
        return
    from backend.cli.render_tokens import print_tokens  # import time: rich, only for the table

    print_tokens(rows)


@token_app.command("revoke")
def revoke(
    cli: typer.Context, name: NameArg, data: common.DataOpt = None, json: common.JsonOpt = False
) -> None:
    """Revoke a token: every server refuses it from its next request (journaled).

    Example: rem token revoke chat-frontend
    """
    ctx = common.make_context(cli, data, None, existing=True)
    revoked: dict[str, Any] = common.run(
        lambda: common.with_context(ctx, lambda c: ops.token_revoke(c, name))
    )
    if json:
        common.emit_json(revoked)
        return
    common.note(f"rem: token {revoked['name']} ({revoked['id']}) revoked")
