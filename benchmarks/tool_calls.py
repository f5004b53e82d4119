"""Benchmark the durable overhead of an agent tool call: rem's loop against a bare MCP `tools/call`.

    python benchmarks/tool_calls.py [--calls 300] [--sessions 100] [--per-session 10]
                                    [--postgres | --db URL]

Both sides call `notes_search` (a read tool, no delay) of rem's demo MCP server
(`backend/programs/demo_tools.py`) over stdio, each through a server of its own,
in the same run:

1. **latency** (`--calls`, one at a time, rem and bare alternating call by
   call so a busy patch of the machine weighs on both): rem's side is one
   call's life in the executor's `ToolRunner` on a real claimed execution:
   `running` and the key committed (fenced), the request through rem's
   registry, the result committed (fenced); the bare side is the official
   SDK's `ClientSession.call_tool`. Reported: p50 and p95 of each, and of the
   difference (target: <= 2 ms p50 extra on SQLite);
2. **throughput**: `--sessions` sessions each asking for `--per-session` read
   calls, one a step (an instant scripted agent), through one in-process
   `Executor` (concurrency = sessions), against the bare client making the
   same calls from as many concurrent tasks, 10 in a row each. The ratio is
   the bare side's wall time over rem's (target >= 0.5).

Prints a table on stderr and one JSON line on stdout. `--postgres` runs on a
throw-away PostgreSQL server (fsync on), `--db URL` on one you run (CREATEDB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from backend.core.datadir import DataDir
from backend.execution import leases, sessions, tool_calls
from backend.execution.agent import StepRequest
from backend.execution.executor import Executor
from backend.execution.steps import TurnState
from backend.execution.tool_calls import PlannedCall
from backend.execution.tool_runner import ToolRunner
from backend.models.tool_deltas import ModelToolCall
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState
from benchmarks.pg_common import fresh_database, server

ARGS = {"query": "standup"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


@contextlib.asynccontextmanager
async def bare_session(tools: Path) -> AsyncIterator[ClientSession]:
    config = server_config(tools, effect_delay_ms=0)
    params = StdioServerParameters(command=config["command"], args=config["args"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


class ReadAgent:
    """An instant agent: `per_session` steps each asking for one `notes_search`, then a reply."""

    name = "bench-read-agent"

    def __init__(self, per_session: int) -> None:
        self.per_session = per_session

    def system_prompt(self) -> str:
        return "bench"

    def snapshot(self) -> dict[str, Any]:
        return {"agent": self.name}

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        if len(request.tool_rounds) < self.per_session:
            request.tool_calls = [
                ModelToolCall(index=0, id="c", name="demo__notes_search", arguments=json.dumps(ARGS))
            ]
            yield "."
            return
        yield "done"


async def rem_calls(ctx: Context, runner: ToolRunner, count: int, bare: ClientSession) -> dict[str, Any]:
    """`count` calls through rem's runner, each followed by a bare one: their latencies in ms."""
    db = await ctx.db()
    await sessions.admit(db, "lat", "bench", input_id="lat-in")
    lease = await leases.claim(db, "lat", "bench-executor", length_ms=600_000)
    assert lease is not None
    state = TurnState(lease)
    slots = asyncio.Semaphore(1)
    rem_ms, bare_ms = [], []
    for n in range(count):
        row = await db.write_in_thread(lambda conn, n=n: _insert(conn, lease, n))
        started = time.perf_counter()
        await runner._run_one(state, row, slots)
        rem_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await bare.call_tool("notes_search", ARGS)
        bare_ms.append((time.perf_counter() - started) * 1000)
    assert await db.scalar("SELECT count(*) FROM tool_call WHERE state = 'completed'") == count
    extra = [r - b for r, b in zip(rem_ms, bare_ms, strict=True)]
    return {
        "rem_p50_ms": pct(rem_ms, 0.5),
        "rem_p95_ms": pct(rem_ms, 0.95),
        "bare_p50_ms": pct(bare_ms, 0.5),
        "bare_p95_ms": pct(bare_ms, 0.95),
        "extra_p50_ms": round(pct(rem_ms, 0.5) - pct(bare_ms, 0.5), 3),
        "extra_p95_ms": round(pct(rem_ms, 0.95) - pct(bare_ms, 0.95), 3),
        "extra_pairwise_median_ms": round(statistics.median(extra), 3),
    }


