"""`rem approve`, `rem deny`, `rem resolve`: the operator's decisions on agent tool calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from backend import ops
from backend.cli import common

if TYPE_CHECKING:
    from backend.ops.results import ToolDecision

CallArg = Annotated[str, typer.Argument(metavar="CALL", help="The tool call's id (`rem status` lists them).")]


def register(app: typer.Typer) -> None:
    app.command("approve")(approve)
    app.command("deny")(deny)
    app.command("resolve")(resolve)


def approve(
    cli: typer.Context,
    call_id: CallArg,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Approve a tool call awaiting approval: it runs when its turn resumes.

    Example: rem approve call_3f9a1c2b7d
    """
    url = common.server_of(cli, server, data=data)
    if url is not None:
        from backend.api import client  # import time: httpx2, only with --server

        _show(client.through(url, lambda r: client.approve(r, call_id)), json)
        return
    ctx = common.make_context(cli, data, None, existing=True)
    _show(common.run(lambda: common.with_context(ctx, lambda c: ops.approve(c, call_id))), json)


def deny(
    cli: typer.Context,
    call_id: CallArg,
    reason: Annotated[str | None, typer.Option(help="Why; the model is told.")] = None,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Deny a tool call awaiting approval: it never runs, and the model is told so.

    Example: rem deny call_3f9a1c2b7d --reason "not to that address"
    """
    url = common.server_of(cli, server, data=data)
    if url is not None:
        from backend.api import client  # import time: httpx2, only with --server

        _show(client.through(url, lambda r: client.deny(r, call_id, reason)), json)
        return
    ctx = common.make_context(cli, data, None, existing=True)
    _show(common.run(lambda: common.with_context(ctx, lambda c: ops.deny(c, call_id, reason))), json)


def resolve(
    cli: typer.Context,
    call_id: CallArg,
    done: Annotated[bool, typer.Option("--done", help="It happened: --result is its result.")] = False,
    retry: Annotated[bool, typer.Option("--retry", help="Run it again, with the same key.")] = False,
    fail: Annotated[bool, typer.Option("--fail", help="It did not happen: the model is told.")] = False,
    result: Annotated[str | None, typer.Option(help="With --done: the tool's result for the model.")] = None,
    reason: Annotated[str | None, typer.Option(help="With --fail: why, for the model.")] = None,
    server: common.ServerOpt = None,
    data: common.DataOpt = None,
    json: common.JsonOpt = False,
) -> None:
    """Decide a tool call whose outcome is unknown (an effect in flight when its executor died).

    Check the tool's own records first: --done if it happened, --retry to run it
    again with the same idempotency key, --fail if it did not.

    Example: rem resolve call_3f9a1c2b7d --done --result "sent, receipt 8812"
    """
    from backend.core.errors import BadInput  # import time: only when the command runs

    chosen = [name for name, on in (("done", done), ("retry", retry), ("fail", fail)) if on]
    if len(chosen) != 1:
        raise BadInput("choose exactly one of --done, --retry, --fail")
    choice = chosen[0]
    if result is not None and choice != "done":
        raise BadInput("--result goes with --done; use --reason with --fail")
    if reason is not None and choice != "fail":
        raise BadInput("--reason goes with --fail; use --result with --done")
    text = result if choice == "done" else reason
    url = common.server_of(cli, server, data=data)
    if url is not None:
        from backend.api import client  # import time: httpx2, only with --server

        _show(client.through(url, lambda r: client.resolve(r, call_id, choice, text)), json)
        return
    ctx = common.make_context(cli, data, None, existing=True)
    _show(
        common.run(lambda: common.with_context(ctx, lambda c: ops.resolve(c, call_id, choice, text))),  # type: ignore[arg-type]
        json,
    )


def _show(decision: ToolDecision | Mapping[str, Any], json: bool) -> None:
    if json:
        common.emit_json(decision)
        return
    then = "; its turn resumes now" if decision["unparked"] else ""
    common.note(
        f"rem: {decision['decision']} {decision['call_id']} ({decision['tool']}, session "
        f"{decision['session_id']}): {decision['previous_state']} -> {decision['state']}{then}"
    )
