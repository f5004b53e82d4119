"""The server's listening socket: connections accepted on it carry TCP_NODELAY, on asyncio's loop and
on the one `rem serve` runs on (uvloop's), as a loop gives a socket it created itself (without it, an
answer written as headers then body waited for the client's delayed ACK: ~40 ms a request, measured
on /healthz)."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Callable

import pytest

from backend.api.listen import Listen
from backend.api.server import GC_YOUNG_THRESHOLD, _bound, event_loop, settle_collector


async def nodelay_of_an_accepted_connection() -> int:
    sock = _bound(Listen("127.0.0.1", 0))
    accepted: asyncio.Queue[int] = asyncio.Queue()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            conn = transport.get_extra_info("socket")
            accepted.put_nowait(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        nodelay = await asyncio.wait_for(accepted.get(), 10)
        writer.close()
        return nodelay
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop", [asyncio.new_event_loop, event_loop], ids=["asyncio", "rem-serve"])
def test_accepted_connections_have_nagle_off(loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    with asyncio.Runner(loop_factory=loop) as runner:
        assert runner.run(nodelay_of_an_accepted_connection()) != 0


def test_the_server_keeps_the_cycle_collector_off_its_start_up_objects() -> None:
    """`rem serve` freezes what start-up made and collects its youngest generation less often."""
    before = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
