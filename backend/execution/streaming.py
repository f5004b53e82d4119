"""Durable, cheap streaming: a reply's deltas coalesced into part writes.

A model streams tens of deltas a second per session; writing each would cost
a commit per token. `PartWriter` buffers them and writes one part (their
concatenation) at most `REM_STREAM_FLUSH_MS` (100 ms) after the oldest
buffered delta arrived, or as soon as `REM_STREAM_FLUSH_BYTES` wait,
through `PartSink`: the parts every session of the executor flushes while
one write is in flight go together in the next, as ONE fenced statement
(`projection.write_fenced_parts`), inside a group commit. The last deltas of
a reply are not flushed on their own: the step's completion writes them.

**The durable-lag bound.** A delta received at time t is committed by
t + REM_STREAM_FLUSH_MS + (the wait for, and the length of, one group
commit), whether or not more deltas follow: a timer flushes a stalled
stream too. The flusher runs in its own task, so the reading of the stream
never waits for a commit. A process killed mid-stream loses at most the
deltas of the last interval; recovery re-asks the model with what was
durable (benchmarks/streaming.py measures the lag under 200 streams).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from backend.core import clock
from backend.core.errors import LeaseLost
from backend.core.settings import settings
from backend.execution import projection
from backend.execution.leases import Lease
from backend.store.db import Conn, Database

LAG_SAMPLES = 200_000


@dataclass
class StreamStats:
    """What an executor's streams cost: part flushes and the durable lag of every delta."""

    flushes: int = 0
    deltas: int = 0
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))

    def committed(self, arrived: list[float], at: float) -> None:
        """Deltas that arrived at `arrived` (loop time) are durable since `at`."""
        self.deltas += len(arrived)
        self.lag_s.extend(at - t for t in arrived)


class PartSink:
    """One writer for the streamed parts of all of an executor's sessions.

    `write` queues a part and waits for its commit. While one batch is being
    committed, the next accumulates; a batch is one `write_in_thread` holding one
    INSERT for all its parts, each fenced on its own lease, so a lost lease
    fails only that session's part (with `LeaseLost`). 200 sessions flushing
    10 times a second cost a few commits and statements a second, not 2 000.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.batches = 0
        self._queue: list[tuple[dict[str, object], asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def write(self, lease: Lease, message_id: str, idx: int, text: str) -> None:
        """Commit one part of `message_id`, or raise LeaseLost if `lease` no longer holds."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((projection.part_row(lease, message_id, idx, text), done))
        if self._task is None:
            self._task = loop.create_task(self._run(), name="rem-part-sink")
        await done

    async def _run(self) -> None:
        try:
            while self._queue:
                # no yield before taking the batch: every loop iteration a flush waits for is
                # ~a batch of socket reads of other streams; parts arriving meanwhile form the next
                batch, self._queue = self._queue, []
                rows = [row for row, _ in batch]
                try:
                    written = await self.db.write_in_thread(partial(_write_parts_sync, rows=rows))
                except Exception as exc:  # the whole batch failed: every writer hears why
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    continue
                self.batches += 1
                for row, done in batch:
                    if done.done():
                        continue
                    if row["pid"] in written:
                        done.set_result(None)
                    else:
                        done.set_exception(
                            LeaseLost(f"execution {row['eid']} lost its lease at epoch {row['epoch']}")
                        )
        finally:
            self._task = None


def _write_parts_sync(conn: Conn, rows: list[dict[str, object]]) -> set[str]:
    return projection.write_fenced_parts_sync(conn, rows, clock.now_ms())


class PartWriter:
    """Buffers a step's deltas and writes them as parts from a flusher task of its own."""

    def __init__(
        self,
        flush: Callable[[list[str]], Awaitable[None]],
        *,
        stats: StreamStats | None = None,
        flush_ms: int | None = None,
        flush_bytes: int | None = None,
    ) -> None:
        self._flush = flush
        self._stats = stats
        self.flush_s = (settings.stream_flush_ms if flush_ms is None else flush_ms) / 1000
        self.flush_bytes = settings.stream_flush_bytes if flush_bytes is None else flush_bytes
        self._buffer: list[str] = []
        self._arrived: list[float] = []
        self._bytes = 0
        self._data = asyncio.Event()  # the buffer holds something
        self._urgent = asyncio.Event()  # write now: the buffer is full, or the writer is closing
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    def add(self, delta: str) -> None:
        """Buffer one delta (raises what made an earlier flush fail: a lost lease, the database)."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        self._buffer.append(delta)
        self._arrived.append(loop.time())
        self._bytes += len(delta)
        self._data.set()
        if self._bytes >= self.flush_bytes:
            self._urgent.set()
        if self._task is None:
            self._task = loop.create_task(self._run(), name="rem-part-writer")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._data.wait()
                if self._closing:
                    return
                delay = self._arrived[0] + self.flush_s - loop.time()
                if delay > 0 and not self._urgent.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._urgent.wait()
                if self._closing:
                    return
                parts, arrived = self._buffer, self._arrived
                self._buffer, self._arrived, self._bytes = [], [], 0
                self._data.clear()
                self._urgent.clear()
                await self._flush(parts)
                if self._stats is not None:
                    self._stats.flushes += 1
                    self._stats.committed(arrived, loop.time())
        except Exception as exc:  # surfaced to the reader by add() / close()
            self._error = exc

    def _stop(self) -> None:
        self._closing = True
        self._data.set()
        self._urgent.set()

    async def close(self) -> tuple[list[str], list[float]]:
        """Stop flushing (an in-flight flush finishes first); the deltas not yet written, and when they came."""
        self._stop()
        if self._task is not None:
            await self._task
        if self._error is not None:
            raise self._error
        return self._buffer, self._arrived

    async def abort(self) -> None:
        """Stop after an error elsewhere: let an in-flight flush land, never leave the task behind."""
        if self._task is None or self._task.done():
            return
        self._stop()
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            self._task.cancel()
            raise
