"""The streamable HTTP transport's HTTP client, bounded: the SDK's transport over an `httpx2` client of rem's.

The SDK's `streamable_http_client` caps one server-sent event
(`max_sse_event_size`, which rem sets to the message bound) but reads a plain
JSON response whole. rem passes it an `httpx2.AsyncClient` whose transport
(`BoundedTransport`):

* counts the bytes of every non-event-stream response and fails it past the
  bound with `ResponseTooLarge` (an `httpx2.StreamError`, which the SDK turns
  into an error answer for that request: the caller gets a tool error, and
  rem never holds more than the bound);
* records the idempotency key of a `tools/call` whose connection could not
  even be opened (`httpx2.ConnectError`): that request provably never reached
  the server, so the call is "unavailable", not "outcome unknown";
* records the key of a `tools/call` answered 404 for rem's session id: the
  server forgot the session (it restarted, or expired it), and the spec says
  it then refuses the request, so rem starts a new session and sends it again.

The configured `headers` go with every request. The SDK follows redirects only
within the endpoint's origin.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import httpx2

from backend.tools.lines import OVERSIZE_KEY
from backend.tools.spec import KEY_META

SESSION_HEADER = "mcp-session-id"
CONNECT_TIMEOUT_S = 10.0
STREAM_READ_TIMEOUT_S = 300.0  # the server may hold its event stream open between events


@dataclass
class HttpState:
    """What the HTTP client learned about tool calls that the SDK does not report, by idempotency key."""

    unsent: set[str] = field(default_factory=set)  # the connection could not be opened
    session_gone: set[str] = field(default_factory=set)  # answered 404 for rem's session id


class ResponseTooLarge(httpx2.StreamError):
    """A JSON response over the message bound (its bytes were not kept)."""


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, max_bytes: int) -> None:
        self.inner = inner
        self.max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self.inner:
            total += len(chunk)
            if total > self.max_bytes:
                raise ResponseTooLarge(
                    f"the tool server's answer is over {self.max_bytes} bytes; rem discarded it ({OVERSIZE_KEY})"
                )
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """An HTTP transport that caps plain responses and remembers tool calls that never left."""

    def __init__(self, max_bytes: int, state: HttpState) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.max_bytes = max_bytes
        self.state = state

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self.inner.handle_async_request(request)
        except httpx2.ConnectError:
            _remember(self.state.unsent, request)
            raise
        if response.status_code == 404 and SESSION_HEADER in request.headers:
            _remember(self.state.session_gone, request)
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return response  # the SDK caps each event
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self.max_bytes),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _remember(keys: set[str], request: httpx2.Request) -> None:
    key = _call_key(request)
    if key is not None:
        keys.add(key)


def _call_key(request: httpx2.Request) -> str | None:
    """The idempotency key of a `tools/call` request body, if that is what it is."""
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    if not isinstance(body, dict) or body.get("method") != "tools/call":
        return None
    meta = (body.get("params") or {}).get("_meta") or {}
    key = meta.get(KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


def bounded_client(headers: Mapping[str, str], max_bytes: int, state: HttpState) -> httpx2.AsyncClient:
    """The `httpx2.AsyncClient` rem gives the SDK's streamable HTTP transport for one server."""
    return httpx2.AsyncClient(
        headers=dict(headers),
        timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
        transport=BoundedTransport(max_bytes, state),
        follow_redirects=False,
    )