def _insert(conn: Any, lease: leases.Lease, n: int) -> Any:
    guard_sync(conn, lease, now=int(time.time() * 1000))
    planned = PlannedCall(
        idx=0,
        model_call_id="c",
        tool="demo.notes_search",
        arguments=json.dumps(ARGS),
        effect="read",
        effect_source="annotation",
        permission="allow",
        state=ToolCallState.PENDING,
    )
    (cid,) = tool_calls.insert_sync(conn, lease, n + 1, f"{lease.execution_id}:{n + 1}", [planned], 0)
    return conn.execute("SELECT * FROM tool_call WHERE id = ?", (cid,)).fetchone()


async def throughput(ctx: Context, bare: ClientSession, count: int, per_session: int) -> dict[str, Any]:
    db = await ctx.db()
    for n in range(count):
        await sessions.admit(db, f"tp{n:04d}", "bench", input_id=f"tp{n:04d}-in")
    executor = Executor(ctx, once=True, agent=ReadAgent(per_session), concurrency=count)
    await executor.tools.offered()  # its server started and listed before the clock starts, like the bare one
    started = time.perf_counter()
    await executor.run()
    rem_s = time.perf_counter() - started
    done = await db.scalar(
        "SELECT count(*) FROM tool_call WHERE session_id LIKE 'tp%' AND state = 'completed'"
    )
    assert done == count * per_session, done

    async def one_session() -> None:
        for _ in range(per_session):
            await bare.call_tool("notes_search", ARGS)

    started = time.perf_counter()
    await asyncio.gather(*(one_session() for _ in range(count)))
    bare_s = time.perf_counter() - started
    calls = count * per_session
    return {
        "calls": calls,
        "rem_calls_per_s": round(calls / rem_s, 1),
        "bare_calls_per_s": round(calls / bare_s, 1),
        "throughput_ratio": round(bare_s / rem_s, 3),
    }


async def measure(root: Path, db_url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    tools = root / "tools"
    config = root / "mcp.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"mcpServers": {"demo": server_config(tools, effect_delay_ms=0)}}))
    os.environ["REM_MCP_CONFIG"] = str(config)
    os.environ["REM_AGENT_DELAY_MS"] = "0"
    ctx = Context(DataDir(root / "data"), start_chroma=False, db_url=db_url)
    import logging

    runner = ToolRunner(lambda: db, "bench-executor", logging.getLogger("bench"))
    db = await ctx.db()
    try:
        async with bare_session(tools) as bare:
            await runner.offered()  # rem's server started and listed, like the bare one
            latency = await rem_calls(ctx, runner, args.calls, bare)
            rate = await throughput(ctx, bare, args.sessions, args.per_session)
            return {"store": "postgresql" if db_url else "sqlite", **latency, **rate}
    finally:
        await runner.aclose()
        await ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--per-session", type=int, default=10)
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--postgres", action="store_true", help="a throw-away PostgreSQL server (fsync on)")
    store.add_argument("--db", metavar="URL", help="a PostgreSQL server you run (CREATEDB needed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rem-tools-bench-") as tmp:
        root = Path(tmp)
        if args.postgres or args.db:
            with server(args.db, root) as url, fresh_database(url, "rem_bench_tools") as db_url:
                result = asyncio.run(measure(root, db_url, args))
        else:
            result = asyncio.run(measure(root, None, args))
    print(json.dumps(result))
    for key, value in result.items():
        print(f"{key:>26}  {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
