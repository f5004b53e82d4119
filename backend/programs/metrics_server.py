"""`rem metrics --listen`: an HTTP endpoint Prometheus scrapes, over a read-only snapshot.

prometheus_client's own server answers on its threads (OpenMetrics when the
scraper asks for it, text 0.0.4 otherwise, gzip when accepted); each scrape
asks the `SnapshotCollector`, which takes a fresh `status()` snapshot on this
process's event loop at most once a second and shares it between concurrent
scrapes. The context is read-only and starts nothing: no Chroma server, no
migration, no write to the data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.exposition import start_http_server

from backend import ops
from backend.core.errors import UsageError
from backend.ops.prometheus import SnapshotCollector, registry_for
from backend.runtime.context import Context

log = logging.getLogger("rem.metrics")

DEFAULT_LISTEN = "127.0.0.1:9464"
SNAPSHOT_TIMEOUT_S = 30.0


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9464` for IPv6) -> (host, port); a bad value is a usage error."""
    host, sep, port_text = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"--listen {listen!r} is not HOST:PORT; e.g. --listen {DEFAULT_LISTEN}")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


async def serve(
    ctx: Context,
    listen: str = DEFAULT_LISTEN,
    *,
    max_age_s: float = 1.0,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any]:
    """Serve `/metrics` until SIGINT/SIGTERM (or `stop`); `ready` gets the URL once it listens."""
    host, port = parse_listen(listen)
    loop = asyncio.get_running_loop()

    def snapshot() -> Mapping[str, Any]:
        # on a server thread: hand the read to this loop, which owns the context's connection
        return asyncio.run_coroutine_threadsafe(ops.status(ctx), loop).result(SNAPSHOT_TIMEOUT_S)

    collector = SnapshotCollector(snapshot, max_age_s=max_age_s)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry_for(collector))
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen}: {exc.strerror}; pick another --listen") from exc
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    bound = server.server_address[1]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound}/metrics"
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
    finally:
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        thread.join(5)
    return {"url": url, "snapshots": collector.snapshots}
