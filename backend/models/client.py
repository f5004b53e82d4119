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
from openai.types.chat import ChatCompletion

from backend.models import health
from backend.models.classify import classify
from backend.models.config import ModelConfig
from backend.models.errors import ModelError, ModelErrorClass, StreamInterrupted
from backend.models.health import CallKind, CallRecord
from backend.models.usage import Usage

Message = dict[str, str]


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
        self, messages: list[Message], *, reply: ChatReply, session_id: str | None = None
    ) -> AsyncIterator[str]:
        """Yield the reply's text deltas; `reply` gets usage and finish reason at the end.

        Retries (bounded, counted) anything that fails before the first delta;
        raises `StreamInterrupted` for a stream that breaks after it, and the
        final `ModelError` when retrying is over.
        """
        client, slots = self._bound()
        body = {
            "model": reply.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        attempt = 0
        while True:
            attempt += 1
            reply.attempts = attempt
            call = self._call(reply.model, attempt, session_id)
            delivered = False
            started = time.perf_counter()
            try:
                async with slots:
                    started = time.perf_counter()
                    async for text in self._stream_once(client, body, reply, started):
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
        self, client: openai.AsyncOpenAI, body: dict[str, Any], reply: ChatReply, started: float
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        done = False
        async with client.chat.completions.with_streaming_response.create(**body) as response:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                # a server that ignored stream=True and answered with one completion
                text = self._whole_completion(json.loads(await response.read()), reply, started)
                if text:
                    yield text
                return
            decoder = SSEDecoder()
            async for line in response.iter_lines():
                data = decoder.feed(line)
                if data is None:
                    continue
                if data == "[DONE]":
                    done = True
                    break
                text = self._chunk(json.loads(data), reply, started)
                if text:
                    yield text
                if loop.time() > deadline:
                    raise TimeoutError("the reply took longer than REM_MODEL_REQUEST_TIMEOUT_MS")
        if not done and reply.finish_reason is None:
            raise ModelError(ModelErrorClass.STREAM_TRUNCATED, "the stream ended before the reply finished")

    def _chunk(self, chunk: Any, reply: ChatReply, started: float) -> str:
        """The text of one streamed chunk; records usage and the finish reason it carries."""
        if not isinstance(chunk, dict):
            raise json.JSONDecodeError("a chunk that is not a JSON object", str(chunk)[:80], 0)
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise ModelError(ModelErrorClass.SERVER_ERROR, f"error event in the stream: {message}")
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
    ) -> str:
        """One non-streamed reply's text, with the same retries, cap and records."""
        client, slots = self._bound()
        attempt = 0
        while True:
            attempt += 1
            reply.attempts = attempt
            call = self._call(reply.model, attempt, session_id)
            started = time.perf_counter()
            try:
                async with slots:
                    started = time.perf_counter()
                    result = await client.chat.completions.create(
                        model=reply.model,
                        messages=cast(Any, messages),
                        **dict(extra or {}),
                    )
                text = self._completion_text(result, reply, started)
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

    def _completion_text(self, result: Any, reply: ChatReply, started: float) -> str:
        # a non-JSON body labelled text/html comes back as a str, not an exception
        if not isinstance(result, ChatCompletion) or not result.choices:
            raise ModelError(
                ModelErrorClass.BAD_RESPONSE,
                f"the endpoint's answer is not a completion: {str(result)[:200]!r}",
            )
        reply.ttft_ms = (time.perf_counter() - started) * 1000
        if result.usage is not None:
            raw = result.usage.model_dump(exclude_none=True)
            reply.raw_usage, reply.usage = raw, Usage.from_openai(raw)
        reply.finish_reason = result.choices[0].finish_reason
        return result.choices[0].message.content or ""
