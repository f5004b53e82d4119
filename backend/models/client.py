"""Chat requests to an OpenAI-compatible endpoint through the official `openai` SDK.

The SDK builds and sends each request (auth, headers, status errors); rem
adds what an always-on runtime needs around it:

* its own bounded retries (the SDK's are off), so every attempt is counted
  and recorded: 429 honours `Retry-After`/`retry-after-ms`, other transient
  failures back off exponentially with jitter (`retry_wait`);
* a per-process cap on requests in flight (`REM_MODEL_CONCURRENCY`);
* streamed replies read as raw SSE lines and decoded with `json.loads`. The
  SDK's own chunk objects cost ~400 µs of CPU per chunk (pydantic models),
  so one process could not keep up with 200 streams at 50 tokens/s; the
  raw lines cost ~50 µs (benchmarks/streaming.py). The transport is the
  SDK's aiohttp one, ~2.5x cheaper per read than its default httpx2.

A stream that breaks before any text arrived is retried like any request; one
that breaks after raises `StreamInterrupted` so the caller can keep what
arrived and re-ask (the executor does).

Bounded reads: a reply is read up to `max_chars` characters of text (the
callers pass `REM_MODEL_REPLY_MAX_CHARS` or `REM_SUMMARY_REPLY_MAX_CHARS`),
and no line or body longer than `reply_bytes_limit(max_chars)` is ever held.
A stream that reaches the bound stops being read (the connection is closed)
and ends with `finish_reason = "truncated"`; a whole completion over it is
refused.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import httpx2
import openai

from backend.core.settings import settings
from backend.core.storable import UNSTORABLE_ESCAPE, storable
from backend.models import health
from backend.models.classify import classify
from backend.models.config import ModelConfig
from backend.models.errors import TRUNCATED, ModelError, ModelErrorClass, StreamInterrupted
from backend.models.health import CallKind, CallRecord
from backend.models.tool_deltas import ToolCallAssembler
from backend.models.usage import Usage

Message = dict[str, Any]
# room for JSON's longest escape of a BMP character (\\uXXXX: 6 bytes); a reply of astral
# characters escaped as surrogate pairs (12 bytes each) is cut at two thirds of its bound
BYTES_PER_CHAR = 8
LINE_SLACK_BYTES = 65_536


def reply_bytes_limit(max_chars: int) -> int:
    """The longest SSE line, or whole completion body, read for a reply of at most `max_chars` characters."""
    return BYTES_PER_CHAR * max_chars + LINE_SLACK_BYTES


class LineTooLong(Exception):
    """A stream line longer than the bound (`bounded_lines`)."""


async def bounded_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[str]:
    """The lines of a byte stream (ending in \\n, \\r\\n or \\r), raising `LineTooLong` past `limit` bytes."""
    pending: list[bytes] = []  # the start of a line that has not ended yet
    size = 0
    async for chunk in chunks:
        if pending and b"\n" not in chunk and b"\r" not in chunk:
            pending.append(chunk)
            size += len(chunk)
        else:
            buffer = b"".join((*pending, chunk))
            pos = 0
            while (cut := _line_end(buffer, pos)) is not None:
                yield buffer[pos : cut[0]].decode("utf-8", "replace")
                pos = cut[1]
            pending = [buffer[pos:]] if pos < len(buffer) else []
            size = len(buffer) - pos
        if size > limit:
            raise LineTooLong(f"a line of more than {limit} bytes")
    if pending:
        yield b"".join(pending).removesuffix(b"\r").decode("utf-8", "replace")


def _line_end(buffer: bytes, pos: int) -> tuple[int, int] | None:
    """Where the line starting at `pos` ends and the next begins; None while it may go on."""
    newline = buffer.find(b"\n", pos)
    ret = buffer.find(b"\r", pos, len(buffer) if newline == -1 else newline)
    if ret == -1:
        return None if newline == -1 else (newline, newline + 1)
    if ret + 1 == len(buffer):
        return None  # a \r at the end: the next chunk may start with its \n
    return (ret, ret + 2) if buffer[ret + 1] == 0x0A else (ret, ret + 1)


async def read_bounded(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """A whole body of at most `limit` bytes, or None when it is longer (reading stops there)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


