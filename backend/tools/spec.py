"""A tool as rem knows it (`ToolSpec`), and the two spellings of its name.

Operators, the CLI, the configuration and the journal write `NAME.TOOL`
(`notes.notes_add`); the model sees `NAME__TOOL` (`notes__notes_add`), because
function names in the Chat Completions API must match `^[A-Za-z0-9_-]{1,64}$`.

* A source's NAME (an `mcpServers` key, or a `rem.tools` entry-point name) must
  match `^[A-Za-z0-9_-]+$`, hold no `__` and not end in `_`, so that the first
  `__` of a model name always ends the NAME: the mapping is one to one. A NAME
  that breaks this is a configuration error.
* A TOOL name is the server's. One that cannot be part of a model function name
  (a character outside `[A-Za-z0-9_-]`, such as `.` or a space, or a model name
  over 64 characters) is **refused**, never silently renamed: a renamed tool
  would be a name the server does not know, and two tools could collide. A
  refused tool is left out of the catalogue and shown, with its reason, in the
  server's health and in `rem tools`; the fix is on the server's side (or a
  shorter NAME).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from backend.tools.effects import EffectClass, Permission, Source, annotation_conflict

# where a tools/call carries its idempotency key: `_meta["rem/idempotency_key"]` (scripts outside rem rely on it)
KEY_META = "rem/idempotency_key"
SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]+")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MODEL_NAME_MAX = 64
SEPARATOR = "__"
DESCRIPTION_MAX = 4096  # characters of a tool's description kept (it goes into every model request)


def source_name_problem(name: str) -> str | None:
    """Why `name` cannot name a tool source (an MCP server or an entry point), or None when it can."""
    if not SOURCE_NAME.fullmatch(name):
        return "may hold only letters, digits, '_' and '-'"
    if SEPARATOR in name:
        return "may not hold '__' (it separates NAME from TOOL in the model's function names)"
    if name.endswith("_"):
        return "may not end in '_' (NAME__TOOL would be ambiguous)"
    if len(name) > MODEL_NAME_MAX - 3:
        return f"is longer than {MODEL_NAME_MAX - 3} characters"
    return None


def model_name(server: str, tool: str) -> str:
    """`NAME__TOOL`: what the model calls the tool."""
    return f"{server}{SEPARATOR}{tool}"


def qualified_name(server: str, tool: str) -> str:
    """`NAME.TOOL`: what operators, the CLI and the configuration call the tool."""
    return f"{server}.{tool}"


def tool_name_problem(server: str, tool: str) -> str | None:
    """Why tool `tool` of `server` cannot be offered to a model, or None when it can."""
    if not tool:
        return "has an empty name"
    name = model_name(server, tool)
    if not FUNCTION_NAME.fullmatch(name):
        if len(name) > MODEL_NAME_MAX:
            return (
                f"makes a model function name {name!r} over {MODEL_NAME_MAX} characters (use a shorter NAME)"
            )
        return (
            f"has a name {tool[:80]!r} the model cannot call (allowed: letters, digits, '_' and '-'); "
            "rem does not rename tools: rename it in the server"
        )
    return None


def split_name(name: str) -> tuple[str, str] | None:
    """(NAME, TOOL) from `NAME.TOOL` or `NAME__TOOL`; None when it is neither."""
    if "." in name:
        server, _, tool = name.partition(".")
    elif SEPARATOR in name:
        server, _, tool = name.partition(SEPARATOR)
    else:
        return None
    if not server or not tool or source_name_problem(server) is not None:
        return None
    return server, tool


@dataclass(frozen=True)
class ToolSpec:
    """One tool the model may be offered: its names, what it does, and how rem treats its calls."""

    name: str  # NAME.TOOL
    server: str  # NAME: the MCP server's key in mcpServers, or the rem.tools entry point
    tool: str  # TOOL: the name the server knows it by
    model_name: str  # NAME__TOOL
    description: str
    input_schema: dict[str, Any]
    effect: EffectClass
    effect_source: Source
    permission: Permission
    permission_source: Source
    timeout_ms: int
    timeout_source: Source
    kind: str = "mcp"  # "mcp" or "python"
    annotations: dict[str, Any] = field(default_factory=dict)  # the server's hints, as it sent them
    available: bool = True  # False while its server is down (the spec is the last one listed)
    unavailable_reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The spec as plain JSON values (`rem tools --json`, the status snapshot)."""
        return {
            "name": self.name,
            "server": self.server,
            "tool": self.tool,
            "model_name": self.model_name,
            "kind": self.kind,
            "description": self.description,
            "effect": str(self.effect),
            "effect_source": str(self.effect_source),
            "permission": str(self.permission),
            "permission_source": str(self.permission_source),
            "timeout_ms": self.timeout_ms,
            "timeout_source": str(self.timeout_source),
            "annotations": self.annotations,
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
        }

    def annotation_warning(self) -> str | None:
        """One line when its annotations contradict each other (rem believes the worse half), else None."""
        why = annotation_conflict(self.annotations)
        if why is None:
            return None
        return (
            f"{self.name}: its annotations {why}; rem does not trust them: "
            f"effect class {self.effect} (from {self.effect_source})"
        )

    def openai_tool(self) -> dict[str, Any]:
        """The tool as a Chat Completions `tools` entry (`{"type": "function", ...}`)."""
        return {
            "type": "function",
            "function": {
                "name": self.model_name,
                "description": self.description,
                "parameters": self.input_schema or {"type": "object", "properties": {}},
            },
        }


@dataclass(frozen=True)
class RefusedTool:
    """A tool a source offers that rem does not: its name cannot become a model function name."""

    server: str
    tool: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"server": self.server, "tool": self.tool, "reason": self.reason}
