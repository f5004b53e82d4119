"""The API app on a real loopback socket inside the test's event loop (uvicorn, as `rem serve` runs
it), and an SSE reader for httpx that follows the WHATWG parsing rules the tests rely on."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from backend.api.app import create_app
from backend.api.hub import hub_of
from backend.api.server import QuietServer
from backend.runtime.context import Context


@dataclass
class Served:
    """A running app: its base URL, the app (its hub is `app.state.hub`) and its uvicorn server."""

    url: str
    app: FastAPI
    server: uvicorn.Server


@asynccontextmanager
async def serving(ctx: Context, *, sndbuf: int | None = None) -> AsyncIterator[Served]:
    """`create_app(ctx)` served by uvicorn on 127.0.0.1 (a free port) until the block ends; `sndbuf`:
    the kernel send buffer of its connections (they inherit the listener's), as on a slow link."""
    app = create_app(ctx)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = QuietServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", app, server)
    finally:
        server.stop()
        await hub_of(app).close()  # open streams end, as a drain ends them
        await task
        sock.close()


@dataclass
class Sse:
    """One dispatched SSE event (or the priming block: `event` "", no data)."""

    id: str | None
    event: str
    data: str
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_blocks(response: httpx.Response) -> AsyncIterator[Sse]:
    """Every block of an SSE response, as the WHATWG parser reads it (comments skipped)."""
    fields: dict[str, str] = {}
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if fields or data:
                retry = fields.get("retry")
                yield Sse(
                    fields.get("id"),
                    fields.get("event", "message"),
                    "\n".join(data),
                    int(retry) if retry else None,
                )
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        else:
            fields[name] = value


async def collect(
    blocks: AsyncIterator[Sse], *, until: str | None = None, count: int | None = None
) -> list[Sse]:
    """Blocks of one response's `sse_blocks` (priming and all) until one of type `until`, or `count`
    of them with data (a response is read by one `sse_blocks` only: httpx reads a body once)."""
    seen: list[Sse] = []
    async for block in blocks:
        seen.append(block)
        if until is not None and block.event == until:
            break
        if count is not None and sum(1 for b in seen if b.data) >= count:
            break
    return seen
