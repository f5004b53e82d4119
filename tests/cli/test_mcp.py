"""`rem mcp` with the SDK's own stdio client, against a live data dir: tools, scope, one-line errors."""

from __future__ import annotations

import json
import select
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.mcpserver.exceptions import ToolError

from backend.core.datadir import DataDir
from backend.programs.mcp_server import build_server
from backend.runtime.context import Context
from tests.backend.test_recall import write_jsonl
from tests.helpers import REM, rem_env, run_rem


def _payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def test_the_mcp_round_trip_over_stdio(tmp_path: Path, chroma_url: str, collection: str) -> None:
    env = rem_env(REM_CHROMA_URL=chroma_url, REM_CHROMA_COLLECTION=collection)
    data = str(tmp_path / "data")
    assert (
        run_rem("import", str(write_jsonl(tmp_path / "chats.jsonl")), "--data", data, env=env).returncode == 0
    )
    for role in ("summarizer", "dream"):
        assert run_rem("daemon", "--role", role, "--once", "--data", data, env=env).returncode == 0

    params = StdioServerParameters(command=REM, args=["mcp", "--all-projects", "--data", data], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name for t in (await session.list_tools()).tools}
        assert tools == {
            "recall",
            "get_session",
            "graph_neighbors",
            "list_projects",
        }  # read-only: no add_memory
        found = _payload(
            await session.call_tool("recall", {"query": "puppy at the seaside", "project": "ops", "k": 3})
        )
        assert found["items"][0]["message_id"] == "p-1"
        projects = _payload(await session.call_tool("list_projects", {}))
        assert {p["project"]: p["sessions"] for p in projects["projects"]} == {"home": 1, "ops": 3}
        assert {p["project"]: p["turns_indexed"] for p in projects["projects"]} == {"home": 1, "ops": 5}
        detail = _payload(await session.call_tool("get_session", {"session_id": "pets"}))
        assert detail["session"]["project"] == "ops" and len(detail["messages"]) == 2
        graph = _payload(await session.call_tool("graph_neighbors", {"node": "Biscuit"}))
        assert graph["node"]["id"] == "entity:biscuit" and any(
            e["kind"] == "mentions" for e in graph["edges"]
        )
        missing = await session.call_tool("get_session", {"session_id": "nope"})
        assert missing.is_error and "no session 'nope'" in missing.content[0].text
        both = _payload(await session.call_tool("graph_neighbors", {"node": "payments"}))
        assert {e["project"] for e in both["edges"]} == {"ops", "home"}
    await _scoped_to_ops(data, env, tmp_path / "mcp-stderr.log")


async def _error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.content
    (content,) = result.content
    assert content.text.startswith("rem: error: ") and "\n" not in content.text, content.text
    return str(content.text)


async def _scoped_to_ops(data: str, env: dict[str, str], errlog: Path) -> None:
    """`--project ops`: nothing of project home is served; errors are one line, with no traceback."""
    params = StdioServerParameters(command=REM, args=["mcp", "--project", "ops", "--data", data], env=env)
    with errlog.open("w") as log:
        async with stdio_client(params, errlog=log) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            projects = _payload(await session.call_tool("list_projects", {}))
            assert [p["project"] for p in projects["projects"]] == ["ops"]
            found = _payload(await session.call_tool("recall", {"query": "payments mortgage", "k": 10}))
            assert found["items"] and {i["session_id"] for i in found["items"]} <= {"deploy", "pets", "food"}
            assert await _error(session, "recall", {"query": "payments", "project": "home"}) == (
                "rem: error: project 'home' is not served here: this server serves project(s) ops"
            )
            assert "all_projects is refused" in await _error(
                session, "recall", {"query": "payments", "all_projects": True}
            )
            assert await _error(session, "recall", {"query": "payments", "session": "money"}) == (
                "rem: error: no session 'money' in project(s) ops"
            )
            assert await _error(session, "get_session", {"session_id": "money"}) == (
                "rem: error: no session 'money' in project(s) ops"
            )
            assert (
                _payload(await session.call_tool("get_session", {"session_id": "pets"}))["session"]["id"]
                == "pets"
            )
            ops_only = _payload(await session.call_tool("graph_neighbors", {"node": "payments"}))
            assert {e["project"] for e in ops_only["edges"]} == {"ops"}
            assert "no graph node 'mortgage'" in await _error(
                session, "graph_neighbors", {"node": "mortgage"}
            )
            # errors that used to reach the client as "Error executing tool recall" plus a traceback
            assert "k" in await _error(session, "recall", {"query": "payments", "k": 0})
            assert (await _error(session, "recall", {"query": "payments", "k": "many"})).startswith(
                "rem: error: bad arguments for recall: k: "
            )
    assert "Traceback" not in errlog.read_text(), errlog.read_text()


