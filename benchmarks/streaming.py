"""Benchmark durable streaming: many sessions streaming model replies at once through one executor.

    python benchmarks/streaming.py [--sessions 200] [--tps 50] [--tokens 500] [--bare 3000]

The model endpoint is tests/fake_openai.py as a separate process (its CPU is
not the executor's), streaming each reply at `--tps` tokens/s. One
in-process `Executor` (the daemon's code, `REM_AGENT=openai`, concurrency
= `--sessions`) answers one input in each of `--sessions` sessions, all at
once: `--sessions` x `--tps` tokens/s in all. Reported:

* durable lag: each delta from its arrival to the commit of the part holding
  it (p50 / p99 / max; the target is p99 < 250 ms at the default 100 ms flush);
* commits/s (physical group commits) and write transactions/s of the run, against
  the bare `BEGIN IMMEDIATE; INSERT; COMMIT` rate on the same file in the same run
  (half before, half after);
* WAL pages written per second (autocheckpoint off during the run, the WAL's growth);
* the executor process's CPU share (user + system / wall, both its threads) and the
  endpoint's, next to the whole machine's busy share;
* time to first token: the server's own (request read -> first token written) and
  what rem adds on top (client send -> first delta parsed, minus the server's own),
  for the run's requests (all started at once: a burst) and for `--sequential`
  single requests afterwards.

Prints a table on stderr and one JSON line on stdout. The data dir is removed
unless `--keep`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.execution.agent import StepRequest
from backend.runtime.context import Context
from backend.store.db import Database
from tests.fake_openai import FakeOpenAIProcess, Scenario

CLK_TCK = os.sysconf("SC_CLK_TCK")
WAL_FRAME = 4096 + 24


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_s() -> float:
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK


def wal_frames(db: Database) -> int:
    wal = Path(str(db.path) + "-wal")
    return max(0, (wal.stat().st_size - 32) // WAL_FRAME) if wal.exists() else 0


async def bare_rate(db: Database, count: int) -> float:
    """Transactions/s of BEGIN IMMEDIATE; INSERT; COMMIT, one at a time, on the same file."""
    async with db.tx() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_bare (id INTEGER PRIMARY KEY, v TEXT)")
    start = time.perf_counter()
    for i in range(count):
        async with db.tx() as conn:
            await conn.execute("INSERT INTO bench_bare (v) VALUES (?)", (f"row {i}",))
    return count / (time.perf_counter() - start)


def count_transactions(db: Database) -> dict[str, int]:
    counter = {"tx": 0}
    original = db.write_in_thread

    async def counted(fn: Any, **lane: Any) -> Any:
        result = await original(fn, **lane)
        counter["tx"] += 1
        return result

    db.write_in_thread = counted  # type: ignore[method-assign]
    return counter


async def ttft_pairs(db: Database, server: FakeOpenAIProcess) -> dict[str, Any]:
    """The server's own time to first token, and what rem adds, paired by session."""
    rows = await db.fetchall("SELECT session_id, ttft_ms FROM model_call WHERE outcome = 'ok'")
    client = {r[0]: r[1] / 1000 for r in rows if r[1] is not None}
    own, added = [], []
    for record in server.requests():
        if record.streaming_started_at is None or not record.messages:
            continue
        prompt = str(record.messages[-1].get("content", ""))
        sid = prompt.rsplit("#", 1)[-1] if "#" in prompt else None
        server_s = record.streaming_started_at - record.received_monotonic
        own.append(server_s)
        if sid in client:
            added.append(client[sid] - server_s)
    return {
        "server_ttft_ms_p50": ms(pct(own, 0.5)),
        "server_ttft_ms_p99": ms(pct(own, 0.99)),
        "rem_adds_ms_p50": ms(pct(added, 0.5)),
        "rem_adds_ms_p99": ms(pct(added, 0.99)),
        "client_ttft_ms_p50": ms(pct(list(client.values()), 0.5)),
        "client_ttft_ms_p99": ms(pct(list(client.values()), 0.99)),
    }


async def sequential_ttft(agent: Any, server: FakeOpenAIProcess, count: int) -> dict[str, Any]:
    """What rem's client adds to the server's time to first token when requests do not queue."""
    added = []
    for i in range(count):
        server.reset()
        request = StepRequest(f"seq{i}", [f"sequential {i}"])
        stream = agent.stream(request)
        async for _ in stream:
            break  # the first delta is what is timed
        await stream.aclose()
        record = server.requests()[0]
        if record.streaming_started_at is not None and request.reply and request.reply.ttft_ms is not None:
            added.append(
                request.reply.ttft_ms / 1000 - (record.streaming_started_at - record.received_monotonic)
            )
    return {
        "rem_adds_ms_sequential_p50": ms(pct(added, 0.5)),
        "rem_adds_ms_sequential_p99": ms(pct(added, 0.99)),
    }