@dataclass
class ChatReply:
    """What a request learned besides the text: usage, finish reason, attempts."""

    model: str
    usage: Usage | None = None
    raw_usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    attempts: int = 0
    retries: int = 0
    ttft_ms: float | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    # the reply reached its bound: the rest was never read (`finish_reason` is "truncated")
    truncated: bool = False
    # the tool calls the reply asked for (streamed `tool_calls` deltas, assembled and bounded)
    tool_calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    # characters no store can hold (NUL, lone surrogates) replaced by U+FFFD in what the endpoint sent
    unstorable: int = 0


def retry_wait(config: ModelConfig, error: ModelError, attempt: int) -> float | None:
    """Seconds to wait before retrying after attempt number `attempt`, or None: give up."""
    if not error.retryable or attempt > config.retries:
        return None
    if error.retry_after_s is not None:
        return error.retry_after_s if error.retry_after_s <= config.retry_max_s else None
    backoff = min(0.5 * 2.0 ** (attempt - 1), 8.0) * (1 - 0.25 * random.random())
    return min(backoff, config.retry_max_s)


def final_error(config: ModelConfig, error: ModelError, attempt: int) -> ModelError:
    """The error that ends a request, saying why rem stopped retrying."""
    if not error.retryable:
        return error
    if error.retry_after_s is not None and error.retry_after_s > config.retry_max_s:
        why = f"the endpoint asks to wait {error.retry_after_s:.0f} s, over REM_MODEL_RETRY_MAX_MS"
    else:
        why = f"gave up after {attempt} attempts"
    return ModelError(error.error_class, f"{error} ({why})", status=error.status)


