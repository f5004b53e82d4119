"""A real `rem serve` for the MCP tests, and the MCP Python SDK's streamable HTTP client of its /mcp."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx2
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import REM, rem_env, wait_until


@contextmanager
def serving(data: Path, log: Path, **env: str) -> Iterator[str]:
    """`rem serve` on a free loopback port over `data` (and the store REM_DB_URL names, if any); its
    URL. Stopped with SIGTERM at the end, which it must obey (exit 0), with no traceback in its log."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [REM, "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=rem_env(REM_CHROMA_AUTOSTART="0", **env),
            start_new_session=True,
        )
    try:
        found = wait_until(
            lambda: (
                proc.poll() is not None or re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text())
            ),
            message="rem serve's serving line",
        )
        assert proc.poll() is None, log.read_text()
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, log.read_text()
        finally:
            proc.kill()
    assert "Traceback" not in log.read_text(), log.read_text()


def bearer(token: str) -> httpx2.AsyncClient:
    """An HTTP client that carries `token`, as an MCP client configured with `headers` does."""
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)


@asynccontextmanager
async def handshake_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """The SDK's ClientSession over streamable HTTP, initialized (the 2025-11-25 handshake)."""
    async with bearer(token) as http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def modern_client(url: str, token: str) -> AsyncIterator[Client]:
    """The SDK's Client, which discovers the server and speaks 2026-07-28 (no handshake, no session)."""
    async with bearer(token) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            yield client
