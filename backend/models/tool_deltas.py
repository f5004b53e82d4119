"""A reply's tool calls, assembled from streamed Chat Completions `tool_calls` deltas, bounded.

A model streams each call in pieces keyed by `index` (parallel calls
interleave): the first piece names its `id` and `function.name`, later ones
append to `function.arguments`. What is outside input is bounded: at most
`REM_TOOL_CALLS_MAX` calls per reply, names of at most 64 characters, and
at most `REM_TOOL_ARGUMENTS_MAX_BYTES` of arguments per call. A call past a
bound is kept with a `refused` reason (its arguments dropped) so the agent
answers it with a clear tool error instead of running it; calls past the count
are dropped, with one refused call saying so. A name or arguments holding a character
no store can hold (`backend.core.storable`: NUL, a lone surrogate) refuse the call too
(its name kept with U+FFFD in place of each); an id holding one is kept so repaired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backend.core.settings import settings
from backend.core.storable import storable_text

NAME_MAX = 64
ID_MAX = 128
NOT_TEXT = (
    "its function name or arguments hold a NUL character or a lone surrogate (a \\ud800-\\udfff "
    "escape without its pair), which no store can hold; it was not run"
)


@dataclass
class ModelToolCall:
    """One call the model asked for: its own id, the function name, the arguments' JSON text."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    refused: str | None = None  # why rem will not run it (a bound it broke)

    def as_message(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` item (sent back with the result)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments if self.refused is None else "{}"},
        }


@dataclass
class ToolCallAssembler:
    """Collects the `tool_calls` deltas of one streamed reply."""

    max_calls: int = field(default_factory=lambda: settings.tool_calls_max)
    max_argument_bytes: int = field(default_factory=lambda: settings.tool_arguments_max_bytes)
    calls: dict[int, ModelToolCall] = field(default_factory=dict)
    dropped: int = 0

    def feed(self, deltas: Any) -> int:
        """One chunk's `delta.tool_calls` (a list of pieces); anything malformed is ignored. Returns
        how many unstorable characters were replaced (each refuses its call, but in an id)."""
        if not isinstance(deltas, list):
            return 0
        return sum(self._piece(piece) for piece in deltas if isinstance(piece, dict))

    def _piece(self, piece: dict[str, Any]) -> int:
        index = piece.get("index", len(self.calls))
        if not isinstance(index, int) or index < 0:
            return 0
        call = self.calls.get(index)
        if call is None:
            if len(self.calls) >= self.max_calls:
                self.dropped += 1
                return 0
            call = self.calls[index] = ModelToolCall(index=index)
        replaced = 0
        if isinstance(piece.get("id"), str) and not call.id:
            call.id, replaced = storable_text(piece["id"][:ID_MAX])
        function = piece.get("function")
        if not isinstance(function, dict):
            return replaced
        name, arguments = function.get("name"), function.get("arguments")
        found = 0
        if isinstance(name, str):
            name, found = storable_text(name)
            call.name = (call.name + name)[: NAME_MAX + 1]
        if isinstance(arguments, str):
            found += storable_text(arguments)[1]
        if found:
            call.arguments, call.refused = "", NOT_TEXT
            return replaced + found
        if isinstance(arguments, str) and call.refused is None:
            call.arguments += arguments
            if len(call.arguments.encode("utf-8", "replace")) > self.max_argument_bytes:
                call.arguments = ""
                call.refused = (
                    f"its arguments are over {self.max_argument_bytes} bytes "
                    "(REM_TOOL_ARGUMENTS_MAX_BYTES); it was not run"
                )
        return replaced

    def result(self) -> list[ModelToolCall]:
        """The calls in index order (ids made up where the model gave none), and a refusal for the
        calls dropped past the count."""
        out = []
        for position, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            call.id = call.id or f"call_{position}"
            if len(call.name) > NAME_MAX and call.refused is None:
                call.refused = f"its function name is over {NAME_MAX} characters; it was not run"
            out.append(call)
        if self.dropped:
            out.append(
                ModelToolCall(
                    index=max(self.calls, default=-1) + 1,
                    id=f"call_{len(out)}",
                    name="rem__too_many_calls",
                    refused=(
                        f"the reply asked for more than {self.max_calls} tool calls (REM_TOOL_CALLS_MAX); "
                        f"{self.dropped} were not run"
                    ),
                )
            )
        return out
