"""The request body's bound, answered in the API's one error shape (413 `payload_too_large`).

Starlette's own bound (`max_body_size`) answers plain text, and replaces any other answer when
the declared length is over it; this one answers JSON. A declared `Content-Length` over the
bound is refused before anything reads the body (which is dropped as it arrives); a body sent without one (chunked) is
counted as it arrives and refused at the first byte past the bound, before anything is written.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.api import errors

# a body declared over the bound but under this is read and dropped before the 413 is sent: a client
# that sends its whole body before reading (most do, without `Expect: 100-continue`) would otherwise
# see its connection reset instead of the answer; a larger one is answered at once and cut off
DRAIN_MAX_BYTES = 16 * 1024 * 1024


async def _drain(receive: Receive) -> None:
    """Read the request body to its end, keeping none of it."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


class BoundedBody:
    """An ASGI middleware: HTTP request bodies of at most `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int = errors.MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            if int(declared) <= DRAIN_MAX_BYTES:
                await _drain(receive)
            response = errors.respond(413, "payload_too_large", errors.TOO_LARGE, {"Connection": "close"})
            await response(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # an HTTPException: FastAPI passes it through its body parsing to the handler
                    raise HTTPException(413)
            return message

        await self.app(scope, bounded, send)
