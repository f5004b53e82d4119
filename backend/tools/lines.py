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

`unreadable_answer` does the same for a line that is no JSON-RPC message rem
can read (not JSON, not UTF-8, `"result": 5`): the request it answers gets
an error at once (code `UNREADABLE_CODE`, `data["rem/unreadable"]` saying
why) instead of waiting out its timeout. `lenient_message` first reads what
only a lone-surrogate escape spoiled: the SDK's parser refuses `"\\ud800"`, the
JSON grammar allows it, and rem makes it U+FFFD anyway (`results.inert`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from backend.tools.results import inert

HEAD_BYTES = 4096
OVERSIZE_CODE = -32019
OVERSIZE_KEY = "rem/oversize"
UNREADABLE_CODE = -32018
UNREADABLE_KEY = "rem/unreadable"
SHOWN_BYTES = 200  # of an unreadable answer, quoted in its error
# how the SDK's streamable HTTP client answers a request whose response it could not parse
SDK_PARSE_FAILURES = ("Failed to parse JSON response", "Failed to parse SSE message")
SURROGATE = re.compile(r"[\ud800-\udfff]")
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
    ident = response_id(head)
    if ident is None:
        return None
    message = f"the tool server's answer is over {max_bytes} bytes; rem discarded it unread"
    return error_answer(ident, OVERSIZE_CODE, message, {OVERSIZE_KEY: max_bytes})


def unreadable_answer(line: bytes, parsed: Any, why: str) -> dict[str, Any] | None:
    """The JSON-RPC error answering the request an unreadable `line` was for, or None if unknown."""
    if isinstance(parsed, dict):
        ident = parsed.get("id")
        if "method" in parsed or isinstance(ident, bool) or not isinstance(ident, int | str):
            return None
    else:
        ident = response_id(line[:HEAD_BYTES])
        if ident is None:
            return None
    data = {UNREADABLE_KEY: why, "head": line[:SHOWN_BYTES].decode("utf-8", "replace")}
    return error_answer(ident, UNREADABLE_CODE, f"rem cannot read the tool server's answer: {why}", data)


def response_id(head: bytes) -> int | str | None:
    """The id of the response that begins with `head` (None: not a response, or no id before its body)."""
    body = head[head.find(b"{") :] if b"{" in head else b""
    cut = min((i for i in (body.find(b'"result"'), body.find(b'"error"')) if i >= 0), default=-1)
    if cut < 0 or b'"method"' in body[:cut]:
        return None  # not a response, or one whose id comes after its (huge) result
    match = ID.search(body, 0, cut)
    if match is None:
        return None
    try:
        ident = json.loads(match.group(1))
    except ValueError:  # an id string with a broken escape: no request of rem's
        return None
    return ident if isinstance(ident, int | str) else None


def oversize(code: int, message: str, data: Any) -> bool:
    """An error that stands for an answer over the message bound: rem's stdio reader, its JSON cap, or the SDK's SSE cap."""
    return (
        (code == OVERSIZE_CODE and isinstance(data, dict) and OVERSIZE_KEY in data)
        or OVERSIZE_KEY in message
        or (code == types.CONNECTION_CLOSED and "byte limit" in message)
    )


def unreadable(code: int, message: str, data: Any) -> str | None:
    """Why the answer an error stands for could not be read (rem's stdio reader, the SDK's HTTP one), or None."""
    if code == UNREADABLE_CODE and isinstance(data, dict) and isinstance(data.get(UNREADABLE_KEY), str):
        head = data.get("head")
        return f"{data[UNREADABLE_KEY]}; it began {head!r}" if isinstance(head, str) else data[UNREADABLE_KEY]
    if code == types.PARSE_ERROR and message.startswith(SDK_PARSE_FAILURES):
        return " ".join(message.split(":", 1)[-1].split())[:SHOWN_BYTES] or message
    return None


def error_answer(ident: int | str, code: int, message: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message, "data": data}}


def lenient_message(line: bytes) -> tuple[Any, str]:
    """`line` as JSON with lone surrogates made U+FFFD (None when it is not JSON in UTF-8), and why not."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start} is {line[exc.start]:#04x})"
    try:
        return _replace_surrogates(json.loads(text, parse_constant=_no_constant)), ""
    except RecursionError:
        return None, "JSON nested too deep"
    except ValueError as exc:
        return None, f"not JSON ({getattr(exc, 'msg', exc)})"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    return value


def validation_line(exc: ValidationError, within: tuple[str | int, ...] = ()) -> str:
    """A pydantic error's first problem in one inert line, `where: what` (`where` without its `within` prefix)."""
    errors = exc.errors()
    if not errors:
        return "invalid"
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    loc = loc[len(within) :] if loc[: len(within)] == within else loc
    where = ".".join(str(part) for part in loc) or "the message"
    extra = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return inert(" ".join(f"{where}: {first.get('msg', 'invalid')}{extra}".split()))[:300]


def message_problem(parsed: Any, exc: ValidationError) -> str:
    """Why `parsed` is no JSON-RPC message, said of the kind it claims to be (a result, an error)."""
    kind = None
    if isinstance(parsed, dict):
        kind = (
            types.JSONRPCResponse if "result" in parsed else types.JSONRPCError if "error" in parsed else None
        )
    if kind is not None:
        try:
            kind.model_validate(parsed, by_name=False)
        except ValidationError as claimed:
            exc = claimed
    return f"not a JSON-RPC message ({validation_line(exc)})"
