"""The request body's bound, answered in the API's one error shape (413 `payload_too_large`).

Starlette's own bound (`max_body_size`) answers plain text, and replaces any other answer when
the declared length is over it; this one answers JSON. A declared `Content-Length` over the
bound is refused before a byte of the body is read; a body sent without one (chunked) is
counted as it arrives and refused at the first byte past the bound, before anything is written.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.api import errors


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
