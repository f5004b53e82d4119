"""What can go wrong with an agent tool, one class per case a caller handles differently.

The question a durable caller must answer after a failure is *did the request
reach the tool?* Each error says so in `request_sent`:

* `ToolConfigError` (a usage error): the tool configuration is wrong; nothing ran.
* `ToolNotFound`: no tool of that name is known (or its name was refused); nothing ran.
* `ToolUnavailable`: its server is down or could not start, and the request was
  provably never sent (`request_sent` False): running it later is safe.
* `ToolConnectionLost`: the request was sent, then the server died or the
  connection broke before an answer: the outcome is unknown.
* `ToolTimeout`: the request was sent and no answer came within the call's
  `timeout_ms` (rem then asked the server to cancel it): the outcome is unknown.
* `ToolAnswerUnreadable`: the server answered at once, but with a message rem
  cannot read (not JSON in UTF-8, or not an MCP result): the call fails now, not
  at its timeout, and its outcome is unknown (the answer may have been a success).

A tool's own failure (MCP `isError`, a JSON-RPC error answer whatever its code,
a Python tool raising) is not an exception: it is a `ToolResult` with `is_error` set.
"""

from __future__ import annotations

from backend.core.errors import ExitCode, NotFound, RemError, UsageError


class ToolConfigError(UsageError):
    """`REM_MCP_CONFIG` (or a `rem.tools` entry point) cannot be used as it is."""


class ToolError(RemError):
    """A tool call that did not produce an answer; `request_sent` says if it may have run."""

    request_sent = False

    def __init__(self, message: str, *, tool: str = "") -> None:
        super().__init__(message)
        self.tool = tool

    @property
    def outcome_unknown(self) -> bool:
        """True when the tool may have acted: its request left this process and no answer came."""
        return self.request_sent


class ToolNotFound(ToolError, NotFound):
    """No tool of that `NAME.TOOL` (or model name) is configured or offered."""


class ToolUnavailable(ToolError):
    """The tool's server is down or cannot start; the request was never sent."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(
        self, message: str, *, tool: str = "", server: str = "", retry_in_ms: int | None = None
    ) -> None:
        super().__init__(message, tool=tool)
        self.server = server
        self.retry_in_ms = retry_in_ms


class ToolConnectionLost(ToolError):
    """The request was sent, then the server or its connection died before answering."""

    exit_code = ExitCode.UNREACHABLE
    request_sent = True


class ToolTimeout(ToolError):
    """The request was sent and no answer came within the call's timeout."""

    request_sent = True

    def __init__(self, message: str, *, tool: str = "", timeout_ms: int = 0) -> None:
        super().__init__(message, tool=tool)
        self.timeout_ms = timeout_ms


class ToolAnswerUnreadable(ToolError):
    """The server answered the call with a message rem cannot read: it ran, or not; nobody can tell."""

    request_sent = True
