"""A scripted, local, OpenAI-compatible HTTP server for tests.

The server side uses only the standard library (an ``asyncio`` server with a
small HTTP/1.1 layer), so it can run:

* in-process, on a background thread::

      with FakeOpenAIServer() as server:
          server.push(rate_limited(times=2, retry_after=1))
          client = make_client(server.base_url)

* as a subprocess (the first stdout line is the ``base_url``, ending in ``/v1``)::

      python fake_openai.py --port 0 --script scenarios.json

  which :class:`FakeOpenAIProcess` wraps with the same control API, over the
  ``/_fake/*`` admin endpoints.

Endpoints: ``POST /v1/chat/completions`` (SSE streaming with
``stream_options.include_usage`` and non-streaming), ``POST /v1/embeddings``,
``GET /v1/models`` and ``GET /v1/models/{id}``.

Each request to a ``POST /v1/*`` endpoint takes a :class:`Scenario`: the one
named by the ``X-Fake-Scenario`` request header if any, else a route's (``add_route``:
the conversation's first user message holds its key), else the first queued
scenario whose ``path`` matches (each serves ``times`` requests), else the
default. Every API request is recorded as a :class:`RequestRecord`. The
misbehaviours a hostile model shows (lone surrogates, terminal escapes in tool
names, invented tools) are built in tests/hostile_model.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import http
import json
import math
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import openai

__all__ = [
    "FakeOpenAIProcess",
    "FakeOpenAIServer",
    "RequestRecord",
    "Scenario",
    "bad_api_key",
    "drop",
    "embedding_vector",
    "garbage",
    "make_client",
    "malformed",
    "rate_limited",
    "server_error",
    "stall",
    "tokenize",
    "unknown_model",
]

DEFAULT_REPLY = "Hello from the fake OpenAI server."
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "text-embedding-3-small")
DEFAULT_EMBEDDING_DIM = 64
MALFORMED_DATA = '{"id": "chatcmpl-broken", "choices": [{"delta": {"content": "oops'
SCENARIO_HEADER = "x-fake-scenario"
ADMIN_PREFIX = "/_fake"
_READ_LIMIT = 1 << 20
_WRITE_HIGH_WATER = 1 << 16
# Paced tokens are due on a shared grid of this many seconds, so that all streams
# with a token due in the same slot are served by one event-loop wakeup. Without
# it, 200 streams x 50 tok/s means up to 10,000 wakeups/s (costly on a small VM).
PACING_TICK = 0.002

Chunking = Literal["words", "chars"]
DropMode = Literal["fin", "rst"]
WaitState = Literal["received", "streaming", "finished"]


# --------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    """What the server does for one request. All fields are JSON-friendly.

    Fault fields count *content deltas* (tokens): ``drop_after=3`` sends the role
    chunk and three token chunks, then closes the socket.
    """

    name: str = "default"
    reply: str = DEFAULT_REPLY
    tokens_per_second: float | None = None  # None: send as fast as possible
    chunking: Chunking = "words"
    chunk_chars: int = 1  # characters per token when chunking == "chars"
    first_token_delay: float = 0.0  # seconds before the first chunk / the response
    status: int = 200
    times: int = 1  # how many requests a queued scenario serves
    retry_after: float | None = None  # sent as the Retry-After header
    error_message: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    stall_after: int | None = None  # tokens sent before the stall
    stall_seconds: float | None = None  # None: stall until the client goes away
    drop_after: int | None = None  # tokens sent before the socket is closed
    drop_mode: DropMode = "fin"  # "fin": close (incomplete chunked body); "rst": reset
    malformed_after: int | None = None  # tokens sent before an invalid JSON data: line
    malformed_data: str = MALFORMED_DATA
    body: str | None = None  # raw response body, replaces the normal response
    content_type: str = "application/json"  # content type of ``body``
    prompt_tokens: int | None = None  # None: estimated from the messages
    completion_tokens: int | None = None  # None: number of deltas
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    finish_reason: str | None = None  # None: "tool_calls" if tool_calls else "stop"
    tool_calls: list[dict[str, str]] = field(default_factory=list)  # {name, arguments[, id]}
    # the tool calls only while the request holds no tool result; once it does, `then_reply` alone
    # (a model that asks for tools, then answers): one scenario serves a whole tool-using turn
    calls_once: bool = False
    then_reply: str | None = None
    usage_extra: dict[str, Any] = field(default_factory=dict)  # merged into the usage object
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    path: str | None = None  # queued: only serve requests to this path

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown scenario fields: {sorted(unknown)}")
        return cls(**dict(data))


def rate_limited(times: int = 1, retry_after: float | None = 1.0, **kw: Any) -> Scenario:
    """429 ``times`` times, with a ``Retry-After`` header (seconds)."""
    return Scenario(name="rate_limited", status=429, times=times, retry_after=retry_after, **kw)


def server_error(status: int = 500, times: int = 1, **kw: Any) -> Scenario:
    """A 5xx (500, 502, 503, ...) ``times`` times."""
    return Scenario(name=f"server_error_{status}", status=status, times=times, **kw)


def bad_api_key(**kw: Any) -> Scenario:
    return Scenario(name="bad_api_key", status=401, **kw)


def unknown_model(**kw: Any) -> Scenario:
    return Scenario(name="unknown_model", status=404, **kw)


def stall(after: int, seconds: float | None = None, **kw: Any) -> Scenario:
    """Send ``after`` tokens, then nothing for ``seconds`` (None: until the client leaves)."""
    return Scenario(name="stall", stall_after=after, stall_seconds=seconds, **kw)


def drop(after: int, mode: DropMode = "fin", **kw: Any) -> Scenario:
    """Send ``after`` tokens, then close the socket abruptly."""
    return Scenario(name=f"drop_{mode}", drop_after=after, drop_mode=mode, **kw)


def malformed(after: int, data: str = MALFORMED_DATA, **kw: Any) -> Scenario:
    """Send ``after`` tokens, then a ``data:`` line that is not valid JSON."""
    return Scenario(name="malformed", malformed_after=after, malformed_data=data, **kw)


def garbage(
    body: str = "<html>upstream exploded</html>", content_type: str = "text/html", **kw: Any
) -> Scenario:
    """Answer with a body that is not a completion (e.g. not JSON at all)."""
    return Scenario(name="garbage", body=body, content_type=content_type, **kw)


@dataclass
class _Queued:
    scenario: Scenario
    remaining: int


class ScenarioBook:
    """Thread-safe queue of scenarios, plus named ones and a default."""

    def __init__(self, default: Scenario | None = None) -> None:
        self._lock = threading.Lock()
        self._default = default or Scenario()
        self._queue: list[_Queued] = []
        self._named: dict[str, Scenario] = {}
        self._routes: dict[str, Scenario] = {}

    def push(self, *scenarios: Scenario) -> None:
        with self._lock:
            self._queue.extend(_Queued(s, max(1, s.times)) for s in scenarios)

    def set_default(self, scenario: Scenario) -> None:
        with self._lock:
            self._default = scenario

    def add_named(self, name: str, scenario: Scenario) -> None:
        with self._lock:
            self._named[name] = scenario

    def add_route(self, key: str, scenario: Scenario) -> None:
        with self._lock:
            self._routes[key] = scenario

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()

    def pending(self) -> int:
        with self._lock:
            return sum(q.remaining for q in self._queue)

    def select(self, path: str, name: str | None, prompt: str = "") -> Scenario:
        """Pick the scenario for a request; raises KeyError for an unknown name. A route (`add_route`)
        whose key is in the conversation's first user message wins over the queue: one scenario
        per conversation, whatever order concurrent conversations' requests come in."""
        with self._lock:
            if name:
                return self._named[name]
            for key, routed in self._routes.items():
                if key in prompt:
                    return routed
            for queued in self._queue:
                if queued.scenario.path in (None, path):
                    queued.remaining -= 1
                    if queued.remaining <= 0:
                        self._queue.remove(queued)
                    return queued.scenario
            return self._default


