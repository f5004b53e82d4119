"""The stdio transport of `rem mcp`: the SDK's `stdio_server`, fed only requests it can read.

The SDK drops a line it cannot parse without answering it: a request
holding a lone surrogate (a `\\ud800` JSON escape, which its parser refuses)
waited forever. Here every line is read (at most `MAX_REQUEST_BYTES`),
checked (UTF-8, JSON, at most `MAX_DEPTH` levels deep, no lone surrogate, a JSON-RPC
message), and either
passed to the SDK or answered at once with a JSON-RPC error carrying the
request's id and one line of text (`rem: error: ...`). A bad notification
has no id to answer: it is logged to stderr and dropped.

While serving, fd 0 reads /dev/null and fd 1 writes to stderr (as the SDK's
own transport does), so stray output of a library never corrupts the
protocol; the protocol runs on private duplicates of both, restored at the
end.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, cast

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.stdio import stdio_server
from pydantic import ValidationError

from backend.core.storable import lone_surrogate_at

log = logging.getLogger("rem.mcp")

# one request line; a longer one is refused unread (the tools' arguments are short)
MAX_REQUEST_BYTES = 4 * 1024 * 1024
LINE_CHARS = 1000
# arrays and objects one request may nest (a tool's arguments need a handful); a deeper one is
# refused in one line: Python's own parser raised RecursionError past ~1000 and the server died
MAX_DEPTH = 64
TOO_DEEP = f"the request nests arrays and objects more than {MAX_DEPTH} levels deep; send a flatter one"
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
# the id of a request too long to read, from the line's first bytes
ID_KEY = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,100}"|-?\d{1,18})')


def one_line(text: str) -> str:
    """`text` as one line of at most `LINE_CHARS` characters (line breaks become spaces)."""
    flat = " ".join(text.splitlines()) if "\n" in text or "\r" in text else text
    return flat if len(flat) <= LINE_CHARS else flat[: LINE_CHARS - 3] + "..."


def deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests arrays and objects more than `limit` levels deep (iterative:
    the walk itself cannot exhaust the recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


@dataclass(frozen=True)
class Refusal:
    """Why a line cannot be served: the id to answer (None: null), a JSON-RPC error code, one line."""

    request_id: Any
    code: int
    message: str
    notification: bool = False  # a notification gets no answer (JSON-RPC), only a line on stderr


def _oversized(raw: bytes) -> Refusal:
    """The refusal of a request line over `MAX_REQUEST_BYTES` (the rest of it is skipped, unread)."""
    return Refusal(
        _id_in(raw), INVALID_REQUEST, f"the request is over {MAX_REQUEST_BYTES} bytes; it was not read"
    )


def refusal(raw: bytes) -> Refusal | None:
    """Why a request line cannot be served; None when the SDK can read it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Refusal(_id_in(raw), PARSE_ERROR, f"the request is not valid UTF-8 (byte {exc.start + 1})")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return Refusal(_id_in(raw), PARSE_ERROR, f"the request is not JSON ({exc})")
    except RecursionError:  # Python's parser gives up near 1000 levels: the id only from the first bytes
        return Refusal(_id_in(raw), INVALID_REQUEST, TOO_DEEP)
    request_id = _usable_id(obj.get("id") if isinstance(obj, dict) else None)
    notification = isinstance(obj, dict) and "method" in obj and "id" not in obj
    if deeper_than(obj, MAX_DEPTH):
        return Refusal(request_id, INVALID_REQUEST, TOO_DEEP, notification)
    where = lone_surrogate_at(obj)
    if where is not None:
        message = (
            f"the request holds a lone surrogate (a \\ud800-\\udfff escape without its pair) in {where}; "
            "send valid Unicode text"
        )
        return Refusal(request_id, INVALID_PARAMS, message, notification)
    problem = _not_jsonrpc(text)
    return None if problem is None else Refusal(request_id, INVALID_REQUEST, problem, notification)


def _not_jsonrpc(text: str) -> str | None:
    """Why `text` is not a JSON-RPC message the SDK reads (None: it is)."""
    try:
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the request"
        return f"the request is not a JSON-RPC message ({where}: {first['msg']})"
    return None


def _usable_id(value: Any) -> Any:
    """A request id to answer with: a string or an integer as it came, anything else null."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return value if lone_surrogate_at(value) is None else None


def _id_in(raw: bytes) -> Any:
    found = ID_KEY.search(raw[:4096])
    if found is None:
        return None
    try:
        return _usable_id(json.loads(found.group(1)))
    except ValueError:
        return None


class ProtocolOut:
    """The protocol's stdout: whole lines, one writer at a time, UTF-8 (what the SDK writes and the refusals)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.lock = anyio.Lock()

    async def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        async with self.lock:
            await anyio.to_thread.run_sync(self._write, data)

    def _write(self, data: bytes) -> None:
        self.handle.write(data)
        self.handle.flush()

    async def flush(self) -> None:
        """Each `write` flushed already."""

    async def refuse(self, refused: Refusal) -> None:
        """Answer a request the SDK cannot read: its id, and one line of text."""
        if refused.notification:
            log.warning("dropped a notification rem cannot read: %s", refused.message)
            return
        error = {"code": refused.code, "message": one_line(f"rem: error: {refused.message}")}
        await self.write(json.dumps({"jsonrpc": "2.0", "id": refused.request_id, "error": error}) + "\n")


class RequestLines:
    """The protocol's stdin as the SDK reads it (`async for line in ...`), bad lines answered here."""

    def __init__(self, handle: IO[bytes], out: ProtocolOut) -> None:
        self.handle = handle
        self.out = out

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            raw = await anyio.to_thread.run_sync(
                self.handle.readline, MAX_REQUEST_BYTES + 1, abandon_on_cancel=True
            )
            if not raw:
                return
            problem: Refusal | None
            if len(raw) > MAX_REQUEST_BYTES and not raw.endswith(b"\n"):
                await anyio.to_thread.run_sync(self._skip_line, abandon_on_cancel=True)
                problem = _oversized(raw)
            elif not raw.strip():
                continue
            else:
                problem = refusal(raw)
            if problem is None:
                yield raw.decode("utf-8")
            else:
                await self.out.refuse(problem)

    def _skip_line(self) -> None:
        while True:
            piece = self.handle.readline(1 << 16)
            if not piece or piece.endswith(b"\n"):
                return


@contextmanager
def private_stdio() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """The protocol's stdin and stdout on private descriptors; fd 0 and 1 point elsewhere meanwhile."""
    wire_in, wire_out, saved_out = os.dup(0), os.dup(1), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    # closefd=False: a reading thread may still be blocked on it when serving ends
    reader = os.fdopen(wire_in, "rb", closefd=False)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        with os.fdopen(wire_out, "wb") as writer:
            yield reader, writer
    finally:
        os.dup2(wire_in, 0)
        os.dup2(saved_out, 1)
        os.close(null)
        os.close(saved_out)


async def serve_stdio(run: Callable[[Any, Any], Awaitable[None]]) -> None:
    """Run an MCP server (`run(read_stream, write_stream)`) over this process's stdin and stdout."""
    with private_stdio() as (reader, writer):
        out = ProtocolOut(writer)
        lines = cast(Any, RequestLines(reader, out))
        async with stdio_server(stdin=lines, stdout=cast(Any, out)) as (read_stream, write_stream):
            await run(read_stream, write_stream)
