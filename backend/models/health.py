"""One record per model request attempt, buffered in the process until a daemon writes it.

Every attempt (a first try or a retry, ok or failed) becomes a `CallRecord`:
what was asked of which endpoint, the outcome (`ok` or an error class from
`backend.models.errors`), the time to the first token of a streamed reply
and the tokens reported. Model code runs on the event loop and in threads
(the embedder), so the buffer is a lock-guarded list; daemons write what it
holds into `model_call` (and failures into the journal) with their own
transactions (`backend.store.model_calls`). The buffer is bounded: a process
that cannot write (its database is locked for minutes) drops the oldest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from backend.core import clock

BUFFER_MAX = 10_000
OK = "ok"  # a CallRecord's outcome when the attempt succeeded (else a ModelErrorClass)


class CallKind(StrEnum):
    """What a model request was for (model_call.kind)."""

    CHAT = "chat"
    SYNTHESIS = "synthesis"
    EMBEDDING = "embedding"


class ModelState(StrEnum):
    """The endpoint's health over the recent window (`ops.model_health`)."""

    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"
    IDLE = "idle"  # no request in the window
    UNUSED = "unused"  # no request ever


@dataclass
class CallRecord:
    """One request attempt to a model endpoint."""

    kind: CallKind
    endpoint: str
    model: str
    attempt: int  # 1: a first try; more: a retry
    session_id: str | None = None
    time: int = 0  # Unix time in ms, when the attempt started
    outcome: str = OK  # OK, or a ModelErrorClass
    status: int | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    retry_after_ms: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if not self.time:
            self.time = clock.now_ms()


_lock = threading.Lock()
_pending: list[CallRecord] = []
dropped = 0
# called (from any thread) when a failed attempt is buffered: a daemon writes failures at
# once, so a process killed during a retry's backoff has already journaled them
on_failure: list[Callable[[], None]] = []


def record(call: CallRecord) -> None:
    """Buffer one finished attempt."""
    global dropped
    with _lock:
        _pending.append(call)
        if len(_pending) > BUFFER_MAX:
            del _pending[0]
            dropped += 1
    if call.outcome != OK:
        for notify in list(on_failure):
            notify()


def take() -> list[CallRecord]:
    """Everything buffered, in order; the buffer is empty after."""
    if not _pending:  # the hot path of an offline agent: no lock, nothing to do
        return []
    with _lock:
        taken = list(_pending)
        _pending.clear()
    return taken


def give_back(calls: list[CallRecord]) -> None:
    """Put records whose write failed back in front, to be written by the next attempt."""
    if calls:
        with _lock:
            _pending[:0] = calls
            del _pending[: max(0, len(_pending) - BUFFER_MAX)]
