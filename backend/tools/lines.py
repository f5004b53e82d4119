"""Reading a tool server's output in bounded memory: lines up to a size, the rest discarded as it arrives.

A stdio MCP server sends one JSON-RPC message per line; the SDK's own reader
joins a line's chunks without limit, so a server that writes a gigabyte
without a newline would take a gigabyte of rem's memory. `LineBuffer` holds
at most `max_bytes` of a line: past that it reports an `Overflow` once (with
the line's first bytes) and drops the rest of the line up to its newline.

`oversize_answer` turns an overflowing *response* into the JSON-RPC error
rem's session then sees for that request (code `OVERSIZE_CODE`, in the MCP
implementation-defined range, with `data["rem/oversize"]`), so the caller
gets a prompt, clear tool error instead of waiting for its timeout. The
request's id is read from the line's first bytes: JSON-RPC envelopes from
the SDKs (Python's pydantic, TypeScript's JSON.stringify) put `id` before
`result`. An overflow whose id cannot be found there (or that is a request
or notification from the server) is dropped with a warning; its call then
times out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

HEAD_BYTES = 4096
OVERSIZE_CODE = -32019
OVERSIZE_KEY = "rem/oversize"
ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\\r\n]|\\.){0,200}")')


@dataclass(frozen=True)
class Overflow:
    """A line longer than the bound: its first bytes (the rest is being discarded)."""

    head: bytes


class LineBuffer:
    """Splits a byte stream into lines, holding at most `max_bytes` of the current one."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[bytes] = []
        self.size = 0
        self.discarding = False

    def feed(self, chunk: bytes) -> list[bytes | Overflow]:
        """The complete lines (without their newline) and overflows that `chunk` finishes or starts."""
        out: list[bytes | Overflow] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            self._take(chunk[start:end], out)
            if newline < 0:
                return out
            if not self.discarding:
                out.append(b"".join(self.parts))
            self.parts, self.size, self.discarding = [], 0, False
            start = newline + 1

    def _take(self, piece: bytes, out: list[bytes | Overflow]) -> None:
        if self.discarding or not piece:
            return
        if self.size + len(piece) <= self.max_bytes:
            self.parts.append(piece)
            self.size += len(piece)
            return
        head = bytearray()
        for part in [*self.parts, piece]:
            head += part[: HEAD_BYTES - len(head)]
            if len(head) >= HEAD_BYTES:
                break
        self.parts, self.size, self.discarding = [], 0, True
        out.append(Overflow(bytes(head)))


def oversize_answer(head: bytes, max_bytes: int) -> dict[str, Any] | None:
    """The JSON-RPC error answering the request an overflowing response was for, or None if unknown."""
    body = head[head.find(b"{") :] if b"{" in head else b""
    cut = min((i for i in (body.find(b'"result"'), body.find(b'"error"')) if i >= 0), default=-1)
    if cut < 0 or b'"method"' in body[:cut]:
        return None  # not a response, or one whose id comes after its (huge) result
    match = ID.search(body, 0, cut)
    if match is None:
        return None
    return {
        "jsonrpc": "2.0",
        "id": json.loads(match.group(1)),
        "error": {
            "code": OVERSIZE_CODE,
            "message": f"the tool server's answer is over {max_bytes} bytes; rem discarded it unread",
            "data": {OVERSIZE_KEY: max_bytes},
        },
    }
