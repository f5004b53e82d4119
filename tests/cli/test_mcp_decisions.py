"""`rem mcp --allow-writes --allow-decisions` with the SDK's own stdio client: the operator's decisions
on agent tool calls (`ops.approve|deny|resolve`), kept to the server's scope, journaled as the
server's actor, their errors one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.execution.tool_calls import PlannedCall
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store.events import verify_operator_chain_sync
from backend.store.states import ToolCallState
from tests.cli.test_mcp import _error, _payload
from tests.helpers import REM, rem_env, run_rem
from tests.tui.tool_turns import parked_turn, send_call

DECISIONS = {"list_tool_calls_waiting", "approve_tool_call", "deny_tool_call", "resolve_tool_call"}
ACTOR = "rem mcp (alice)"


def _call(idx: int, state: ToolCallState) -> PlannedCall:
    return send_call(idx, state, "ask" if state == ToolCallState.AWAITING_APPROVAL else "allow")


async def _run_executor(root: Path) -> None:
    ctx = Context(DataDir(root), start_chroma=False, db_url=None)
    try:
        await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), lease_ms=5_000).run()
    finally:
        await ctx.close()


async def _prepare(root: Path) -> tuple[str, str, str]:
    """`mail` (project ops): the offline agent's send, awaiting approval, through the real tool loop;
    `lost` (project default): a parked turn with a call awaiting approval and an unknown outcome."""
    ctx = Context(DataDir(root), start_chroma=False, db_url=None)
    try:
        db = await ctx.db()
        await sessions.admit(
            db, "mail", "Send the weekly report to bob please.", input_id="in-1", project="ops"
        )
        await _run_executor(root)
        mail = await db.scalar("SELECT id FROM tool_call WHERE session_id = 'mail'")
        assert await db.scalar("SELECT state FROM tool_call WHERE id = ?", (mail,)) == "awaiting_approval"
        calls = [_call(0, ToolCallState.AWAITING_APPROVAL), _call(1, ToolCallState.PENDING)]
        asked, unknown = await parked_turn(ctx, "lost", calls, lost=[1], owner="executor-x")
        return str(mail), asked, unknown
    finally:
        await ctx.close()


def _server(data: Path, env: dict[str, str], *scope: str) -> StdioServerParameters:
    args = ["mcp", "--allow-writes", "--allow-decisions", *scope, "--data", str(data)]
    return StdioServerParameters(command=REM, args=args, env=env)


async def test_decisions_over_mcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"demo": server_config(tmp_path / "tools", effect_delay_ms=0)}})
    )
    monkeypatch.setenv("REM_MCP_CONFIG", str(config))
    root = tmp_path / "data"
    mail, asked, unknown = await _prepare(root)
    env = rem_env(REM_OPERATOR="alice", REM_CHROMA_AUTOSTART="0")
    errlog = tmp_path / "mcp-stderr.log"
    with errlog.open("w") as log:
        async with stdio_client(_server(root, env, "--project", "ops"), errlog=log) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await _approve_in_ops(session, mail, asked)
        status = json.loads(run_rem("status", "--data", str(root), "--json", env=env).stdout)["tools"]
        async with stdio_client(_server(root, env, "--all-projects"), errlog=log) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await _deny_and_resolve(session, asked, unknown, status)
    assert "Traceback" not in errlog.read_text(), errlog.read_text()
    await _the_store_says_so(root, mail, asked, unknown)


async def _approve_in_ops(session: ClientSession, mail: str, asked: str) -> None:
    """A server scoped to ops: it lists and decides mail's call only; lost's is not found."""
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert DECISIONS <= set(tools)
    _assert_annotated(tools)
    waiting = _payload(await session.call_tool("list_tool_calls_waiting", {}))
    assert [c["call_id"] for c in waiting["awaiting_approval"]] == [mail]
    assert waiting["unknown_outcome"] == []  # lost's unknown outcome is in project default
    assert waiting["awaiting_approval"][0]["arguments"]["to"] == "bob"

    decided = _payload(await session.call_tool("approve_tool_call", {"call_id": mail}))
    assert (decided["decision"], decided["previous_state"], decided["state"]) == (
        "approve",
        "awaiting_approval",
        "pending",
    )
    assert decided["decided_by"] == ACTOR and decided["unparked"] is True
    assert "is pending, not awaiting_approval" in await _error(
        session, "approve_tool_call", {"call_id": mail}
    )
    # outside the scope, a call is not found in the very words an unknown id is
    for call_id in (asked, "call_nope"):
        assert await _error(session, "approve_tool_call", {"call_id": call_id}) == (
            f"rem: error: no tool call {call_id!r} in project(s) ops; list_tool_calls_waiting lists the "
            "calls waiting for a decision"
        )
    sideways = await _error(session, "resolve_tool_call", {"call_id": mail, "choice": "sideways"})
    assert sideways.startswith("rem: error: bad arguments for resolve_tool_call: choice: ")


async def _deny_and_resolve(session: ClientSession, asked: str, unknown: str, status: dict[str, Any]) -> None:
    """Every project: the list is `rem status --json`'s; deny one call with a reason, resolve the other."""
    waiting = _payload(await session.call_tool("list_tool_calls_waiting", {}))
    for name in ("awaiting_approval", "unknown_outcome"):
        assert _timeless(waiting[name]) == _timeless(status[name]) != []
    assert [c["call_id"] for c in waiting["unknown_outcome"]] == [unknown]

    denied = _payload(await session.call_tool("deny_tool_call", {"call_id": asked, "reason": "not today"}))
    assert (denied["state"], denied["decided_by"], denied["unparked"]) == ("denied", ACTOR, False)
    misplaced = await _error(
        session, "resolve_tool_call", {"call_id": unknown, "choice": "retry", "reason": "x"}
    )
    assert (
        misplaced == "rem: error: reason goes with choice fail; give a result with done, nothing with retry"
    )
    assert "no tool call 'call_nope'" in await _error(session, "deny_tool_call", {"call_id": "call_nope"})
    done = _payload(
        await session.call_tool(
            "resolve_tool_call", {"call_id": unknown, "choice": "done", "result": "sent, 8812"}
        )
    )
    assert (done["decision"], done["state"], done["unparked"]) == ("done", "completed", True)
    assert _payload(await session.call_tool("list_tool_calls_waiting", {})) == {
        "awaiting_approval": [],
        "unknown_outcome": [],
    }


