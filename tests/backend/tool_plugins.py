"""A `rem.tools` entry-point target for the tests (registered with `importlib.metadata.EntryPoint`)."""

from __future__ import annotations

import asyncio
from typing import Any

from backend.tools.python_tools import PythonTool

CALLS: list[tuple[str, dict[str, Any], str]] = []


async def add(arguments: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
    CALLS.append(("add", arguments, idempotency_key))
    return {"sum": arguments["a"] + arguments["b"], "key": idempotency_key}


async def fail(arguments: dict[str, Any], idempotency_key: str) -> str:
    CALLS.append(("fail", arguments, idempotency_key))
    raise RuntimeError("the ledger is closed\x1b[2J")


async def stall(arguments: dict[str, Any], idempotency_key: str) -> str:
    CALLS.append(("stall", arguments, idempotency_key))
    await asyncio.sleep(30)
    return "never"


NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def make_tools() -> list[PythonTool]:
    return [
        PythonTool("add", "Add two numbers", NUMBERS, add, effect="read"),
        PythonTool("fail", "Always fails", {"type": "object"}, fail, effect="idempotent"),
        PythonTool("stall", "Never finishes in time", {"type": "object"}, stall),
        PythonTool("bad.name", "A name no model can call", {"type": "object"}, add),
    ]


NOT_TOOLS = {"a": 1}
