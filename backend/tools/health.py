"""Tool-source health as this process sees it, and the limits every source works within.

A source (an MCP server, or a `rem.tools` entry point) is in one of:

* `idle`: configured, not started yet (servers start on first use);
* `starting`: spawning or connecting, `initialize`, listing its tools;
* `up`: its session is live (an entry point: loaded);
* `down`: it died or could not start (an entry point: failed to load); its
  `last_error` says why in one line and `retry_at` when the next start may be
  tried (rem tries again on the next use after that);
* `closed`: the registry was closed.

`ServerHealth` is plain JSON, so the status snapshot and `rem tools --json`
can carry it as it is. Like model health, it is kept in process memory: each
executor has its own servers, so each has its own view.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from backend.core.settings import settings
from backend.tools.results import inert, message_bound

ERROR_MAX = 300


class ServerState(StrEnum):
    IDLE = "idle"
    STARTING = "starting"
    UP = "up"
    DOWN = "down"
    CLOSED = "closed"


class ServerHealth(TypedDict):
    server: str
    transport: str  # stdio, http or python
    state: str  # a ServerState
    since: int  # Unix time in ms, when it entered this state
    last_error: str | None
    restarts: int  # starts after the first one
    retry_at: int | None  # when down: the earliest next start (Unix time in ms)
    pid: int | None  # a live stdio server's process
    tools: int | None  # tools in its last listing (None: never listed)
    refused: list[dict[str, str]]  # its tools rem does not offer ({server, tool, reason}): a name, a schema


@dataclass(frozen=True)
class Limits:
    """Timeouts and size bounds, read from the settings once per registry."""

    timeout_ms: int = 60_000
    start_timeout_ms: int = 30_000
    result_max_bytes: int = 1_048_576
    model_max_bytes: int = 32_768
    schema_max_bytes: int = 65_536

    @property
    def message_max_bytes(self) -> int:
        return message_bound(self.result_max_bytes)

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(
            timeout_ms=settings.tool_timeout_ms,
            start_timeout_ms=settings.tool_start_timeout_ms,
            result_max_bytes=settings.tool_result_max_bytes,
            model_max_bytes=settings.tool_result_model_bytes,
            schema_max_bytes=settings.tool_schema_max_bytes,
        )


def leaf_error(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe_error(exc: BaseException, start_timeout_ms: int) -> str:
    """One inert line saying why a source failed: no traceback, no type name when the message says it."""
    leaf = leaf_error(exc)
    if isinstance(leaf, TimeoutError):
        text = f"no answer within {start_timeout_ms} ms (REM_TOOL_START_TIMEOUT_MS)"
    elif type(leaf).__name__ == "ConnectError":
        text = f"cannot connect ({leaf or 'connection refused'})"
    elif isinstance(leaf, OSError) and leaf.strerror:
        text = leaf.strerror
    else:
        message = getattr(getattr(leaf, "error", None), "message", None)  # an MCPError's ErrorData
        text = str(message or leaf) or type(leaf).__name__
        if type(leaf).__module__.split(".")[0] not in ("backend", "builtins"):
            text = f"{type(leaf).__name__}: {text}"
    text = inert(" ".join(text.split()))
    return text if len(text) <= ERROR_MAX else text[: ERROR_MAX - 3] + "..."
