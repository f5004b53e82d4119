"""MCP over Streamable HTTP at a real `rem serve`'s /mcp, with the MCP Python SDK's own streamable HTTP
client (both eras: the 2025-11-25 handshake and 2026-07-28's discovery): `rem mcp`'s tools listed and
called, each request kept to its token's projects and scopes, writes and decisions journaled with the
token's name; on both stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from backend import ops
from backend.api.mcp_http import TOOL_SCOPES
from backend.execution import sessions
from backend.programs.mcp_server import build_server
from backend.runtime.context import Context
from backend.store.events import verify_operator_chain_sync
from backend.store.states import ToolCallState
from tests.api.mcp_serving import handshake_session, modern_client, serving
from tests.cli.test_mcp import _error, _payload
from tests.tui.tool_turns import parked_turn, send_call

READS = {"recall", "get_session", "graph_neighbors", "list_projects"}
DECISIONS = {"list_tool_calls_waiting", "approve_tool_call", "deny_tool_call", "resolve_tool_call"}


async def test_every_tool_of_rem_mcp_has_the_scope_it_needs_over_http(tmp_path: Path) -> None:
    """A tool added to rem mcp without a scope here would be neither listed nor served over HTTP."""
    server = build_server(Context.for_path(str(tmp_path / "d")), allow_writes=True, allow_decisions=True)
    assert {t.name for t in await server.list_tools()} == set(TOOL_SCOPES)
    assert {t for t, s in TOOL_SCOPES.items() if s == "read"} == READS
    assert {t for t, s in TOOL_SCOPES.items() if s == "decide"} == DECISIONS


async def _prepare(ctx: Context) -> dict[str, str]:
    """Two projects, each with a parked turn whose call awaits approval; three tokens; their secrets."""
    calls: dict[str, str] = {}
    for sid, project in (("mail", "ops"), ("ledger", "money")):
        (calls[sid],) = await parked_turn(
            ctx, sid, [send_call(0, ToolCallState.AWAITING_APPROVAL)], owner="x"
        )
        db = await ctx.db()
        async with db.tx() as conn:
            await conn.execute("UPDATE session SET project = ? WHERE id = ?", (project, sid))
    await sessions.admit(await ctx.db(), "notes", "The pager rota moves to Tuesdays.", project="ops")
    for name, scopes, projects in (
        ("reader", ["read"], ["ops"]),
        ("ops-bot", ["read", "write", "decide"], ["ops"]),
        ("root-decider", ["decide"], None),
    ):
        made = await ops.token_create(
            ctx, name, projects=projects, all_projects=projects is None, scopes=scopes
        )
        calls[name] = made["token"]
    return calls


@pytest.mark.both_stores
async def test_mcp_over_http_keeps_each_token_to_its_projects_and_scopes(
    db_ctx: Context, tmp_path: Path
) -> None:
    made = await _prepare(db_ctx)
    with serving(db_ctx.data.root, tmp_path / "serve.log") as url:
        async with handshake_session(url, made["reader"]) as session:
            await _reader_sees_ops_only(session)
        async with handshake_session(url, made["ops-bot"]) as session:
            admitted = await _ops_bot_decides_and_writes_in_ops(session, made["mail"], made["ledger"])
        async with modern_client(url, made["root-decider"]) as client:
            assert client.protocol_version == "2026-07-28"
            assert {t.name for t in (await client.list_tools()).tools} == DECISIONS
            waiting = _payload(await client.call_tool("list_tool_calls_waiting", {}))
            assert [c["call_id"] for c in waiting["awaiting_approval"]] == [made["ledger"]]
            denied = await client.call_tool("deny_tool_call", {"call_id": made["ledger"], "reason": "no"})
            assert _payload(denied)["decided_by"] == "root-decider"
            refused = await client.call_tool("get_session", {"session_id": "mail"})
            assert refused.is_error and "lacks the 'read' scope get_session needs" in refused.content[0].text
    await _journal_names_the_tokens(db_ctx, made["mail"], made["ledger"], admitted)


async def _reader_sees_ops_only(session: ClientSession) -> None:
    """read, project ops: the read tools only; nothing of project money, which reads as missing."""
    assert {t.name for t in (await session.list_tools()).tools} == READS
    projects = _payload(await session.call_tool("list_projects", {}))["projects"]
    assert [p["project"] for p in projects] == ["ops"]
    shown = _payload(await session.call_tool("get_session", {"session_id": "notes"}))
    assert shown["session"]["id"] == "notes"
    foreign = await _error(session, "get_session", {"session_id": "ledger"})
    missing = await _error(session, "get_session", {"session_id": "nope"})
    assert foreign == missing.replace("'nope'", "'ledger'")
    assert await _error(session, "recall", {"query": "rota", "project": "money"}) == (
        "rem: error: project 'money' is not served here: this server serves project(s) ops"
    )
    for tool, arguments, scope in (
        ("add_memory", {"session_id": "notes", "text": "x"}, "write"),
        ("approve_tool_call", {"call_id": "call_x"}, "decide"),
    ):
        assert await _error(session, tool, arguments) == (
            f"rem: error: token 'reader' lacks the {scope!r} scope {tool} needs; create one with "
            f"`rem token create NAME --scope {scope}`"
        )


async def _ops_bot_decides_and_writes_in_ops(session: ClientSession, mail: str, ledger: str) -> str:
    """read, write, decide, project ops: every tool; money's call is an unknown one; journaled as ops-bot."""
    assert {t.name for t in (await session.list_tools()).tools} == set(TOOL_SCOPES)
    waiting = _payload(await session.call_tool("list_tool_calls_waiting", {}))
    assert [c["call_id"] for c in waiting["awaiting_approval"]] == [mail]
    approved = _payload(await session.call_tool("approve_tool_call", {"call_id": mail}))
    assert (approved["state"], approved["decided_by"]) == ("pending", "ops-bot")
    assert await _error(session, "approve_tool_call", {"call_id": ledger}) == (
        f"rem: error: no tool call {ledger!r} in project(s) ops; list_tool_calls_waiting lists the calls "
        "waiting for a decision"
    )
    added = _payload(await session.call_tool("add_memory", {"session_id": "notes", "text": "Rota: Tue."}))
    assert (added["session_id"], added["duplicate"]) == ("notes", False)
    return str(added["input_id"])


async def _journal_names_the_tokens(ctx: Context, mail: str, ledger: str, admitted: str) -> None:
    """Each decision, refusal and admission names the token it came with; the audit chain holds."""
    db = await ctx.db()
    rows = await db.fetchall(
        "SELECT kind, actor, target FROM event WHERE kind IN "
        "('operator.approve', 'operator.deny', 'operator.refused', 'input.admitted') ORDER BY id"
    )
    journal: list[tuple[Any, ...]] = [tuple(r) for r in rows]
    assert journal[1:] == [  # the first: the input `_prepare` admitted (as `send`, the library's default)
        ("operator.approve", "ops-bot", mail),
        ("operator.refused", "ops-bot", ledger),
        ("input.admitted", "ops-bot", admitted),
        ("operator.deny", "root-decider", ledger),
    ]
    states = dict(await db.fetchall("SELECT id, decided_by FROM tool_call"))
    assert states == {mail: "ops-bot", ledger: "root-decider"}
    assert (await db.read_in_thread(verify_operator_chain_sync))["broken"] is None