# --------------------------------------------------------------------------- request log


@dataclass
class RequestRecord:
    """One API request as the server saw it, and how far its response got."""

    index: int
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or the raw text if it was not JSON
    received_at: float  # time.time()
    received_monotonic: float  # time.monotonic()
    scenario: str
    status: int | None = None
    stream: bool = False
    streaming_started_at: float | None = None  # monotonic; the first chunk was written
    tokens_sent: int = 0
    max_lag: float = 0.0  # seconds: worst delay of a paced token behind its schedule
    finished_at: float | None = None  # monotonic
    outcome: str = "pending"  # streaming|completed|dropped|stalled|client_disconnected|error|cancelled

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    @property
    def api_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        return cls(**dict(data))


def _reached(record: RequestRecord, state: WaitState, min_tokens: int) -> bool:
    if state == "received":
        return True
    if state == "finished":
        return record.finished_at is not None
    return record.streaming_started_at is not None and record.tokens_sent >= min_tokens


class RequestLog:
    """Records, shared between the server loop and test threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._records: list[RequestRecord] = []
        self._waiters = 0

    def add(self, **fields: Any) -> RequestRecord:
        with self._cond:
            record = RequestRecord(index=len(self._records), **fields)
            self._records.append(record)
            self._cond.notify_all()
            return record

    def update(self, record: RequestRecord, **changes: Any) -> None:
        with self._cond:
            for key, value in changes.items():
                setattr(record, key, value)
            self._cond.notify_all()

    def set_tokens(self, record: RequestRecord, tokens: int) -> None:
        """Hot path (once per token): lock and notify only while a thread waits."""
        record.tokens_sent = tokens
        if self._waiters:
            with self._cond:
                self._cond.notify_all()

    def get(self, index: int) -> RequestRecord | None:
        with self._cond:
            return self._records[index] if index < len(self._records) else None

    def snapshot(self) -> list[RequestRecord]:
        with self._cond:
            return [dataclasses.replace(r) for r in self._records]

    def clear(self) -> None:
        with self._cond:
            self._records.clear()

    def wait(self, index: int, state: WaitState, min_tokens: int, timeout: float) -> RequestRecord:
        """Block until request ``index`` reaches ``state``; raise TimeoutError otherwise."""

        def ready() -> bool:
            record = self._records[index] if index < len(self._records) else None
            return record is not None and _reached(record, state, min_tokens)

        with self._cond:
            self._waiters += 1
            try:
                if not self._cond.wait_for(ready, timeout):
                    raise TimeoutError(f"request {index} did not reach {state!r} within {timeout}s")
                return dataclasses.replace(self._records[index])
            finally:
                self._waiters -= 1


# --------------------------------------------------------------------------- payloads


_WORD_RE = re.compile(r"\s*\S+|\s+")


def tokenize(text: str, chunking: Chunking = "words", chunk_chars: int = 1) -> list[str]:
    """Split ``text`` into stream deltas; ``"".join(tokenize(text)) == text`` always."""
    if chunking == "chars":
        size = max(1, chunk_chars)
        return [text[i : i + size] for i in range(0, len(text), size)]
    return _WORD_RE.findall(text)


def estimate_tokens(value: Any) -> int:
    """A deterministic stand-in for a tokenizer: whitespace words, recursively."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(estimate_tokens(v) for v in value.values())
    if isinstance(value, list):
        return sum(estimate_tokens(v) for v in value)
    return 0


