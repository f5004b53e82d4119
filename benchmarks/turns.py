"""Benchmark the turn path: turns/s end to end with the instant agent, against bare SQLite writes.

    python benchmarks/turns.py [--turns 2000] [--sessions 50] [--concurrency 8] [--bare 5000] [--rounds 5]

Each round, on a fresh data dir:
1. admits `--turns` queue inputs spread over `--sessions` sessions (`sessions.admit`);
2. runs one in-process `Executor` (`--once`, instant agent) until every input is
   promoted and answered, counting its write transactions (every `db.tx()` and
   `db.write_in_thread()`) and the WAL frames (pages) they write;
3. on the same state.db, through the same aiosqlite `Database`, times `--bare`
   transactions of `BEGIN IMMEDIATE; INSERT; COMMIT`, one statement per call,
   half right before the turn run and half right after it.
The turn run and the bare run alternate, so a slow patch of the machine hits
both; the headline is the median round (the machine's jitter is +-15 %).
Prints the median figures and every round's, as a table on stderr and one
JSON line on stdout (target: ratio >= 0.5). The temp dirs are removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store.db import Database

ASKS = (
    "Why did the nightly ledger export stall after the PgBouncer change?",
    "Summarise what Priya said about the Canary Pipeline.",
    "List the risks of moving the Invoice Service behind Stripe webhooks.",
    "Draft a runbook step for when the Frankfurt region is late again.",
)


def count_transactions(db: Database) -> dict[str, int]:
    """Wrap `db.tx` and `db.write_in_thread` so every write transaction on this Database is counted."""
    counter = {"tx": 0}
    original_tx, original_write = db.tx, db.write_in_thread

    @contextlib.asynccontextmanager
    async def counted_tx() -> AsyncIterator[Any]:
        async with original_tx() as conn:
            yield conn
        counter["tx"] += 1

    async def counted_write(fn: Any) -> Any:
        result = await original_write(fn)
        counter["tx"] += 1
        return result

    db.tx = counted_tx  # type: ignore[method-assign]
    db.write_in_thread = counted_write  # type: ignore[method-assign]
    return counter


async def admit_all(db: Database, turns: int, session_count: int) -> float:
    start = time.perf_counter()
    for i in range(turns):
        await sessions.admit(db, f"bench-{i % session_count}", f"{ASKS[i % len(ASKS)]} (#{i})")
    return time.perf_counter() - start


WAL_FRAME = 4096 + 24


async def wal_frames(db: Database, *, reset: bool = False) -> int:
    """Frames in the WAL; `reset` checkpoints and truncates it first (autocheckpoint is off)."""
    if reset:
        await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(str(db.path) + "-wal")
    return max(0, (wal.stat().st_size - 32) // WAL_FRAME) if wal.exists() else 0


async def run_turns(ctx: Context, db: Database, concurrency: int) -> dict[str, Any]:
    counter = count_transactions(db)
    executor = Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), concurrency=concurrency)
    await wal_frames(db, reset=True)
    groups = db.groups_committed
    start = time.perf_counter()
    await executor.run()
    elapsed = time.perf_counter() - start
    frames = await wal_frames(db)
    return {
        "elapsed": elapsed,
        "tx": counter["tx"],
        "turns": executor.turns_completed,
        "frames": frames,
        "commits": db.groups_committed - groups,
    }


async def bare_rate(db: Database, count: int) -> tuple[float, float]:
    """(transactions/s, WAL frames per transaction) of BEGIN IMMEDIATE; INSERT; COMMIT."""
    async with db.tx() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_bare (id INTEGER PRIMARY KEY, v TEXT)")
    await wal_frames(db, reset=True)
    start = time.perf_counter()
    for i in range(count):
        async with db.tx() as conn:
            await conn.execute("INSERT INTO bench_bare (v) VALUES (?)", (f"row {i}",))
    rate = count / (time.perf_counter() - start)
    return rate, await wal_frames(db) / count


async def measure(root: Path, turns: int, session_count: int, concurrency: int, bare: int) -> dict[str, Any]:
    ctx = Context(DataDir(root), start_chroma=False)
    db = await ctx.db()
    admit_s = await admit_all(db, turns, session_count)
    # WAL frames (pages) per transaction explain the ratio: measure them
    # with autocheckpoint off, so the WAL only grows during each phase
    await db.fetchall("PRAGMA wal_autocheckpoint = 0")
    # the bare rate is timed right before and right after the turn run (half each),
    # so a slow or fast patch of the machine weighs on both sides of the ratio alike
    before_tps, before_frames = await bare_rate(db, bare // 2)
    run = await run_turns(ctx, db, concurrency)  # the Executor shares ctx's Database, as a daemon does
    after_tps, after_frames = await bare_rate(db, bare - bare // 2)
    bare_tps = 2 / (1 / before_tps + 1 / after_tps)  # the rate over both halves together
    bare_frames = (before_frames + after_frames) / 2
    unpromoted = await db.scalar("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL")
    await ctx.close()
    tx, done, elapsed = run["tx"], run["turns"], run["elapsed"]
    turn_tps = tx / elapsed
    return {
        "turns": done,
        "unpromoted": unpromoted,
        "sessions": session_count,
        "concurrency": concurrency,
        "admit_per_s": round(turns / admit_s, 1),
        "turns_per_s": round(done / elapsed, 1),
        "turn_path_tx": tx,
        "tx_per_turn": round(tx / max(done, 1), 2),
        "turn_path_tx_per_s": round(turn_tps, 1),
        "bare_tx_per_s": round(bare_tps, 1),
        "ratio": round(turn_tps / bare_tps, 3),
        "commits_per_s": round(run["commits"] / elapsed, 1),
        "tx_per_commit": round(tx / max(run["commits"], 1), 2),
        "wal_frames_per_turn_tx": round(run["frames"] / max(tx, 1), 1),
        "wal_frames_per_commit": round(run["frames"] / max(run["commits"], 1), 1),
        "wal_frames_per_bare_tx": round(bare_frames, 1),
    }


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median ratio, plus every round's ratio and rates."""
    ranked = sorted(rounds, key=lambda r: r["ratio"])
    result = dict(ranked[(len(ranked) - 1) // 2])
    result["rounds"] = len(rounds)
    result["ratio_median"] = round(statistics.median(r["ratio"] for r in rounds), 3)
    result["ratio_min"], result["ratio_max"] = ranked[0]["ratio"], ranked[-1]["ratio"]
    result["turns_per_s_median"] = round(statistics.median(r["turns_per_s"] for r in rounds), 1)
    result["per_round"] = [
        {k: r[k] for k in ("turns_per_s", "turn_path_tx_per_s", "bare_tx_per_s", "ratio")} for r in rounds
    ]
    result["all_promoted"] = all(r["unpromoted"] == 0 and r["turns"] > 0 for r in rounds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--bare", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rem-turns-") as tmp:
        for n in range(max(1, args.rounds)):
            root = Path(tmp) / f"round-{n}"
            rounds.append(asyncio.run(measure(root, args.turns, args.sessions, args.concurrency, args.bare)))
            print(
                f"round {n + 1}: {rounds[-1]['turns_per_s']} turns/s, ratio {rounds[-1]['ratio']}",
                file=sys.stderr,
            )
    result = median_round(rounds)
    print(json.dumps(result))
    for key, value in result.items():
        if key != "per_round":
            print(f"{key:>22}  {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
