"""`rem mcp` with the SDK's own stdio client, against a live data dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

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

    params = StdioServerParameters(command=REM, args=["mcp", "--data", data], env=env)
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


async def test_add_memory_only_with_allow_writes(tmp_path: Path, chroma_url: str, collection: str) -> None:
    env = rem_env(REM_CHROMA_URL=chroma_url, REM_CHROMA_COLLECTION=collection)
    data = str(tmp_path / "data")
    assert run_rem("init", "--data", data, env=env).returncode == 0
    params = StdioServerParameters(command=REM, args=["mcp", "--allow-writes", "--data", data], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert "add_memory" in {t.name for t in (await session.list_tools()).tools}
        added = _payload(
            await session.call_tool(
                "add_memory", {"session_id": "m1", "text": "Remember the blue door.", "project": "p"}
            )
        )
        assert added["session_id"] == "m1" and added["admitted_seq"] == 1
    status = json.loads(run_rem("status", "--data", data, "--json", env=env).stdout)
    assert status["backlog"]["inputs_total"] == 1  # admitted through the normal path, waiting for an executor