def prompt_token_count(body: Mapping[str, Any]) -> int:
    messages = body.get("messages") or []
    return sum(3 + estimate_tokens(m.get("content")) for m in messages if isinstance(m, dict))


def usage_payload(scenario: Scenario, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    prompt = scenario.prompt_tokens if scenario.prompt_tokens is not None else prompt_tokens
    completion = scenario.completion_tokens if scenario.completion_tokens is not None else completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": scenario.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": scenario.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    } | scenario.usage_extra


_DEFAULT_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: (
        "Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    403: ("You are not allowed to access this resource.", "invalid_request_error", None),
    404: (
        "The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    429: (
        "Rate limit reached for {model} on requests per min (RPM): Limit 3, Used 3, Requested 1.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "service_unavailable_error", None),
}


def error_payload(scenario: Scenario, model: str, api_key: str | None) -> dict[str, Any]:
    message, err_type, code = _DEFAULT_ERRORS.get(scenario.status, ("Error.", "server_error", None))
    redacted = f"{(api_key or '')[:3]}***" if api_key else "<none>"
    return {
        "error": {
            "message": (scenario.error_message or message).format(model=model, key=redacted),
            "type": scenario.error_type or err_type,
            "param": None,
            "code": scenario.error_code if scenario.error_code is not None else code,
        }
    }


def simple_error(message: str, err_type: str = "invalid_request_error", code: str | None = None) -> bytes:
    return _dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}})


def tool_call_payloads(scenario: Scenario, record_index: int) -> list[dict[str, Any]]:
    return [
        {
            "id": call.get("id") or f"call_fake_{record_index}_{i}",
            "type": "function",
            "function": {"name": call["name"], "arguments": call.get("arguments", "{}")},
        }
        for i, call in enumerate(scenario.tool_calls)
    ]


def tool_call_deltas(calls: list[dict[str, Any]], piece: int = 8) -> list[dict[str, Any]]:
    """OpenAI-style tool-call deltas: a header delta then the arguments in pieces."""
    deltas: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        args = call["function"]["arguments"]
        for start in range(0, len(args), piece):
            deltas.append(
                {"tool_calls": [{"index": i, "function": {"arguments": args[start : start + piece]}}]}
            )
    return deltas


def embedding_vector(text: str, dim: int) -> list[float]:
    """A unit vector derived from sha-shake of ``text``, rounded to float32."""
    raw = hashlib.shake_256(text.encode("utf-8")).digest(4 * dim)
    values = [x / 0xFFFFFFFF * 2.0 - 1.0 for x in struct.unpack(f"<{dim}I", raw)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    packed = struct.pack(f"<{dim}f", *(v / norm for v in values))
    return list(struct.unpack(f"<{dim}f", packed))


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) for v in value)


def _embedding_inputs(value: Any) -> list[str]:
    """Texts to embed; token arrays are embedded by their JSON text."""
    if isinstance(value, str):
        return [value]
    if _is_tokens(value):
        return [json.dumps(value)]
    if isinstance(value, list) and value and all(isinstance(v, str) or _is_tokens(v) for v in value):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    raise ValueError("'input' must be a string, a list of strings, or token arrays")


def embeddings_payload(body: Mapping[str, Any], default_dim: int) -> dict[str, Any]:
    inputs = _embedding_inputs(body.get("input"))
    dim = int(body.get("dimensions") or default_dim)
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(inputs):
        vector = embedding_vector(text, dim)
        encoded: Any = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode() if as_base64 else vector
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    tokens = sum(max(1, estimate_tokens(t)) for t in inputs)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage}


