"""A whole fixed-length answer written on uvicorn's connection in one write, as uvicorn would write it.

uvicorn writes a response's head when the app sends `http.response.start` and its body when it
sends the body: two writes, two `send` syscalls on the socket, each a tenth of admission's event
loop thread on loopback (py-spy, `benchmarks/api_admission.py`). `write_whole` writes both at once
and moves uvicorn's request cycle to where its own two `send`s would leave it (response started
and complete, the next pipelined request released). It applies only where that is plainly the
same: uvicorn's httptools cycle (uvicorn is pinned, 0.55.0; as `pinger` reads it), a keep-alive
connection, no access log, writes not paused, nothing sent yet, the client still there. Anywhere
else it writes nothing and says so, and the caller sends as any ASGI app does.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

Header = tuple[bytes, bytes]


def write_whole(send: Send, status: int, headers: list[Header], body: bytes) -> bool:
    """Write the answer (`headers` must hold its content-length) in one write; False: nothing written."""
    cycle: Any = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or not _plain(cycle):
        return False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    head = [STATUS_LINE[status]]
    for name, value in (*cycle.default_headers, *headers):
        head += (name, b": ", value, b"\r\n")
    head += (b"\r\n", body)
    cycle.transport.write(b"".join(head))
    cycle.chunked_encoding, cycle.expected_content_length = False, 0
    cycle.response_complete = True
    cycle.message_event.set()
    cycle.on_response()
    return True


def _plain(cycle: Any) -> bool:
    """Whether uvicorn's own `send` would write the answer as it is, with nothing else to do."""
    return bool(
        cycle.keep_alive
        and not cycle.access_log
        and not cycle.response_started
        and not cycle.disconnected
        and not cycle.flow.write_paused
        and cycle.scope["method"] != "HEAD"
    )
