"""Durable streaming: however a reply is split into deltas, the stored text is their concatenation."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.core.datadir import DataDir
from backend.execution import projection, sessions
from backend.execution.agent import OfflineResponder, StepRequest
from backend.execution.executor import Executor
from backend.execution.streaming import PartWriter, StreamStats
from backend.runtime.context import Context

# deltas as a model sends them: words, pieces of words, empty strings, multi-byte text, newlines
DELTAS = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12), max_size=60)
# per delta: no pause, a yield to the event loop, or a short sleep (so flushes interleave)
PAUSES = st.lists(st.sampled_from([0.0, -1.0, 0.001, 0.004]), max_size=60)


async def _feed(writer: PartWriter, deltas: list[str], pauses: list[float]) -> None:
    for i, delta in enumerate(deltas):
        writer.add(delta)
        pause = pauses[i] if i < len(pauses) else 0.0
        if pause < 0:
            await asyncio.sleep(0)
        elif pause:
            await asyncio.sleep(pause)


@settings(max_examples=150, deadline=None)
@given(deltas=DELTAS, pauses=PAUSES, flush_ms=st.integers(1, 5), flush_bytes=st.integers(1, 40))
def test_the_parts_written_and_the_tail_are_the_deltas_in_order(
    deltas: list[str], pauses: list[float], flush_ms: int, flush_bytes: int
) -> None:
    written: list[str] = []
    stats = StreamStats()

    async def flush(parts: list[str]) -> None:
        await asyncio.sleep(0.001)  # a commit takes time; deltas keep arriving meanwhile
        written.append("".join(parts))

    async def run() -> list[str]:
        writer = PartWriter(flush, stats=stats, flush_ms=flush_ms, flush_bytes=flush_bytes)
        await _feed(writer, deltas, pauses)
        tail, arrived = await writer.close()
        assert len(arrived) == len(tail)
        return tail

    tail = asyncio.run(run())
    assert "".join(written) + "".join(tail) == "".join(deltas)
    assert stats.deltas == len(deltas) - len(tail) and len(stats.lag_s) == stats.deltas
    assert all(lag >= 0 for lag in stats.lag_s)


class ScriptedAgent(OfflineResponder):
    """Streams exactly the deltas it is given, pausing between them as told."""

    def __init__(self, deltas: list[str], pauses: list[float]) -> None:
        super().__init__(delay_ms=0)
        self.deltas, self.pauses = deltas, pauses

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        for i, delta in enumerate(self.deltas):
            yield delta
            pause = self.pauses[i] if i < len(self.pauses) else 0.0
            if pause:
                await asyncio.sleep(max(pause, 0))


async def _run_turn(root: Path, deltas: list[str], pauses: list[float]) -> tuple[str, str, list[str]]:
    ctx = Context(DataDir(root), start_chroma=False)
    try:
        db = await ctx.db()
        await sessions.admit(db, "s1", "split me", input_id="q1")
        await Executor(ctx, once=True, agent=ScriptedAgent(deltas, pauses)).run()
        row = await db.fetchone("SELECT id, data FROM session_message WHERE type = 'assistant'")
        parts = await db.fetchall(
            "SELECT data FROM session_part WHERE message_id = ? ORDER BY idx", (row[0],)
        )
        assert await db.read_in_thread(projection.transcript_violations_sync) == []
        data = json.loads(row[1])
        return data["status"], data["text"], [json.loads(p[0])["text"] for p in parts]
    finally:
        await ctx.close()


@settings(max_examples=25, deadline=None)
@given(deltas=DELTAS.filter(lambda d: "".join(d) != ""), pauses=PAUSES, flush_bytes=st.integers(1, 64))
def test_a_turn_stores_exactly_the_concatenation_of_its_deltas(
    deltas: list[str], pauses: list[float], flush_bytes: int
) -> None:
    import os

    os.environ["REM_STREAM_FLUSH_MS"] = "2"
    os.environ["REM_STREAM_FLUSH_BYTES"] = str(flush_bytes)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            status, text, parts = asyncio.run(_run_turn(Path(tmp) / "d", deltas, pauses))
    finally:
        del os.environ["REM_STREAM_FLUSH_MS"], os.environ["REM_STREAM_FLUSH_BYTES"]
    assert status == "completed"
    assert text == "".join(parts) == "".join(deltas)
    assert all(parts)  # coalesced: no empty part rows