async def measure(root: Path, server: FakeOpenAIProcess, args: argparse.Namespace) -> dict[str, Any]:
    from backend.execution.executor import Executor
    from backend.execution.openai_agent import OpenAIAgent

    ctx = Context(DataDir(root), start_chroma=False)
    db = await ctx.db()
    for i in range(args.sessions):
        await sessions.admit(db, f"s{i}", f"Why did export {i} stall? #s{i}", input_id=f"q{i}")
    await db.fetchall("PRAGMA wal_autocheckpoint = 0")
    bare_before = await bare_rate(db, args.bare // 2)
    await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    agent = OpenAIAgent()
    # the first request of a process loads the SDK's lazily imported modules (~1 s of CPU
    # here): warm up on a throwaway request so the run measures the steady state
    async for _ in agent.stream(StepRequest("warm-up", ["warm up"])):
        pass
    executor = Executor(ctx, once=True, agent=agent, concurrency=args.sessions)
    counter = count_transactions(db)
    groups, frames = db.groups_committed, wal_frames(db)
    cpu, server_cpu, busy = self_cpu_s(), proc_cpu_s(server.pid), machine_busy_s()
    start = time.perf_counter()
    await executor.run()
    wall = time.perf_counter() - start
    cpu, server_cpu = self_cpu_s() - cpu, proc_cpu_s(server.pid) - server_cpu
    busy = machine_busy_s() - busy
    commits, pages = db.groups_committed - groups, wal_frames(db) - frames
    db.write_in_thread = Database.write_in_thread.__get__(db)  # type: ignore[method-assign]
    await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    bare_after = await bare_rate(db, args.bare - args.bare // 2)
    bare = 2 / (1 / bare_before + 1 / bare_after)
    completed = await db.scalar(
        "SELECT count(*) FROM session_message WHERE type = 'assistant' AND json_extract(data, '$.status') = 'completed'"
    )
    parts = await db.scalar("SELECT count(*) FROM session_part")
    lag = list(executor.stream_stats.lag_s)
    ttft = await ttft_pairs(db, server)
    ttft.update(await sequential_ttft(agent, server, args.sequential))
    await agent.aclose()  # the executor closed its connections; the sequential requests opened new ones
    await ctx.close()
    deltas = executor.stream_stats.deltas
    return {
        "sessions": args.sessions,
        "tokens_per_s_per_stream": args.tps,
        "tokens_per_stream": args.tokens,
        "flush_ms": int(os.environ["REM_STREAM_FLUSH_MS"]),
        "completed": completed,
        "ideal_stream_s": round((args.tokens - 1) / args.tps, 2),
        "wall_s": round(wall, 2),
        "deltas": deltas,
        "deltas_per_s": round(deltas / wall),
        "parts": parts,
        "durable_lag_ms_p50": ms(pct(lag, 0.5)),
        "durable_lag_ms_p99": ms(pct(lag, 0.99)),
        "durable_lag_ms_max": ms(max(lag) if lag else None),
        "commits_per_s": round(commits / wall, 1),
        "write_tx_per_s": round(counter["tx"] / wall, 1),
        "tx_per_commit": round(counter["tx"] / max(commits, 1), 1),
        "bare_commits_per_s": round(bare, 1),
        "commits_vs_bare": round(commits / wall / bare, 3),
        "wal_pages_per_s": round(pages / wall),
        "wal_mb_per_s": round(pages * WAL_FRAME / wall / 1e6, 2),
        "executor_cpu_pct": round(100 * cpu / wall, 1),
        "executor_cpu_us_per_delta": round(1e6 * cpu / max(deltas, 1), 1),
        "endpoint_cpu_pct": round(100 * server_cpu / wall, 1),
        "machine_busy_pct_of_all_cores": round(100 * busy / wall / (os.cpu_count() or 1), 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        **ttft,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--tps", type=float, default=50.0)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--bare", type=int, default=3000)
    parser.add_argument("--flush-ms", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=30, help="single requests timed after the run")
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args()
    os.environ.update(
        REM_MODEL="gpt-4o-mini",
        REM_MODEL_CONCURRENCY=str(args.sessions),
        REM_STREAM_FLUSH_MS=str(args.flush_ms),
        REM_MODEL_HISTORY="0",
    )
    tmp = Path(tempfile.mkdtemp(prefix="rem-streaming-"))
    reply = " ".join(f"tok{i}" for i in range(args.tokens))
    try:
        with FakeOpenAIProcess() as server:
            server.set_default(Scenario(reply=reply, tokens_per_second=args.tps))
            os.environ["REM_MODEL_BASE_URL"] = server.base_url
            result = asyncio.run(measure(tmp / "data", server, args))
    finally:
        if args.keep:
            print(f"data dir kept: {tmp / 'data'}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))
    for key, value in result.items():
        print(f"{key:>32}  {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
