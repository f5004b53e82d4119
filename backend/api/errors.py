"""The API's errors: one JSON shape, one status per kind of rem error, never a traceback.

Every error answers `{"error": {"code": CODE, "message": ONE_LINE}}`. rem's own
exception tree (`backend.core.errors`) maps here once; a request FastAPI could
not validate is a 400 naming the field; anything else is a 500 whose message
says only that (the traceback goes to the server's log, never to a client).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend.core.errors import (
    BadInput,
    ChromaUnreachable,
    DatabaseFull,
    DatabaseIOError,
    DatabaseLocked,
    DatabaseUnreachable,
    InputConflict,
    NotFound,
    OutOfReach,
    ReadOnly,
    Refused,
    RemError,
    UsageError,
)
from backend.core.inert import visible

log = logging.getLogger("rem.api")

# the most specific class first: a ReadOnly is a Refused, a BadInput a UsageError
STATUS: tuple[tuple[type[RemError], int, str], ...] = (
    (ReadOnly, 403, "read_only"),
    (OutOfReach, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (Refused, 409, "conflict"),
    (InputConflict, 409, "input_conflict"),
    (BadInput, 400, "bad_request"),
    (UsageError, 400, "bad_request"),
    (DatabaseLocked, 503, "store_busy"),
    (DatabaseUnreachable, 503, "store_unreachable"),
    (DatabaseFull, 503, "store_full"),
    (DatabaseIOError, 503, "store_io"),
    (ChromaUnreachable, 503, "chroma_unreachable"),
)
MAX_MESSAGE = 500
# a request body's bound: an input's text is at most 256 KiB of UTF-8 (`sessions.MAX_TEXT_BYTES`), and
# JSON may spell a character in up to 6 bytes (`\uXXXX`); anything larger is refused before it is read
MAX_BODY_BYTES = 1536 * 1024
TOO_LARGE = (
    f"the request body is over the API's {MAX_BODY_BYTES} byte bound; an input's text is at most "
    "256 KiB of UTF-8: send a shorter one, or split it into several inputs"
)


class ApiError(Exception):
    """An error the API answers with `status` and `code` (auth, scope, size, method...)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.headers, self.extra = status, code, headers or {}, extra or {}


def body(code: str, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one error shape; the message one line, inert, bounded (`extra`: fields a code documents)."""
    line = visible(" ".join(message.split()))[:MAX_MESSAGE]
    return {"error": {"code": code, "message": line, **(extra or {})}}


def respond(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    return JSONResponse(body(code, message, extra), status_code=status, headers=headers)


def rem_status(exc: RemError) -> tuple[int, str]:
    """The status and code of one of rem's errors (500 `internal` for one with no mapping)."""
    for kind, status, code in STATUS:
        if isinstance(exc, kind):
            return status, code
    return 500, "internal"


def answer(exc: ApiError | RemError) -> JSONResponse:
    """The one-shape answer to an `ApiError` or one of rem's errors (an unmapped one is logged)."""
    if isinstance(exc, ApiError):
        return respond(exc.status, exc.code, str(exc), exc.headers, exc.extra)
    status, code = rem_status(exc)
    if status == 500:
        log.error("unmapped rem error: %r", exc)
    return respond(status, code, str(exc))


def internal(exc: BaseException) -> JSONResponse:
    """The 500 for anything unexpected: the traceback to the server's log, one line to the client."""
    log.exception("internal error answering a request", exc_info=exc)
    return respond(500, "internal", "internal error; the server's log has the details")


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON; send one JSON object (Content-Type: application/json)"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "the request"
    return f"{where}: {first.get('msg', 'is not valid')}; see /v1/openapi.json for the request's shape"


def _http_error(request: Request, exc: StarletteHTTPException) -> tuple[str, str]:
    """The code and one-line message of an error Starlette raised itself (routing, body size)."""
    status = exc.status_code
    if status == 404:
        return "not_found", f"no route {request.url.path[:200]!r}; see /v1/openapi.json for the API's routes"
    if status == 405:
        return "method_not_allowed", f"{request.method} is not allowed on {request.url.path[:200]!r}"
    if status == 413:
        return "payload_too_large", TOO_LARGE
    return "http_error", str(exc.detail)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    async def known_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError | RemError)
        return answer(exc)

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(400, "bad_request", _validation_message(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code, message = _http_error(request, exc)
        return respond(exc.status_code, code, message, dict(exc.headers or {}))

    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return internal(exc)

    app.add_exception_handler(ApiError, known_error)
    app.add_exception_handler(RemError, known_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
