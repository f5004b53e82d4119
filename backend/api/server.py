"""The `rem serve` process: uvicorn on the daemon loop, registered as a worker of role `server`.

It is a `Daemon` without passes: it registers (so `rem status`, the console
and the metrics show it alive), heartbeats, and serves until drained. SIGTERM,
SIGINT and `rem drain` stop it gracefully: it stops accepting, lets requests
in flight finish (streams are closed; their clients resume from their
cursor, here or on another replica) and marks itself stopped. uvicorn's own
signal handling is off: the daemon's handles both signals once for the
whole process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
import uvloop

from backend.api.app import create_app, streams_open
from backend.api.hub import hub_of
from backend.api.listen import DEFAULT_LISTEN as DEFAULT_LISTEN
from backend.api.listen import Listen
from backend.api.listen import parse_listen as parse_listen
from backend.api.stats import ApiStats
from backend.core.errors import BadInput
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import workers
from backend.store.workers import WorkerRole

# requests in flight get this long to finish after a drain before the server closes them
GRACEFUL_S = 10
# allocations between two of the cycle collector's youngest collections (Python's default: 700)
GC_YOUNG_THRESHOLD = 10_000


def event_loop() -> asyncio.AbstractEventLoop:
    """The loop `rem serve` runs on: uvloop's (libuv), on which the server spends ~15 % less CPU on
    an admission's main thread than on asyncio's own (benchmarks/api_admission.py)."""
    return uvloop.new_event_loop()


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the daemon's own handle SIGTERM and SIGINT), ticking
    once a second instead of ten times, and stopped at once by `stop()`."""

    _stopped: asyncio.Event | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        """uvicorn's loop: its tick refreshes the Date header (once a second) and looks for an exit.
        Its own ticks ten times a second, an idle server's largest cost (~0.2 % of a core here)."""
        self._stopped = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000  # on_tick refreshes the date at multiples of ten
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), 1.0)

    def stop(self) -> None:
        """Stop accepting and close down (what `should_exit` asks, without waiting for a tick)."""
        self.should_exit = True
        if self._stopped is not None:
            self._stopped.set()


class ApiServer(Daemon):
    """`rem serve`: the API app on one loopback (or allowed) address until drained."""

    role = WorkerRole.SERVER
    watches_store = False  # no passes: nothing to wake for

    def __init__(self, ctx: Context, listen: Listen, *, owner_id: str | None = None) -> None:
        super().__init__(ctx, owner_id=owner_id)
        self.listen = listen
        self.app = create_app(ctx)
        self.app.state.draining = self.draining  # /readyz answers 503 once a drain began
        self._recorded: dict[str, Any] | None = None
        self.socket = _bound(listen)
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_S,
            lifespan="on",
            http="httptools",  # uvicorn's fastest parser, named: h11, its fallback, doubles a request's CPU
        )
        self.server = QuietServer(config)

    @property
    def url(self) -> str:
        return self.listen.url(self.port)

    def info(self) -> dict[str, Any]:
        """The worker row's `info`: where it listens, and its requests (`backend.api.stats`)."""
        stats: ApiStats = self.app.state.stats
        return {"listen": self.url, **stats.record(streams_open(self.app))}

    async def on_heartbeat(self) -> None:
        """Record `info` at a heartbeat that changed it (a write of an unchanged row would wake
        every watcher of the store for nothing)."""
        await super().on_heartbeat()
        info = self.info()
        if info != self._recorded:
            await workers.record_info(self.db, self.owner_id, info)
            self._recorded = info

    async def _loop(self) -> None:
        settle_collector()
        serving = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        draining = asyncio.create_task(self.draining.wait())
        try:
            await asyncio.wait({serving, draining}, return_when=asyncio.FIRST_COMPLETED)
            self.server.stop()
            await hub_of(self.app).close()  # streams end now: their clients resume on another replica
            await serving
        finally:
            draining.cancel()


def settle_collector() -> None:
    """Keep the cycle collector off the objects of start-up and off most requests' garbage.

    Each admission allocates a few hundred objects, nearly all freed by reference counting; with
    Python's default threshold the collector ran every few requests and walked the whole app
    (FastAPI's routes and models, the MCP SDK) each time it reached the oldest generation: ~9 % of
    the event loop's CPU an admission (py-spy). The app's objects are frozen out of its reach, and
    its youngest collection waits for more allocations (a cycle's garbage lives a little longer).
    """
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def _bound(listen: Listen) -> socket.socket:
    """The listening socket, bound now (a taken port fails here, in one line, before registering)."""
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every answer written in two parts (headers, body) waited ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen.host, listen.port))
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {listen.url()}: {exc.strerror}; choose another --listen") from None
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock
