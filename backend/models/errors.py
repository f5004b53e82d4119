"""Every way a model request fails, as one `ModelError` with a class and what rem does about it.

Observed with the `openai` SDK 3.57 against a scripted server (the table is
in tests/fake_openai.py's notes): a status error is raised when the request
is made, even when streaming; a dropped connection or a silence longer than
the read timeout surfaces while reading the stream as an `httpx2` transport
error; a malformed SSE line is a `json.JSONDecodeError` (rem parses the
lines itself); a body that is not a stream is caught by its content type.

| class | when | rem does |
|---|---|---|
| rate_limited | 429 | retry, waiting `Retry-After` |
| server_error | 5xx, 408, 409, an error event in a stream | retry with backoff |
| connection | refused, reset before an answer | retry with backoff |
| timeout | no answer within the timeouts | retry with backoff |
| bad_response | an answer that is not a completion | retry with backoff |
| stream_dropped, stream_stalled, stream_malformed, stream_truncated | a stream broken after text arrived | re-ask with the partial text, marked interrupted |
| auth, not_found, quota | 401/403, unknown model, out of quota | fail the turn, hold the session for an operator |
| bad_request | another 4xx | fail the turn |
| bad_output | a synthesizer reply that is not the JSON asked for | fail the job (attempts counted) |
"""

from __future__ import annotations

import email.utils
import math
import time
from enum import StrEnum
from typing import Any

from backend.core.errors import RemError


class ModelErrorClass(StrEnum):
    """The class of a failed model request (the table above); journaled and counted by it."""

    RATE_LIMITED = "rate_limited"
    SERVER_ERROR = "server_error"
    CONNECTION = "connection"
    TIMEOUT = "timeout"
    BAD_RESPONSE = "bad_response"
    STREAM_DROPPED = "stream_dropped"
    STREAM_STALLED = "stream_stalled"
    STREAM_MALFORMED = "stream_malformed"
    STREAM_TRUNCATED = "stream_truncated"
    AUTH = "auth"
    NOT_FOUND = "not_found"
    QUOTA = "quota"
    BAD_REQUEST = "bad_request"
    BAD_OUTPUT = "bad_output"


E = ModelErrorClass
# the finish reason of a reply that reached its size bound: not an error, the reply completes with
# what arrived up to the bound (REM_MODEL_REPLY_MAX_CHARS) and the rest is never read
TRUNCATED = "truncated"
RETRYABLE = frozenset({E.RATE_LIMITED, E.SERVER_ERROR, E.CONNECTION, E.TIMEOUT, E.BAD_RESPONSE})
INTERRUPTED = frozenset({E.STREAM_DROPPED, E.STREAM_STALLED, E.STREAM_MALFORMED, E.STREAM_TRUNCATED})
# configuration problems: every request fails the same way until an operator acts
NEEDS_OPERATOR = frozenset({E.AUTH, E.NOT_FOUND, E.QUOTA})
RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class ModelError(RemError):
    """A failed model request: its class, HTTP status, and the server's `Retry-After` if any."""

    def __init__(
        self,
        error_class: ModelErrorClass,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        return self.error_class in RETRYABLE

    @property
    def interrupted(self) -> bool:
        return self.error_class in INTERRUPTED

    @property
    def needs_operator(self) -> bool:
        return self.error_class in NEEDS_OPERATOR

    def as_dict(self) -> dict[str, Any]:
        """What the journal and the transcript record (never a key: messages are scrubbed)."""
        return {"class": self.error_class, "status": self.status, "message": str(self)[:500]}


class StreamInterrupted(ModelError):
    """A stream that broke after some of the reply arrived: the turn re-asks with that partial text."""


def retry_after_seconds(headers: Any) -> float | None:
    """The server-directed delay: `retry-after-ms`, else `retry-after` (seconds or an HTTP date)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            parsed = email.utils.parsedate_tz(value)
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None