def model_payload(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 1700000000, "owned_by": "fake-openai"}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- HTTP layer


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class HttpRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise HttpError(400, "malformed request line") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method.upper(), target, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """Read one request; None when the client closed the connection cleanly."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431, "request head too large") from exc
    method, target, headers = _parse_head(head)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length") or 0))
    split = urllib.parse.urlsplit(target)
    query = dict(urllib.parse.parse_qsl(split.query))
    return HttpRequest(method, split.path, query, headers, body)


def response_head(status: int, headers: Mapping[str, str]) -> bytes:
    reason = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Connection:
    """One client connection: writes responses, detects a vanished client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.keep_alive = True

    async def send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        base = {"content-type": content_type, "content-length": str(len(body))}
        base["connection"] = "keep-alive" if self.keep_alive else "close"
        self.writer.write(response_head(status, {**base, **(headers or {})}) + body)
        await self.writer.drain()

    async def send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        await self.send(status, _dumps(payload), headers=headers)

    async def start_chunked(self, status: int, headers: Mapping[str, str]) -> None:
        base = {"transfer-encoding": "chunked", "connection": "keep-alive" if self.keep_alive else "close"}
        self.writer.write(response_head(status, {**base, **headers}))
        await self.writer.drain()

    def write_chunk_nowait(self, data: bytes) -> None:
        """Queue one HTTP chunk (the hot path: no coroutine, usually one send())."""
        transport = self.writer.transport
        if transport.is_closing():
            raise ConnectionResetError("client connection closed")
        transport.write(http_chunk(data))

    def needs_drain(self) -> bool:
        return self.writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER

    async def write_chunk(self, data: bytes) -> None:
        """Write one HTTP chunk; wait for the socket only when the buffer is large."""
        self.write_chunk_nowait(data)
        if self.needs_drain():
            await self.writer.drain()

    async def end_chunked(self) -> None:
        self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    async def abort(self, mode: DropMode) -> None:
        """Close mid-response: FIN without the final chunk, or RST (SO_LINGER 0)."""
        self.keep_alive = False
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        if mode == "rst":
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.writer.transport.abort()
        else:
            self.writer.close()

    async def wait_gone(self, seconds: float | None) -> bool:
        """Wait up to ``seconds`` (None: forever); True if the client disconnected."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                data = await asyncio.wait_for(self.reader.read(65536), remaining)
            except TimeoutError:
                return False
            except ConnectionError:
                return True
            if not data:
                return True


# --------------------------------------------------------------------------- chat stream


class ChatStream:
    """Writes one chat-completion SSE stream, with pre-encoded chunk templates."""

    def __init__(self, conn: Connection, chunk_id: str, model: str, include_usage: bool) -> None:
        self.conn = conn
        self.include_usage = include_usage
        self.base: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
        head = _dumps(self.base)[:-1]
        self._prefix = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
        tail = b',"usage":null' if include_usage else b""
        self._suffix = b'},"logprobs":null,"finish_reason":null}]' + tail + b"}\n\n"

    async def event(self, payload: Mapping[str, Any]) -> None:
        await self.conn.write_chunk(b"data: " + _dumps(payload) + b"\n\n")

    async def raw(self, data: str) -> None:
        await self.conn.write_chunk(f"data: {data}\n\n".encode())

    def content_nowait(self, text: str) -> None:
        self.conn.write_chunk_nowait(self._prefix + json.dumps(text).encode() + self._suffix)

    async def delta(self, delta: Mapping[str, Any], finish_reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        payload: dict[str, Any] = {**self.base, "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        await self.event(payload)

    async def usage(self, usage: Mapping[str, Any]) -> None:
        await self.event({**self.base, "choices": [], "usage": usage})

    async def done(self) -> None:
        await self.conn.write_chunk(b"data: [DONE]\n\n")
        await self.conn.end_chunked()


async def _sleep_until(deadline: float, tick: float = PACING_TICK) -> None:
    """Sleep until ``deadline`` rounded up to the shared ``tick`` grid."""
    if tick > 0:
        deadline = math.ceil(deadline / tick) * tick
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


# --------------------------------------------------------------------------- application


@dataclass
class ServerConfig:
    api_key: str | None = None  # if set, any other bearer key gets a 401
    models: Sequence[str] | None = None  # if set, other chat models get a 404
    embedding_dim: int = DEFAULT_EMBEDDING_DIM

    def listed_models(self) -> list[str]:
        return list(self.models) if self.models is not None else list(DEFAULT_MODELS)


Handler = Callable[[Connection, HttpRequest, RequestRecord, Scenario], Awaitable[None]]


class App:
    """The HTTP application; runs on one asyncio loop."""

    def __init__(self, book: ScenarioBook, log: RequestLog, config: ServerConfig) -> None:
        self.book = book
        self.log = log
        self.config = config
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._handlers: dict[str, Handler] = {
            "/v1/chat/completions": self._chat,
            "/v1/embeddings": self._embeddings,
        }

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._on_connect, host, port, limit=_READ_LIMIT, backlog=1024
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- connection loop

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(reader, writer)
        try:
            await self._serve_connection(conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Server shutdown. Returning (not re-raising) keeps asyncio's stream
            # callback from logging the cancelled task as an error.
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve_connection(self, conn: Connection) -> None:
        while conn.keep_alive:
            try:
                request = await read_request(conn.reader)
            except HttpError as exc:
                conn.keep_alive = False
                await conn.send(exc.status, simple_error(str(exc)))
                return
            if request is None:
                return
            conn.keep_alive = request.keep_alive
            await self._dispatch(conn, request)

    async def _dispatch(self, conn: Connection, request: HttpRequest) -> None:
        if request.path.startswith(ADMIN_PREFIX):
            await self._admin(conn, request)
            return
        record = self._record(request)
        try:
            await self._route(conn, request, record)
        except asyncio.CancelledError:
            self._finish(record, "cancelled")
            raise
        except ConnectionError:
            self._finish(record, "client_disconnected", force=True)
            raise

    def _record(self, request: HttpRequest) -> RequestRecord:
        try:
            body: Any = request.json()
        except ValueError:
            body = request.body.decode("utf-8", "replace")
        return self.log.add(
            method=request.method,
            path=request.path,
            headers=dict(request.headers),
            body=body,
            received_at=time.time(),
            received_monotonic=time.monotonic(),
            scenario="",
            stream=isinstance(body, dict) and bool(body.get("stream")),
        )

    def _finish(self, record: RequestRecord, outcome: str, *, force: bool = False) -> None:
        """Mark the record finished. Called *before* the last bytes leave, so a client
        that has seen the end of a response always finds its record finished."""
        if record.finished_at is None or force:
            self.log.update(record, finished_at=time.monotonic(), outcome=outcome)

    async def _reply(
        self, conn: Connection, record: RequestRecord, status: int, body: bytes, **kw: Any
    ) -> None:
        self.log.update(record, status=status)
        self._finish(record, "completed" if status < 400 else "error")
        await conn.send(status, body, **kw)

    async def _route(self, conn: Connection, request: HttpRequest, record: RequestRecord) -> None:
        if request.method == "GET" and request.path.startswith("/v1/models"):
            await self._models(conn, request, record)
            return
        handler = self._handlers.get(request.path)
        if handler is None or request.method != "POST":
            message = f"Invalid URL ({request.method} {request.path})"
            await self._reply(conn, record, 404, simple_error(message))
            return
        if not isinstance(record.body, dict):
            await self._reply(
                conn, record, 400, simple_error("We could not parse the JSON body of your request.")
            )
            return
        if await self._reject_auth_or_model(conn, request, record):
            return
        try:
            scenario = self.book.select(
                request.path, request.headers.get(SCENARIO_HEADER), _first_prompt(record.messages)
            )
        except KeyError:
            name = request.headers.get(SCENARIO_HEADER)
            await self._reply(conn, record, 400, simple_error(f"unknown fake scenario {name!r}"))
            return
        self.log.update(record, scenario=scenario.name)
        await self._run_scenario(conn, record, scenario, handler, request)

    async def _reject_auth_or_model(
        self, conn: Connection, request: HttpRequest, record: RequestRecord
    ) -> bool:
        model = str(record.body.get("model", ""))
        if self.config.api_key is not None and record.api_key != self.config.api_key:
            scenario = bad_api_key()
        elif (
            self.config.models is not None
            and request.path == "/v1/chat/completions"
            and model not in self.config.models
        ):
            scenario = unknown_model()
        else:
            return False
        self.log.update(record, scenario=f"config:{scenario.name}")
        await self._reply(
            conn, record, scenario.status, _dumps(error_payload(scenario, model, record.api_key))
        )
        return True

    async def _run_scenario(
        self,
        conn: Connection,
        record: RequestRecord,
        scenario: Scenario,
        handler: Handler,
        request: HttpRequest,
    ) -> None:
        if scenario.status >= 400:
            await self._send_error(conn, record, scenario)
        elif scenario.body is not None:
            await asyncio.sleep(scenario.first_token_delay)
            await self._reply(
                conn,
                record,
                scenario.status,
                scenario.body.encode(),
                content_type=scenario.content_type,
                headers=scenario.headers,
            )
        else:
            await handler(conn, request, record, scenario)

    async def _send_error(self, conn: Connection, record: RequestRecord, scenario: Scenario) -> None:
        await asyncio.sleep(scenario.first_token_delay)
        headers = {"x-request-id": f"req_fake_{record.index}", **scenario.headers}
        if scenario.retry_after is not None:
            value = scenario.retry_after
            headers["retry-after"] = str(int(value)) if float(value).is_integer() else str(value)
        model = str(record.body.get("model", "")) if isinstance(record.body, dict) else ""
        body = _dumps(error_payload(scenario, model, record.api_key))
        await self._reply(conn, record, scenario.status, body, headers=headers)

    # -- endpoints

    async def _models(self, conn: Connection, request: HttpRequest, record: RequestRecord) -> None:
        models = self.config.listed_models()
        wanted = request.path.removeprefix("/v1/models").strip("/")
        if not wanted:
            await self._reply(
                conn, record, 200, _dumps({"object": "list", "data": [model_payload(m) for m in models]})
            )
        elif wanted in models:
            await self._reply(conn, record, 200, _dumps(model_payload(wanted)))
        else:
            payload = error_payload(unknown_model(), wanted, record.api_key)
            await self._reply(conn, record, 404, _dumps(payload))

    async def _embeddings(
        self, conn: Connection, request: HttpRequest, record: RequestRecord, sc: Scenario
    ) -> None:
        try:
            payload = embeddings_payload(record.body, self.config.embedding_dim)
        except (ValueError, TypeError) as exc:
            await self._reply(conn, record, 400, simple_error(str(exc)))
            return
        await asyncio.sleep(sc.first_token_delay)
        await self._reply(conn, record, 200, _dumps(payload), headers=sc.headers)

    async def _chat(
        self, conn: Connection, request: HttpRequest, record: RequestRecord, sc: Scenario
    ) -> None:
        if sc.calls_once and any(m.get("role") == "tool" for m in record.messages if isinstance(m, dict)):
            sc = dataclasses.replace(sc, tool_calls=[], reply=sc.then_reply or sc.reply)
        if record.body.get("stream"):
            await self._stream_chat(conn, record, sc)
        else:
            await self._complete_chat(conn, record, sc)

    async def _complete_chat(self, conn: Connection, record: RequestRecord, sc: Scenario) -> None:
        await asyncio.sleep(sc.first_token_delay)
        if sc.stall_after is not None and await conn.wait_gone(sc.stall_seconds):
            self._finish(record, "client_disconnected")
            return
        if sc.drop_after is not None:
            self._finish(record, "dropped")
            await conn.abort(sc.drop_mode)
            return
        await self._reply(
            conn, record, 200, _dumps(self._completion(record, sc)), headers=self._headers(record, sc)
        )

    def _completion(self, record: RequestRecord, sc: Scenario) -> dict[str, Any]:
        calls = tool_call_payloads(sc, record.index)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": sc.reply if sc.reply or not calls else None,
        }
        message.update(refusal=None, annotations=[])
        if calls:
            message["tool_calls"] = calls
        completion_tokens = len(tokenize(sc.reply, sc.chunking, sc.chunk_chars)) + len(
            tool_call_deltas(calls)
        )
        return {
            "id": f"chatcmpl-fake{record.index:06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": record.body.get("model", DEFAULT_MODEL),
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(sc)}
            ],
            "usage": usage_payload(sc, prompt_token_count(record.body), completion_tokens),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    @staticmethod
    def _headers(record: RequestRecord, sc: Scenario) -> dict[str, str]:
        return {"x-request-id": f"req_fake_{record.index}", "openai-processing-ms": "1", **sc.headers}

    async def _stream_chat(self, conn: Connection, record: RequestRecord, sc: Scenario) -> None:
        options = record.body.get("stream_options") or {}
        stream = ChatStream(
            conn,
            f"chatcmpl-fake{record.index:06d}",
            str(record.body.get("model", DEFAULT_MODEL)),
            bool(options.get("include_usage")),
        )
        headers = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
        self.log.update(record, status=200)
        await conn.start_chunked(200, {**headers, **self._headers(record, sc)})
        await asyncio.sleep(sc.first_token_delay)
        self.log.update(record, streaming_started_at=time.monotonic(), outcome="streaming")
        await stream.delta({"role": "assistant", "content": "", "refusal": None})
        deltas: list[str | dict[str, Any]] = [*tokenize(sc.reply, sc.chunking, sc.chunk_chars)]
        deltas += tool_call_deltas(tool_call_payloads(sc, record.index))
        if await self._send_deltas(conn, stream, record, sc, deltas):
            await stream.delta({}, _finish_reason(sc))
            if stream.include_usage:
                await stream.usage(usage_payload(sc, prompt_token_count(record.body), len(deltas)))
            self._finish(record, "completed")
            await stream.done()

    async def _send_deltas(
        self,
        conn: Connection,
        stream: ChatStream,
        record: RequestRecord,
        sc: Scenario,
        deltas: list[str | dict[str, Any]],
    ) -> bool:
        """Send the paced deltas, applying faults; False if the stream ended early."""
        loop = asyncio.get_running_loop()
        interval = 1.0 / sc.tokens_per_second if sc.tokens_per_second else 0.0
        start = loop.time()
        for i in range(len(deltas) + 1):
            paused = await self._apply_faults(conn, stream, record, sc, i)
            if paused is None:
                return False
            start += paused
            if i == len(deltas):
                return True
            if interval:
                await _sleep_until(start + i * interval)
                lag = loop.time() - start - i * interval
                if lag > record.max_lag:
                    record.max_lag = lag
            item = deltas[i]
            self.log.set_tokens(record, i + 1)  # before the write: see _finish
            if isinstance(item, str):
                stream.content_nowait(item)
            else:
                await stream.delta(item)
            if conn.needs_drain():
                await conn.writer.drain()
        return True

    async def _apply_faults(
        self, conn: Connection, stream: ChatStream, record: RequestRecord, sc: Scenario, sent: int
    ) -> float | None:
        """Faults due after ``sent`` tokens: seconds paused, or None if the stream is over."""
        if sc.malformed_after == sent:
            await stream.raw(sc.malformed_data)
        if sc.drop_after == sent:
            self._finish(record, "dropped")
            await conn.abort(sc.drop_mode)
            return None
        if sc.stall_after != sent:
            return 0.0
        self.log.update(record, outcome="stalled")
        began = time.monotonic()
        if await conn.wait_gone(sc.stall_seconds):
            conn.keep_alive = False
            self._finish(record, "client_disconnected")
            return None
        self.log.update(record, outcome="streaming")
        return time.monotonic() - began

    # -- admin (not recorded)

    async def _admin(self, conn: Connection, request: HttpRequest) -> None:
        action = request.path.removeprefix(ADMIN_PREFIX).strip("/")
        try:
            status, payload = await self._admin_action(action, request)
        except (ValueError, TypeError, KeyError) as exc:
            status, payload = 400, {"error": str(exc)}
        await conn.send_json(status, payload)

    async def _admin_action(self, action: str, request: HttpRequest) -> tuple[int, Any]:
        body = request.json() if request.method in ("POST", "PUT") else {}
        if action == "queue":
            items = body if isinstance(body, list) else [body]
            self.book.push(*(Scenario.from_dict(s) for s in items))
            return 200, {"pending": self.book.pending()}
        if action == "default":
            self.book.set_default(Scenario.from_dict(body))
            return 200, {}
        if action == "named":
            self.book.add_named(body["name"], Scenario.from_dict(body["scenario"]))
            return 200, {}
        if action == "route":
            self.book.add_route(body["key"], Scenario.from_dict(body["scenario"]))
            return 200, {}
        if action == "reset":
            self.book.clear()
            self.log.clear()
            return 200, {}
        if action == "requests":
            return 200, [r.to_dict() for r in self.log.snapshot()]
        if action == "wait":
            return await self._admin_wait(request.query)
        return 404, {"error": f"unknown admin action {action!r}"}

    async def _admin_wait(self, query: Mapping[str, str]) -> tuple[int, Any]:
        index, state = int(query["index"]), query.get("state", "streaming")
        min_tokens, timeout = int(query.get("min_tokens", "0")), float(query.get("timeout", "10"))
        if state not in ("received", "streaming", "finished"):
            raise ValueError(f"bad state {state!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = self.log.get(index)
            if record is not None and _reached(record, state, min_tokens):  # type: ignore[arg-type]
                return 200, record.to_dict()
            if loop.time() >= deadline:
                return 408, {"error": f"request {index} did not reach {state!r} within {timeout}s"}
            await asyncio.sleep(0.002)


def _first_prompt(messages: list[dict[str, Any]]) -> str:
    """The text of a conversation's first user message ("" if none)."""
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def _finish_reason(sc: Scenario) -> str:
    return sc.finish_reason or ("tool_calls" if sc.tool_calls else "stop")


