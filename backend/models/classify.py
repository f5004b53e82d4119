"""Turning what the `openai` SDK (and the transport under it) raises into a `ModelError`.

Kept apart from `errors` so that code which only handles model errors (the
executor, the summarizer) never imports the SDK: importing `openai` costs
seconds, and the offline defaults must not pay it.
"""

from __future__ import annotations

import json

import httpx2
import openai

from backend.models.errors import RETRY_STATUS, ModelError, ModelErrorClass, retry_after_seconds


def _status_class(status: int, code: str | None) -> ModelErrorClass:
    if status == 429:
        return ModelErrorClass.QUOTA if code == "insufficient_quota" else ModelErrorClass.RATE_LIMITED
    if status in (401, 403):
        return ModelErrorClass.AUTH
    if status == 404:
        return ModelErrorClass.NOT_FOUND
    return ModelErrorClass.SERVER_ERROR if status in RETRY_STATUS else ModelErrorClass.BAD_REQUEST


def _status_error(exc: openai.APIStatusError) -> ModelError:
    code = exc.code if isinstance(exc.code, str) else None
    error_class = _status_class(exc.status_code, code)
    detail = exc.body.get("message") if isinstance(exc.body, dict) else None
    text = f"HTTP {exc.status_code}" + (f" {code}" if code else "") + f": {detail or exc.message}"
    return ModelError(
        error_class, text, status=exc.status_code, retry_after_s=retry_after_seconds(exc.response.headers)
    )


def classify(exc: BaseException, *, mid_stream: bool) -> ModelError:
    """The `ModelError` for anything a request raised; `mid_stream` once reply text has arrived."""
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc)
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return ModelError(
            ModelErrorClass.STREAM_MALFORMED if mid_stream else ModelErrorClass.BAD_RESPONSE,
            f"unparseable data from the endpoint: {exc}",
        )
    return _transport_error(exc, mid_stream)


def _transport_error(exc: BaseException, mid_stream: bool) -> ModelError:
    """The `ModelError` for a failure to reach, or keep hearing from, the endpoint."""
    # the aiohttp transport reports a refused connection as a connect *timeout*: trust the root cause
    root = _root(exc)
    refused = isinstance(root, OSError) and not isinstance(root, TimeoutError)
    timeout = not refused and isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException | TimeoutError)
    if mid_stream:
        if timeout:
            return ModelError(
                ModelErrorClass.STREAM_STALLED, "the stream went silent for longer than the read timeout"
            )
        return ModelError(ModelErrorClass.STREAM_DROPPED, f"the connection broke mid-stream ({_cause(exc)})")
    if timeout:
        return ModelError(ModelErrorClass.TIMEOUT, f"no answer within the timeout ({_cause(exc)})")
    if isinstance(exc, openai.APIConnectionError | httpx2.TransportError | OSError):
        return ModelError(ModelErrorClass.CONNECTION, f"cannot reach the endpoint ({_cause(exc)})")
    if isinstance(exc, openai.APIResponseValidationError | openai.APIError):
        return ModelError(ModelErrorClass.BAD_RESPONSE, f"the endpoint's answer is not a completion: {exc}")
    return ModelError(ModelErrorClass.BAD_RESPONSE, f"{type(exc).__name__}: {exc}")


def _root(exc: BaseException) -> BaseException:
    inner = exc
    for _ in range(10):
        if inner.__cause__ is None:
            break
        inner = inner.__cause__
    return inner


def _cause(exc: BaseException) -> str:
    """The innermost cause's name and message, on one line: `ConnectionRefusedError: ...`."""
    inner = _root(exc)
    text = " ".join((str(inner) or type(inner).__name__).split())
    return f"{type(inner).__name__}: {text}"[:300]