async def test_add_memory_only_with_allow_writes_and_kept_to_its_projects(
    tmp_path: Path, chroma_url: str, collection: str
) -> None:
    env = rem_env(REM_CHROMA_URL=chroma_url, REM_CHROMA_COLLECTION=collection)
    data = str(tmp_path / "data")
    theirs = run_rem("send", "theirs", "A secret of project q.", "--project", "q", "--data", data, env=env)
    assert theirs.returncode == 0, theirs.stderr
    params = StdioServerParameters(
        command=REM, args=["mcp", "--allow-writes", "--project", "p", "--data", data], env=env
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert "add_memory" in listed
        # the decisions on tool calls need --allow-decisions as well (tests/cli/test_mcp_decisions.py)
        assert not {n for n in listed if "tool_call" in n}, sorted(listed)
        _assert_described_and_annotated(listed)
        added = _payload(await session.call_tool("add_memory", {"text": "Remember the blue door."}))
        new = added["session_id"]
        assert new.startswith("mcp-") and added["admitted_seq"] == 1  # a new session, in p
        again = _payload(await session.call_tool("add_memory", {"session_id": new, "text": "And the key."}))
        assert again["session_id"] == new and again["admitted_seq"] == 2
        # another project's session answers exactly as a missing one: it told "not in project(s) p"
        for sid in ("theirs", "nobody-has-this"):
            for extra in ({}, {"project": "p"}, {"project": "q"}):
                assert await _error(session, "add_memory", {"session_id": sid, "text": "x", **extra}) == (
                    f"rem: error: no session {sid!r} in project(s) p; leave session_id out to start a new "
                    "session"
                )
    status = json.loads(run_rem("status", "--data", data, "--json", env=env).stdout)
    assert status["backlog"]["inputs_total"] == 3  # admitted through the normal path, waiting for an executor
    assert status["counts"]["sessions"] == 2  # nothing was created under the ids refused


def _assert_described_and_annotated(tools: dict[str, Any]) -> None:
    """What a client shows: every parameter described, every tool annotated (issue: bare names before)."""
    for name, tool in tools.items():
        schema = tool.input_schema
        for param, prop in schema.get("properties", {}).items():
            assert len(prop.get("description") or "") > 15, (name, param)
        assert tool.annotations is not None and tool.annotations.title, name
        assert tool.annotations.open_world_hint is False, name
        writes = name == "add_memory"
        assert tool.annotations.read_only_hint is not writes, name
    # the one tool that writes only adds: not destructive, and each call admits another input
    add = tools["add_memory"].annotations
    assert add.destructive_hint is False and add.idempotent_hint is False


def _rpc(proc: subprocess.Popen[bytes], line: bytes, timeout: float = 30) -> dict[str, Any]:
    """Send one raw JSON-RPC line to a `rem mcp` process and read its one-line answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + b"\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer to {line[:80]!r}"
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    return answer


def test_every_request_is_answered_and_bad_text_refused_in_one_line(tmp_path: Path) -> None:
    """Raw lines, as a client in another language sends them (the Python SDK cannot encode a lone
    surrogate, nor nest 100 000 arrays): each gets an answer with its id, and the server goes on
    serving."""
    data = str(tmp_path / "data")
    assert run_rem("init", "--data", data).returncode == 0
    proc = subprocess.Popen(
        [REM, "mcp", "--all-projects", "--data", data],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=rem_env(),
    )
    try:
        init = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        # the server warms recall (imports, the embedder) before it answers initialize: seconds
        # on a loaded machine
        started = _rpc(
            proc,
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}).encode(),
            timeout=180,
        )
        assert started["id"] == 1 and "result" in started
        assert proc.stdin is not None
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        surrogate = _rpc(
            proc,
            b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", '
            b'"params": {"name": "recall", "arguments": {"query": "bad \\ud800 text"}}}',
        )
        assert surrogate["id"] == 2 and surrogate["error"]["code"] == -32602
        assert surrogate["error"]["message"] == (
            "rem: error: the request holds a lone surrogate (a \\ud800-\\udfff escape without its pair) "
            "in params.arguments.query; send valid Unicode text"
        )
        garbage = _rpc(proc, b"this is not json")
        assert garbage["id"] is None and garbage["error"]["message"].startswith(
            "rem: error: the request is not JSON"
        )
        nested = b"[" * 100_000 + b"]" * 100_000  # Python's parser raised RecursionError: the server died
        deep = _rpc(
            proc, b'{"jsonrpc": "2.0", "id": "deep", "method": "tools/call", "params": ' + nested + b"}"
        )
        assert deep["id"] == "deep" and deep["error"]["message"] == (
            "rem: error: the request nests arrays and objects more than 64 levels deep; send a flatter one"
        )
        huge = _rpc(proc, b'{"jsonrpc": "2.0", "id": "big", "params": "' + b"x" * (5 << 20) + b'"}')
        assert huge["id"] == "big" and "over 4194304 bytes" in huge["error"]["message"]
        listed = _rpc(
            proc, b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_projects"}}'
        )
        assert listed["id"] == 3 and listed["result"]["structuredContent"] == {"projects": []}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()


def test_rem_mcp_wants_its_scope_said_explicitly(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    bare = run_rem("mcp", "--data", data)
    assert bare.returncode == 2 and bare.stderr == (
        "rem: error: rem mcp needs a scope: pass --project P (repeatable) for the projects a client may see, "
        "or --all-projects to serve every project\n"
    )
    both = run_rem("mcp", "--project", "ops", "--all-projects", "--data", data)
    assert both.returncode == 2 and "contradict" in both.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.mark.parametrize("debug", [False, True])
async def test_an_unexpected_failure_is_one_line_and_its_traceback_only_under_debug(
    data_dir: DataDir, debug: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = Context(data_dir, start_chroma=False, read_only=True)
    server = build_server(ctx, projects=None, debug=debug)

    @server.tool()
    async def explode() -> dict[str, Any]:
        raise RuntimeError("the disk said no\nand then more")

    with pytest.raises(ToolError) as failed:
        await server.call_tool("explode", {})
    assert str(failed.value) == "rem: error: explode failed: RuntimeError: the disk said no and then more"
    logged = [r for r in caplog.records if r.exc_info]
    assert bool(logged) is debug
    await ctx.close()
