"""A tool's answer as rem keeps it: text, bounded and inert, with its error flag and size.

A result is outside input (a tool server may be buggy or hostile), so:

* **bounded**: what a transport will read of one message is capped
  (`message_bound`: 4x `REM_TOOL_RESULT_MAX_BYTES` plus room for the envelope,
  because JSON escaping inflates text); a bigger message is discarded as it
  streams in and its call answered with an error result saying so (see
  `backend.tools.stdio` and `backend.tools.http`). What is kept in the part is
  at most `REM_TOOL_RESULT_MAX_BYTES` of UTF-8 (`text`, with `truncated` set
  and `size_bytes` the size before); what the model is shown is at most
  `REM_TOOL_RESULT_MODEL_BYTES` (`for_model`).
* **inert**: NUL is removed; every other control character except tab and
  newline (ESC, BEL, CR, DEL, the C1 range) becomes a visible `\\xNN`, and a
  lone surrogate becomes U+FFFD, so the text can be stored in any database
  and no byte of it can drive a terminal. (Escaping markup for display is the
  renderer's job.)

MCP content blocks become text: text blocks as they are; an embedded text
resource's text; an image, audio, blob or link as a one-line placeholder
naming its type and size (rem does not pass binary content to the model).
`structuredContent` is used only when there is no text block (the spec asks
servers to send both).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

NUL = "\x00"
# C0 controls but tab and newline, DEL, C1 controls; and lone surrogates
CONTROL = re.compile(r"[\x01-\x08\x0b-\x1f\x7f-\x9f]")
SURROGATE = re.compile(r"[\ud800-\udfff]")
ENVELOPE_BYTES = 64 * 1024
TRUNCATED_NOTE = "\n[rem: the tool's result was {size} bytes; only the first {kept} are shown]"


def inert(text: str) -> str:
    """`text` with no NUL, no control character (made a visible `\\xNN`) and no lone surrogate."""
    if NUL in text:
        text = text.replace(NUL, "")
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return SURROGATE.sub("\ufffd", text)


def utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits `max_bytes` (never a broken character)."""
    if len(text) * 4 <= max_bytes:
        return text
    return text.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def message_bound(result_max_bytes: int) -> int:
    """How many bytes of one wire message a transport reads before discarding the rest."""
    return 4 * result_max_bytes + ENVELOPE_BYTES


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer (success or tool-level error), ready to be stored in a tool part."""

    text: str  # inert, at most result_max_bytes of UTF-8
    is_error: bool = False
    size_bytes: int = 0  # the size of the whole answer as received, before truncation
    truncated: bool = False
    duration_ms: float = 0.0
    error_code: int | None = None  # a JSON-RPC error the server answered with (unknown tool, bad arguments)

    def for_model(self, max_bytes: int) -> str:
        """The text the model is shown: at most `max_bytes`, with a note when it was cut."""
        if self.size_bytes <= max_bytes and not self.truncated:
            return self.text
        kept = utf8_prefix(self.text, max_bytes)
        return kept + TRUNCATED_NOTE.format(size=self.size_bytes, kept=len(kept.encode("utf-8")))

    def as_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "is_error": self.is_error,
            "size_bytes": self.size_bytes,
            "truncated": self.truncated,
            "duration_ms": round(self.duration_ms, 1),
            "error_code": self.error_code,
        }


def bounded_result(
    text: str, *, is_error: bool, max_bytes: int, duration_ms: float = 0.0, error_code: int | None = None
) -> ToolResult:
    """A ToolResult holding at most `max_bytes` of `text`, made inert."""
    size = len(text.encode("utf-8", "replace"))
    kept = utf8_prefix(text, max_bytes) if size > max_bytes else text
    return ToolResult(
        text=inert(kept),
        is_error=is_error,
        size_bytes=size,
        truncated=size > max_bytes,
        duration_ms=duration_ms,
        error_code=error_code,
    )


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind == "resource":
        resource = getattr(block, "resource", None)
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        blob = getattr(resource, "blob", "") or ""
        return f"[resource {getattr(resource, 'uri', '')}: {getattr(resource, 'mime_type', None)}, {len(blob) * 3 // 4} bytes]"
    if kind in ("image", "audio"):
        data = getattr(block, "data", "") or ""
        return f"[{kind}: {getattr(block, 'mime_type', None)}, {len(data) * 3 // 4} bytes]"
    if kind == "resource_link":
        return f"[resource link: {getattr(block, 'uri', '')}]"
    return f"[{kind} content]"


def call_result_text(result: Any) -> str:
    """The text of an MCP `CallToolResult`: its content blocks joined, else its structured content."""
    parts = [_block_text(block) for block in (getattr(result, "content", None) or [])]
    if not any(parts):
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            return json.dumps(structured, ensure_ascii=False, default=str)
    return "\n".join(parts)
