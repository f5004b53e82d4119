"""A loopback HTTP proxy that adds a bearer token: for a client that sends none (the MCP conformance
suite), so the server stays closed to requests without one.

Everything else passes as sent, the Host and Origin headers included (the DNS rebinding checks must
see the client's own), and a response streams back as it comes (an SSE stream stays one). It is
uvicorn and httpx on a thread of their own, on a free port.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.types import Receive, Scope, Send

# per connection, not per message (RFC 9110 7.6.1): the proxy's own connections carry their own
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade", b"proxy-connection"}


class TokenProxy:
    """The ASGI app: each request forwarded to `upstream` with `Authorization: Bearer TOKEN` added."""

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.authorization = f"Bearer {token}".encode()
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=300))
        body = await _body(receive)
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP and k != b"authorization"]
        query = scope["query_string"].decode()
        url = self.upstream + scope["raw_path"].decode() + (f"?{query}" if query else "")
        request = self.client.build_request(
            scope["method"], url, headers=[*headers, (b"authorization", self.authorization)], content=body
        )
        response = await self.client.send(request, stream=True)
        try:
            kept = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


@contextmanager
def token_proxy(upstream: str, token: str) -> Iterator[str]:
    """The proxy on a free loopback port for the block's length; its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until uvicorn accepts them: no start-up race
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(TokenProxy(upstream, token), log_level="warning", lifespan="off", access_log=False)
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