# --------------------------------------------------------------------------- in-process server


class FakeOpenAIServer:
    """The server on a background thread with its own event loop."""

    def __init__(
        self,
        default: Scenario | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        embedding_dim: int = DEFAULT_EMBEDDING_DIM,
    ) -> None:
        self.host = host
        self.book = ScenarioBook(default)
        self.log = RequestLog()
        self.app = App(self.book, self.log, ServerConfig(api_key, models, embedding_dim))
        self._requested_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.app.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> FakeOpenAIServer:
        ready: threading.Event = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, errors), name="fake-openai", daemon=True
        )
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self.app.start(self.host, self._requested_port))
        except BaseException as exc:
            errors.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.app.close())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting

    def push(self, *scenarios: Scenario) -> None:
        self.book.push(*scenarios)

    def set_default(self, scenario: Scenario) -> None:
        self.book.set_default(scenario)

    def add_named(self, name: str, scenario: Scenario) -> None:
        self.book.add_named(name, scenario)

    def add_route(self, key: str, scenario: Scenario) -> None:
        """Serve `scenario` to every request of a conversation whose first user message holds `key`."""
        self.book.add_route(key, scenario)

    def reset(self) -> None:
        self.book.clear()
        self.log.clear()

    # -- observing

    def requests(self) -> list[RequestRecord]:
        return self.log.snapshot()

    def wait_for(
        self, index: int, state: WaitState = "streaming", *, min_tokens: int = 0, timeout: float = 10.0
    ) -> RequestRecord:
        return self.log.wait(index, state, min_tokens, timeout)

    def wait_for_streaming(self, index: int, *, min_tokens: int = 1, timeout: float = 10.0) -> RequestRecord:
        """Block until request ``index`` has written its first chunk and ``min_tokens`` tokens."""
        return self.log.wait(index, "streaming", min_tokens, timeout)

    async def await_for(
        self, index: int, state: WaitState = "streaming", *, min_tokens: int = 0, timeout: float = 10.0
    ) -> RequestRecord:
        """``wait_for`` for asyncio tests (runs the wait in a worker thread)."""
        return await asyncio.to_thread(self.log.wait, index, state, min_tokens, timeout)