class SSEDecoder:
    """Server-sent events, line by line: returns an event's data when a blank line ends it."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
            self._data = []
            return data
        if line.startswith("data:"):
            self._data.append(line[6:] if line.startswith("data: ") else line[5:])
        return None  # comments (`:`), `event:`, `id:`, `retry:` carry nothing rem uses


class ModelClient:
    """Requests to one endpoint, for one kind of work (`chat`, `synthesis`)."""

    def __init__(self, config: ModelConfig | None = None, *, kind: CallKind = CallKind.CHAT) -> None:
        self.config = config or ModelConfig.from_settings()
        self.kind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._slots: asyncio.Semaphore | None = None

    def _bound(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        """The SDK client and the request cap of the running loop (both are bound to one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._slots is None:
            c = self.config
            timeout = openai.Timeout(
                c.request_timeout_s,
                connect=c.connect_timeout_s,
                read=c.read_timeout_s,
                pool=c.request_timeout_s,
            )
            limits = httpx2.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency)
            http = openai.DefaultAioHttpClient(timeout=timeout, limits=limits)
            self._client = openai.AsyncOpenAI(
                base_url=c.base_url, api_key=c.api_key, max_retries=0, timeout=timeout, http_client=http
            )
            self._slots = asyncio.Semaphore(c.concurrency)
            self._loop = loop
        return self._client, self._slots

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = None
        self._loop = None

    def _call(self, model: str, attempt: int, session_id: str | None) -> CallRecord:
        return CallRecord(self.kind, self.config.endpoint, model, attempt, session_id=session_id)

    def _failed(self, call: CallRecord, exc: BaseException, mid_stream: bool, started: float) -> ModelError:
        error = classify(exc, mid_stream=mid_stream)
        if mid_stream and not error.interrupted:  # e.g. an error event after some text
            error = StreamInterrupted(
                ModelErrorClass.STREAM_DROPPED, f"the stream ended with an error: {error}"
            )
        elif mid_stream:
            error = StreamInterrupted(error.error_class, str(error), status=error.status)
        message = self.config.scrub(str(error))
        call.outcome, call.status, call.error = error.error_class, error.status, message[:500]
        call.duration_ms = (time.perf_counter() - started) * 1000
        if error.retry_after_s is not None:
            call.retry_after_ms = int(error.retry_after_s * 1000)
        health.record(call)
        if message != str(error):
            error = type(error)(
                error.error_class, message, status=error.status, retry_after_s=error.retry_after_s
            )
        return error

    def _succeeded(self, call: CallRecord, reply: ChatReply, started: float) -> None:
        call.duration_ms = (time.perf_counter() - started) * 1000
        call.ttft_ms = reply.ttft_ms
        if reply.raw_usage:
            call.tokens_in = reply.raw_usage.get("prompt_tokens")
            call.tokens_out = reply.raw_usage.get("completion_tokens")
        health.record(call)

    # -- streamed chat ------------------------------------------------------------
    async def stream_chat(
        self,
        messages: list[Message],
        *,
        reply: ChatReply,
        session_id: str | None = None,
        max_chars: int | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[str]:
        """Yield the reply's text deltas; `reply` gets usage, finish reason and tool calls at the end.

        `tools` (Chat Completions function tools) are offered with the request;
        the calls the model asks for are assembled in `reply.tool_calls`.

        Retries (bounded, counted) anything that fails before the first delta;
        raises `StreamInterrupted` for a stream that breaks after it, and the
        final `ModelError` when retrying is over. At `max_chars` characters
        (default `REM_MODEL_REPLY_MAX_CHARS`) it stops reading: the reply is
        `truncated`.
        """
        limit = settings.model_reply_max_chars if max_chars is None else max_chars
        client, slots = self._bound()
        body = {
            "model": reply.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        attempt = 0
        while True:
            attempt += 1
            reply.attempts = attempt
            reply.tool_calls = ToolCallAssembler()  # a retried attempt starts its calls over
            reply.unstorable = 0
            call = self._call(reply.model, attempt, session_id)
            delivered = False
            started = time.perf_counter()
            try:
                async with slots:
                    started = time.perf_counter()
                    async for text in self._stream_once(client, body, reply, started, limit):
                        delivered = True
                        yield text
            except Exception as exc:  # every failure of the request, classified (cancellation passes)
                error = self._failed(call, exc, delivered, started)
                reply.errors.append(error.as_dict())
                if delivered:
                    raise error from None
                wait = retry_wait(self.config, error, attempt)
                if wait is None:
                    raise final_error(self.config, error, attempt) from None
                reply.retries += 1
                await asyncio.sleep(wait)
                continue
            self._succeeded(call, reply, started)
            return

    async def _stream_once(
        self, client: openai.AsyncOpenAI, body: dict[str, Any], reply: ChatReply, started: float, limit: int
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        done, left = False, limit
        async with client.chat.completions.with_streaming_response.create(**body) as response:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                # a server that ignored stream=True and answered with one completion
                text = await self._bounded_completion(response, reply, started, limit)
                if text:
                    yield text
                return
            decoder = SSEDecoder()
            try:
                async for line in bounded_lines(response.iter_bytes(), reply_bytes_limit(limit)):
                    data = decoder.feed(line)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    # only a line with a \u0000 or surrogate escape can decode to an unstorable character
                    suspect = UNSTORABLE_ESCAPE.search(data) is not None
                    text = self._chunk(json.loads(data), reply, started, suspect)
                    if len(text) >= left:
                        yield text[:left]
                        _truncate(reply)
                        return  # leaving the `async with` closes the connection: the rest is never read
                    left -= len(text)
                    if text:
                        yield text
                    if loop.time() > deadline:
                        raise TimeoutError("the reply took longer than REM_MODEL_REQUEST_TIMEOUT_MS")
            except LineTooLong:
                _truncate(reply)
                return
        if not done and reply.finish_reason is None:
            raise ModelError(ModelErrorClass.STREAM_TRUNCATED, "the stream ended before the reply finished")

    async def _bounded_completion(self, response: Any, reply: ChatReply, started: float, limit: int) -> str:
        """The text of a whole (not streamed) completion, refused when its body is over the bound."""
        body = await read_bounded(response.iter_bytes(), reply_bytes_limit(limit))
        if body is None:
            raise ModelError(
                ModelErrorClass.BAD_OUTPUT,
                f"the reply is longer than {reply_bytes_limit(limit)} bytes, the bound for {limit} characters; "
                "it was not read",
            )
        try:
            completion = json.loads(body)
        except ValueError:
            raise ModelError(
                ModelErrorClass.BAD_RESPONSE, f"the endpoint's answer is not a completion: {body[:200]!r}"
            ) from None
        text = self._whole_completion(completion, reply, started)
        if len(text) > limit:
            raise ModelError(
                ModelErrorClass.BAD_OUTPUT, f"the reply is {len(text)} characters, over the bound of {limit}"
            )
        return text

    def _chunk(self, chunk: Any, reply: ChatReply, started: float, suspect: bool = False) -> str:
        """The text of one streamed chunk; records usage, the finish reason and the tool calls it carries.

        `suspect`: the chunk may hold a character no store can hold (`backend.core.storable`: a
        NUL, a lone surrogate): written as it was, the step's transaction failed every time the
        turn was retried, until the recovery budget parked it. Each one is replaced by U+FFFD and counted
        (`reply.unstorable`); a tool call holding one is refused by the assembler instead.
        """
        if not isinstance(chunk, dict):
            raise json.JSONDecodeError("a chunk that is not a JSON object", str(chunk)[:80], 0)
        calls = _take_tool_calls(chunk, "delta")
        if calls is not None:
            reply.unstorable += reply.tool_calls.feed(calls)
        if suspect:
            chunk, replaced = storable(chunk)
            reply.unstorable += replaced
        if "error" in chunk:
            raise _stream_error(chunk["error"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            reply.raw_usage, reply.usage = usage, Usage.from_openai(usage)
        choices = chunk.get("choices")
        if not choices:
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            reply.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
        if not text or not isinstance(text, str):
            return ""
        if reply.ttft_ms is None:
            reply.ttft_ms = (time.perf_counter() - started) * 1000
        return text

    def _whole_completion(self, completion: Any, reply: ChatReply, started: float) -> str:
        if not isinstance(completion, dict) or not completion.get("choices"):
            raise ModelError(
                ModelErrorClass.BAD_RESPONSE, "the endpoint's answer is neither a stream nor a completion"
            )
        calls = _take_tool_calls(completion, "message")
        if isinstance(calls, list):
            reply.unstorable += reply.tool_calls.feed(
                [{"index": i, **c} for i, c in enumerate(calls) if isinstance(c, dict)]
            )
        completion, replaced = storable(completion)  # one object: walked whole (see `_chunk`)
        reply.unstorable += replaced
        choice = completion["choices"][0]
        usage = completion.get("usage")
        if isinstance(usage, dict):
            reply.raw_usage, reply.usage = usage, Usage.from_openai(usage)
        reply.finish_reason = choice.get("finish_reason") or "stop"
        reply.ttft_ms = (time.perf_counter() - started) * 1000
        message = choice.get("message") or {}
        return str(message.get("content") or "")

    # -- one whole reply ------------------------------------------------------------
    async def complete(
        self,
        messages: list[Message],
        *,
        reply: ChatReply,
        session_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        max_chars: int | None = None,
    ) -> str:
        """One non-streamed reply's text, with the same retries, cap and records.

        A body longer than the bound for `max_chars` characters (default
        `REM_MODEL_REPLY_MAX_CHARS`) is not read: a `bad_output` ModelError.
        """
        client, slots = self._bound()
        limit = settings.model_reply_max_chars if max_chars is None else max_chars
        attempt = 0
        while True:
            attempt += 1
            reply.attempts = attempt
            call = self._call(reply.model, attempt, session_id)
            started = time.perf_counter()
            try:
                async with slots:
                    started = time.perf_counter()
                    async with client.chat.completions.with_streaming_response.create(
                        model=reply.model, messages=cast(Any, messages), **dict(extra or {})
                    ) as response:
                        text = await self._bounded_completion(response, reply, started, limit)
            except Exception as exc:  # classified; cancellation passes
                error = self._failed(call, exc, False, started)
                reply.errors.append(error.as_dict())
                wait = retry_wait(self.config, error, attempt)
                if wait is None:
                    raise final_error(self.config, error, attempt) from None
                reply.retries += 1
                await asyncio.sleep(wait)
                continue
            self._succeeded(call, reply, started)
            return text


def _take_tool_calls(chunk: dict[str, Any], part: str) -> Any:
    """Take `choices[0].<part>.tool_calls` out of a chunk (`part`: `delta`, or a completion's
    `message`), for the assembler to read as it was sent; None when there are none."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    inner = choices[0].get(part)
    return inner.pop("tool_calls", None) if isinstance(inner, dict) else None


def _truncate(reply: ChatReply) -> None:
    reply.truncated = True
    reply.finish_reason = TRUNCATED


def _stream_error(error: Any) -> ModelError:
    """The error event an endpoint sent mid-stream, as a server error."""
    message = error.get("message") if isinstance(error, dict) else str(error)
    return ModelError(ModelErrorClass.SERVER_ERROR, f"error event in the stream: {message}")