async def _the_store_says_so(root: Path, mail: str, asked: str, unknown: str) -> None:
    """The calls moved, the journal names the MCP actor, and the approved send runs once."""
    await _run_executor(root)
    ctx = Context(DataDir(root), start_chroma=False, db_url=None)
    try:
        db = await ctx.db()
        rows = {
            r[0]: tuple(r[1:])
            for r in await db.fetchall("SELECT id, state, decided_by, reason FROM tool_call")
        }
        assert rows[mail] == ("completed", ACTOR, None)
        assert rows[asked] == ("denied", ACTOR, "not today")
        assert rows[unknown][:2] == ("completed", ACTOR)
        events = await db.fetchall(
            "SELECT kind, actor, target FROM event WHERE kind LIKE 'operator.%' ORDER BY id"
        )
        decisions = [(e[0], e[2]) for e in events if e[0] != "operator.refused"]
        assert decisions == [
            ("operator.approve", mail),
            ("operator.deny", asked),
            ("operator.resolve", unknown),
        ]
        assert {e[1] for e in events} == {ACTOR}
        refused = [e[2] for e in events if e[0] == "operator.refused"]
        assert refused == [mail, asked, "call_nope", "call_nope"]
        assert (await db.read_in_thread(verify_operator_chain_sync))["broken"] is None
    finally:
        await ctx.close()
    starts = [
        json.loads(line) for line in (root.parent / "tools" / "tools.log.jsonl").read_text().splitlines()
    ]
    assert [e["tool"] for e in starts if e["phase"] == "start"] == ["outbox_send"]


def _timeless(calls: list[Any]) -> list[dict[str, Any]]:
    """Calls as listed, but for their age (which moves with the clock)."""
    return [{k: v for k, v in call.items() if k != "age_ms"} for call in calls]


def _assert_annotated(tools: dict[str, Any]) -> None:
    """Decisions are marked as the writes they are; the list as the read it is."""
    for name in DECISIONS:
        annotations = tools[name].annotations
        assert annotations is not None and annotations.title, name
        for prop in tools[name].input_schema.get("properties", {}).values():
            assert len(prop.get("description") or "") > 15, name
        read_only = name == "list_tool_calls_waiting"
        assert annotations.read_only_hint is read_only, name
        if not read_only:
            assert annotations.destructive_hint is True and annotations.idempotent_hint is False, name
    assert tools["approve_tool_call"].annotations.open_world_hint is True
    assert tools["deny_tool_call"].annotations.open_world_hint is False


def test_decisions_need_their_own_flag_and_writes(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    alone = run_rem("mcp", "--allow-decisions", "--project", "ops", "--data", data)
    assert alone.returncode == 2 and alone.stderr == (
        "rem: error: --allow-decisions needs --allow-writes (a decision is a write): pass both\n"
    )
    assert not (tmp_path / "data").exists()