# --------------------------------------------------------------------------- subprocess server


class FakeOpenAIProcess:
    """``python fake_openai.py`` as a subprocess, controlled over ``/_fake/*``."""

    def __init__(
        self,
        script: Mapping[str, Any] | str | Path | None = None,
        *,
        args: Sequence[str] = (),
        startup_timeout: float = 15.0,
    ) -> None:
        self._script = script
        self._args = list(args)
        self._startup_timeout = startup_timeout
        self._tmp: Path | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    @property
    def url(self) -> str:
        return self.base_url.removesuffix("/v1")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> FakeOpenAIProcess:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--port", "0", *self._args]
        script = self._script_path()
        if script is not None:
            cmd += ["--script", str(script)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.base_url = self._read_first_line()
        return self

    def _script_path(self) -> Path | None:
        if self._script is None or isinstance(self._script, (str, Path)):
            return Path(self._script) if self._script is not None else None
        import tempfile

        fd, name = tempfile.mkstemp(prefix="fake_openai_", suffix=".json")
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(self._script, handle)
        self._tmp = Path(name)
        return self._tmp

    def _read_first_line(self) -> str:
        assert self.proc is not None
        assert self.proc.stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(self._startup_timeout)
        if not lines or not lines[0].startswith("http"):
            self.stop()
            raise RuntimeError(f"fake_openai subprocess did not print its URL (got {lines!r})")
        return lines[0].strip()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> FakeOpenAIProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(
        self,
        method: str,
        action: str,
        payload: Any = None,
        query: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> Any:
        url = f"{self.url}{ADMIN_PREFIX}/{action}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            url, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode()
            if exc.code == 408:
                raise TimeoutError(detail) from exc
            raise RuntimeError(f"admin {action} failed: {exc.code} {detail}") from exc

    def push(self, *scenarios: Scenario) -> None:
        self._call("POST", "queue", [s.to_dict() for s in scenarios])

    def set_default(self, scenario: Scenario) -> None:
        self._call("PUT", "default", scenario.to_dict())

    def add_named(self, name: str, scenario: Scenario) -> None:
        self._call("POST", "named", {"name": name, "scenario": scenario.to_dict()})

    def add_route(self, key: str, scenario: Scenario) -> None:
        self._call("POST", "route", {"key": key, "scenario": scenario.to_dict()})

    def reset(self) -> None:
        self._call("POST", "reset", {})

    def requests(self) -> list[RequestRecord]:
        return [RequestRecord.from_dict(r) for r in self._call("GET", "requests")]

    def wait_for(
        self, index: int, state: WaitState = "streaming", *, min_tokens: int = 0, timeout: float = 10.0
    ) -> RequestRecord:
        query = {"index": index, "state": state, "min_tokens": min_tokens, "timeout": timeout}
        return RequestRecord.from_dict(self._call("GET", "wait", query=query, timeout=timeout + 10))

    def wait_for_streaming(self, index: int, *, min_tokens: int = 1, timeout: float = 10.0) -> RequestRecord:
        return self.wait_for(index, "streaming", min_tokens=min_tokens, timeout=timeout)

    async def await_for(
        self, index: int, state: WaitState = "streaming", *, min_tokens: int = 0, timeout: float = 10.0
    ) -> RequestRecord:
        return await asyncio.to_thread(self.wait_for, index, state, min_tokens=min_tokens, timeout=timeout)


# --------------------------------------------------------------------------- client helper


def make_client(
    base_url: str,
    *,
    api_key: str = "sk-fake-test",
    max_retries: int = 0,
    timeout: float = 10.0,
    read_timeout: float | None = None,
    **kwargs: Any,
) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` for the fake server; ``read_timeout`` caps the gap between reads."""
    import openai

    limit: float | openai.Timeout = (
        timeout if read_timeout is None else openai.Timeout(timeout, read=read_timeout)
    )
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=limit, **kwargs
    )


# --------------------------------------------------------------------------- command line


def load_script(path: str | Path) -> tuple[ScenarioBook, ServerConfig]:
    """Script file (JSON): {"default": {...}, "queue": [...], "named": {name: {...}}, "routes": {key: {...}},
    "api_key": str, "models": [...], "embedding_dim": int}."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    book = ScenarioBook(Scenario.from_dict(data["default"]) if "default" in data else None)
    book.push(*(Scenario.from_dict(s) for s in data.get("queue", [])))
    for name, scenario in data.get("named", {}).items():
        book.add_named(name, Scenario.from_dict(scenario))
    for key, scenario in data.get("routes", {}).items():
        book.add_route(key, Scenario.from_dict(scenario))
    config = ServerConfig(
        data.get("api_key"), data.get("models"), int(data.get("embedding_dim", DEFAULT_EMBEDDING_DIM))
    )
    return book, config


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Scripted local OpenAI-compatible server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file with default/queue/named scenarios and config")
    parser.add_argument("--api-key", help="require this bearer key (overrides the script)")
    parser.add_argument(
        "--embedding-dim", type=int, help="default embedding dimension (overrides the script)"
    )
    return parser.parse_args(argv)


async def _serve(app: App, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = await app.start(host, port)
    print(f"http://{host}:{bound}/v1", flush=True)
    await stop.wait()
    await app.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    book, config = load_script(args.script) if args.script else (ScenarioBook(), ServerConfig())
    if args.api_key:
        config.api_key = args.api_key
    if args.embedding_dim:
        config.embedding_dim = args.embedding_dim
    asyncio.run(_serve(App(book, RequestLog(), config), args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
