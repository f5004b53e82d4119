"""Every connection to the data dir's Chroma server is checked, not only the first.

Before a client is made for the server's URL, its listener is checked
(`ChromaTrust.listener`); then, inside the HTTP client, each new TCP
connection, before a request is sent on it (`ChromaTrust.connection`). A
pooled connection dies with its server, so whatever a client reaches after a
restart is a new connection, and checked. A refusal is `ChromaUntrusted`,
reported to the trust's `refused` hook (a daemon journals it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Protocol

from backend.core.errors import ChromaUntrusted


class ChromaTrust(Protocol):
    """How a store checks the server it talks to (the data dir's own: `server.DataDirTrust`)."""

    def listener(self, url: str) -> None:
        """Raise ChromaUntrusted unless what listens on `url` is the server to use."""

    def connection(self, url: str, sock: socket.socket) -> None:
        """Raise ChromaUntrusted unless the new connection `sock` reaches that server."""

    def refused(self, exc: ChromaUntrusted) -> None:
        """Told of every refusal (a daemon journals them)."""


# a reply to a request rem sent that is not the shape Chroma's API gives (read by rem or chromadb)
MALFORMED_REPLY = (KeyError, IndexError, TypeError, ValueError)


def instrument(
    client: Any, check: Callable[[socket.socket], None] | None, replied: Callable[[], None]
) -> None:
    """Hook chromadb's HTTP client: `replied` on every response, `check` on every new connection.

    chromadb 1.5.9 (pinned) keeps its httpx client at `client._server._session`. The
    check runs in httpcore's trace of `connect_tcp`, after the TCP handshake and before a byte
    of the request: a refused connection is closed unused. Connections the chromadb
    constructor opened before the hook existed are dropped, so every request after it goes out
    on a checked one (the constructor's own requests followed `ChromaTrust.listener`).
    """
    session = client._server._session

    def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete" and check is not None:
            stream = info["return_value"]
            try:
                check(stream.get_extra_info("socket"))
            except BaseException:
                stream.close()
                raise

    def on_request(request: Any) -> None:
        request.extensions["trace"] = trace

    def on_response(_response: Any) -> None:
        replied()

    hooks = session.event_hooks
    session.event_hooks = {
        "request": [*hooks.get("request", []), on_request],
        "response": [*hooks.get("response", []), on_response],
    }
    if check is not None:
        session._transport.close()
