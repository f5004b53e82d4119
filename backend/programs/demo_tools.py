"""rem's own MCP tool server, for the demo and the tests: one tool of each effect class.

    python -P -m backend.programs.demo_tools --data DIR [--http PORT] [--effect-delay-ms MS]

Built on the official SDK's MCPServer (FastMCP), over stdio unless `--http
PORT` serves streamable HTTP on 127.0.0.1:PORT/mcp. Its tools, annotated as
the MCP spec says so rem classifies them from the annotations:

* `notes_search` (readOnlyHint: a `read` tool): the notes in `DIR/notes.jsonl`
  that contain a query;
* `notes_add` (idempotentHint: an `idempotent` tool): appends a note, keyed by
  the call's idempotency key (`_meta["rem/idempotency_key"]`), so a repeat
  with the same key changes nothing and answers with the note it added first;
* `outbox_send` (no read-only or idempotent hint: an `effect` tool): sleeps
  `--effect-delay-ms` (default 2 s: long enough to SIGKILL its caller mid-call),
  then appends the message and its key to `DIR/outbox.jsonl`; never deduplicated,
  so a repeated effect shows as two lines with one key. Once started, a send
  finishes even if its caller is SIGKILLed or cancels it (the server exits
  after it): the effect happened and the caller never heard, the case an
  operator resolves;
* with `--test-tools`, `test_blob` (read): text of a requested size, optionally
  full of control characters and NULs (the tests' huge and hostile results).

Every tool takes an optional `delay_ms` (before it acts), and `--delay-ms`
sets one for all of them. Every start and end of every tool call is one JSON
line in `DIR/tools.log.jsonl` (`time`, `pid`, `tool`, `key`, `arguments`,
`phase`: start, finish, error or cancelled): tests count starts there. Writes
are single `O_APPEND` lines under a file lock, so several servers (one per
rem process) can share one DIR. stdout is the protocol; logs go to stderr.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

from backend.tools.spec import KEY_META

READ = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
EFFECT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)
BLOB_MAX = 64 * 1024 * 1024


class Store:
    """The server's files in its data dir, appended one locked line at a time."""

    def __init__(self, data: Path) -> None:
        data.mkdir(parents=True, exist_ok=True)
        self.data = data
        self.log_path = data / "tools.log.jsonl"
        self.notes_path = data / "notes.jsonl"
        self.outbox_path = data / "outbox.jsonl"

    @contextmanager
    def locked(self, path: Path) -> Iterator[int]:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)

    def append(self, path: Path, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self.locked(path) as fd:
            os.write(fd, line)

    def read(self, path: Path) -> list[dict[str, Any]]:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def log(self, tool: str, key: str | None, arguments: dict[str, Any], phase: str) -> None:
        record = {"time": int(time.time() * 1000), "pid": os.getpid(), "tool": tool, "key": key}
        self.append(self.log_path, {**record, "arguments": arguments, "phase": phase})

    def add_note(self, text: str, key: str | None) -> dict[str, Any]:
        """The note this key added before, else a new one (check and append under one lock)."""
        with self.locked(self.notes_path) as fd:
            if key is not None:
                for note in self.read(self.notes_path):
                    if note.get("key") == key:
                        return {**note, "repeat": True}
            note = {"id": uuid.uuid4().hex[:12], "key": key, "text": text, "time": int(time.time() * 1000)}
            os.write(fd, (json.dumps(note, sort_keys=True) + "\n").encode())
        return {**note, "repeat": False}


def call_key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    key = meta.get(KEY_META)
    return key if isinstance(key, str) else None


@asynccontextmanager
async def logged(
    store: Store, tool: str, ctx: Context, arguments: dict[str, Any]
) -> AsyncIterator[str | None]:
    """Log the call's start, then its finish, error or cancellation."""
    key = call_key(ctx)
    store.log(tool, key, arguments, "start")
    try:
        yield key
    except anyio.get_cancelled_exc_class():
        store.log(tool, key, arguments, "cancelled")
        raise
    except Exception:
        store.log(tool, key, arguments, "error")
        raise
    store.log(tool, key, arguments, "finish")


def build_server(
    store: Store, *, default_delay_ms: int, effect_delay_ms: int, test_tools: bool
) -> MCPServer[None]:
    """The server with its tools bound to `store`."""
    server: MCPServer[None] = MCPServer(
        name="rem-demo-tools",
        instructions="Notes to search and add, and an outbox to send messages through.",
        log_level="WARNING",
    )

    async def pause(requested: int | None, default: int) -> None:
        ms = default if requested is None else requested
        if ms > 0:
            await anyio.sleep(ms / 1000)

    @server.tool(description="Search the notes for a word or phrase (all notes if empty).", annotations=READ)
    async def notes_search(
        ctx: Context, query: str = "", limit: int = 10, delay_ms: int | None = None
    ) -> str:
        async with logged(store, "notes_search", ctx, {"query": query, "limit": limit}):
            await pause(delay_ms, default_delay_ms)
            found = [n["text"] for n in store.read(store.notes_path) if query.lower() in n["text"].lower()]
            return "\n".join(found[: max(0, limit)]) or "no notes match"

    @server.tool(description="Add a note (a repeat of the same call adds nothing).", annotations=IDEMPOTENT)
    async def notes_add(ctx: Context, text: str, delay_ms: int | None = None) -> str:
        async with logged(store, "notes_add", ctx, {"text": text}) as key:
            await pause(delay_ms, default_delay_ms)
            note = store.add_note(text, key)
            return f"note {note['id']} {'already added' if note['repeat'] else 'added'}"

    @server.tool(description="Send a message to someone (slow; every call sends).", annotations=EFFECT)
    async def outbox_send(ctx: Context, to: str, body: str, delay_ms: int | None = None) -> str:
        # a send in flight is not undone by its caller dying or giving up (the server exits after it)
        with anyio.CancelScope(shield=True):
            async with logged(store, "outbox_send", ctx, {"to": to, "body": body}) as key:
                await pause(delay_ms, effect_delay_ms)
                record = {"id": uuid.uuid4().hex[:12], "key": key, "to": to, "body": body}
                store.append(store.outbox_path, {**record, "time": int(time.time() * 1000)})
        return f"message {record['id']} sent to {to}"

    if test_tools:

        @server.tool(
            description="Test aid: text of size_bytes bytes (hostile: control characters).", annotations=READ
        )
        async def test_blob(
            ctx: Context, size_bytes: int, hostile: bool = False, delay_ms: int | None = None
        ) -> str:
            async with logged(store, "test_blob", ctx, {"size_bytes": size_bytes, "hostile": hostile}):
                await pause(delay_ms, default_delay_ms)
                unit = "a\x00\x1b[31m\x07\r\x9b" if hostile else "abcdefgh"
                size = min(max(0, size_bytes), BLOB_MAX)
                return (unit * (size // len(unit) + 1))[:size]

    return server


def server_config(
    data: Path, *, effect_delay_ms: int = 2000, delay_ms: int = 0, test_tools: bool = False
) -> dict[str, Any]:
    """The `mcpServers` entry that runs this server over stdio on `data` (for `rem demo`'s REM_MCP_CONFIG)."""
    args = [
        "-P",
        "-m",
        "backend.programs.demo_tools",
        "--data",
        str(data),
        "--effect-delay-ms",
        str(effect_delay_ms),
    ]
    if delay_ms:
        args += ["--delay-ms", str(delay_ms)]
    return {"command": sys.executable, "args": args + (["--test-tools"] if test_tools else [])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="demo_tools", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="where notes, outbox and the call log go")
    parser.add_argument(
        "--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp"
    )
    parser.add_argument("--delay-ms", type=int, default=0, help="delay of every tool without its own")
    parser.add_argument(
        "--effect-delay-ms", type=int, default=2000, help="outbox_send's delay (default 2000)"
    )
    parser.add_argument("--test-tools", action="store_true", help="also offer the tests' test_blob")
    args = parser.parse_args(argv)
    server = build_server(
        Store(args.data.resolve()),
        default_delay_ms=args.delay_ms,
        effect_delay_ms=args.effect_delay_ms,
        test_tools=args.test_tools,
    )
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
