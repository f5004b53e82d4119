"""Benchmark the turn path: turns/s end to end with the instant agent, against bare SQLite writes.

    python benchmarks/turns.py [--turns 2000] [--sessions 50] [--concurrency 8] [--bare 5000]
                               [--rounds 9] [--slices 5] [--postgres | --db URL]

Each round, on a fresh data dir, `--slices` times in a row:
1. admits a slice of the `--turns` queue inputs spread over `--sessions` sessions
   (`sessions.admit`; not timed);
2. times a burst of bare `BEGIN IMMEDIATE; INSERT; COMMIT` transactions on the same
   state.db through the same aiosqlite `Database`, one statement per call;
3. times one in-process `Executor` (`--once`, instant agent) until every input of
   the slice is promoted and answered, counting its write transactions (every
   `db.tx()` and `db.write_in_thread()`) and the WAL frames (pages) they write;
and a last bare burst after the last slice. Turn and bare work alternate every
few hundred milliseconds, so a busy or quiet patch of a shared machine weighs on
both sides of the ratio alike (whole-run alternation gave rounds from 0.37 to
0.59). Both sides are also timed in CPU seconds of the process (both its threads):
the CPU ratio does not depend on how much of the machine other work leaves us.
Prints the median figures and every round's, as a table on stderr and one JSON
line on stdout (target: median ratio >= 0.5). The temp dirs are removed.

`--postgres` runs the same rounds on the PostgreSQL store: a throw-away server
(`backend/programs/postgres_server.py`, fsync on, data in a temp dir) started for
the run, a fresh database per round; `--db URL` uses a server you run (each
round creates and drops a database `rem_bench_turns_N` through that URL's
server, so the role needs CREATEDB). The bare side is the same `BEGIN; INSERT;
COMMIT` through the same `Database` (psycopg); instead of WAL frames the rounds
report the server's WAL bytes (`pg_current_wal_lsn()`), and the CPU ratio
counts this process only (the server's backend does the rest of the work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.execution.agent import OfflineResponder
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.store.db import Database
from benchmarks.pg_common import fresh_database, server

ASKS = (
    "Why did the nightly ledger export stall after the PgBouncer change?",
    "Summarise what Priya said about the Canary Pipeline.",
    "List the risks of moving the Invoice Service behind Stripe webhooks.",
    "Draft a runbook step for when the Frankfurt region is late again.",
)


def count_transactions(db: Database) -> dict[str, Any]:
    """Wrap `db.tx` and `db.write_in_thread` so every write transaction on this Database is counted."""
    counter: dict[str, Any] = {"tx": 0}
    original_tx, original_write = db.tx, db.write_in_thread
    counter["original"] = (original_tx, original_write)

    @contextlib.asynccontextmanager
    async def counted_tx() -> AsyncIterator[Any]:
        async with original_tx() as conn:
            yield conn
        counter["tx"] += 1

    async def counted_write(fn: Any, **lane: Any) -> Any:
        result = await original_write(fn, **lane)
        counter["tx"] += 1
        return result

    db.tx = counted_tx  # type: ignore[method-assign]
    db.write_in_thread = counted_write  # type: ignore[method-assign]
    return counter


async def admit_all(db: Database, first: int, count: int, session_count: int) -> None:
    for i in range(first, first + count):
        await sessions.admit(db, f"bench-{i % session_count}", f"{ASKS[i % len(ASKS)]} (#{i})")


WAL_FRAME = 4096 + 24


async def wal_frames(db: Database, *, reset: bool = False) -> int:
    """Frames in the WAL; `reset` checkpoints and truncates it first (autocheckpoint is off).

    On PostgreSQL: the server's WAL position in bytes (differences are WAL written).
    """
    if db.postgres:
        return int(await db.scalar("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    if reset:
        await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(str(db.path) + "-wal")
    return max(0, (wal.stat().st_size - 32) // WAL_FRAME) if wal.exists() else 0


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_turns(ctx: Context, db: Database, concurrency: int) -> dict[str, Any]:
    counter = count_transactions(db)
    executor = Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), concurrency=concurrency)
    frames = await wal_frames(db, reset=True)
    groups = db.groups_committed
    cpu, start = cpu_s(), time.perf_counter()
    await executor.run()
    elapsed, cpu = time.perf_counter() - start, cpu_s() - cpu
    frames = await wal_frames(db) - frames
    db.tx, db.write_in_thread = counter.pop("original")  # type: ignore[assignment,method-assign]
    return {
        "elapsed": elapsed,
        "cpu": cpu,
        "tx": counter["tx"],
        "turns": executor.turns_completed,
        "frames": frames,
        "commits": db.groups_committed - groups,
    }


async def bare_burst(db: Database, count: int) -> dict[str, float]:
    """Time `count` BEGIN IMMEDIATE; INSERT; COMMIT transactions (wall, CPU, WAL frames)."""
    frames = await wal_frames(db, reset=True)
    cpu, start = cpu_s(), time.perf_counter()
    for i in range(count):
        async with db.tx() as conn:
            await conn.execute("INSERT INTO bench_bare (v) VALUES (?)", (f"row {i}",))
    return {
        "elapsed": time.perf_counter() - start,
        "cpu": cpu_s() - cpu,
        "tx": count,
        "frames": await wal_frames(db) - frames,
    }


def _total(parts: list[dict[str, Any]], key: str) -> float:
    return float(sum(p[key] for p in parts))


async def measure(
    root: Path,
    turns: int,
    session_count: int,
    concurrency: int,
    bare: int,
    slices: int,
    db_url: str | None = None,
) -> dict[str, Any]:
    ctx = Context(DataDir(root), start_chroma=False, db_url=db_url)
    db = await ctx.db()
    if db.postgres:
        async with db.tx() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS bench_bare (id BIGSERIAL PRIMARY KEY, v TEXT)")
    else:
        # WAL frames (pages) per transaction explain the ratio: measure them
        # with autocheckpoint off, so the WAL only grows during each phase
        await db.fetchall("PRAGMA wal_autocheckpoint = 0")
        async with db.tx() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS bench_bare (id INTEGER PRIMARY KEY, v TEXT)")
    runs, bares = [], []
    per_slice = max(1, turns // slices)
    for k in range(slices):
        await admit_all(db, k * per_slice, per_slice, session_count)
        bares.append(await bare_burst(db, bare // (slices + 1)))
        runs.append(await run_turns(ctx, db, concurrency))  # shares ctx's Database, as a daemon does
    bares.append(await bare_burst(db, bare // (slices + 1)))
    unpromoted = await db.scalar("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL")
    await ctx.close()
    tx, done, elapsed = _total(runs, "tx"), _total(runs, "turns"), _total(runs, "elapsed")
    commits, frames = _total(runs, "commits"), _total(runs, "frames")
    turn_tps, bare_tps = tx / elapsed, _total(bares, "tx") / _total(bares, "elapsed")
    turn_per_cpu, bare_per_cpu = tx / _total(runs, "cpu"), _total(bares, "tx") / _total(bares, "cpu")
    wal = "wal_bytes" if db_url else "wal_frames"
    return {
        "store": "postgresql" if db_url else "sqlite",
        "turns": int(done),
        "unpromoted": unpromoted,
        "sessions": session_count,
        "concurrency": concurrency,
        "slices": slices,
        "turns_per_s": round(done / elapsed, 1),
        # the turn's own cost, immune to how many transactions it is cut into (the ratio counts
        # transactions: folding one into another makes turns cheaper and the ratio lower)
        "turns_per_cpu_s": round(done / _total(runs, "cpu"), 1),
        "turn_path_tx": int(tx),
        "tx_per_turn": round(tx / max(done, 1), 2),
        "turn_path_tx_per_s": round(turn_tps, 1),
        "bare_tx_per_s": round(bare_tps, 1),
        "ratio": round(turn_tps / bare_tps, 3),
        "turn_path_tx_per_cpu_s": round(turn_per_cpu, 1),
        "bare_tx_per_cpu_s": round(bare_per_cpu, 1),
        "ratio_cpu": round(turn_per_cpu / bare_per_cpu, 3),
        "commits_per_s": round(commits / elapsed, 1),
        "tx_per_commit": round(tx / max(commits, 1), 2),
        f"{wal}_per_turn_tx": round(frames / max(tx, 1), 1),
        f"{wal}_per_commit": round(frames / max(commits, 1), 1),
        f"{wal}_per_bare_tx": round(_total(bares, "frames") / _total(bares, "tx"), 1),
    }


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median ratio, plus every round's ratio and rates."""
    ranked = sorted(rounds, key=lambda r: r["ratio"])
    result = dict(ranked[(len(ranked) - 1) // 2])
    result["rounds"] = len(rounds)
    result["ratio_median"] = round(statistics.median(r["ratio"] for r in rounds), 3)
    result["ratio_min"], result["ratio_max"] = ranked[0]["ratio"], ranked[-1]["ratio"]
    cpu = sorted(r["ratio_cpu"] for r in rounds)
    result["ratio_cpu_median"] = round(statistics.median(cpu), 3)
    result["ratio_cpu_min"], result["ratio_cpu_max"] = cpu[0], cpu[-1]
    result["turns_per_s_median"] = round(statistics.median(r["turns_per_s"] for r in rounds), 1)
    result["turns_per_cpu_s_median"] = round(statistics.median(r["turns_per_cpu_s"] for r in rounds), 1)
    result["per_round"] = [
        {k: r[k] for k in ("turns_per_s", "turn_path_tx_per_s", "bare_tx_per_s", "ratio", "ratio_cpu")}
        for r in rounds
    ]
    result["all_promoted"] = all(r["unpromoted"] == 0 and r["turns"] > 0 for r in rounds)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


@contextlib.contextmanager
def postgres(args: argparse.Namespace, tmp: Path) -> Iterator[str | None]:
    """The server URL the rounds use: None for SQLite, `--db`, or a throw-away server's."""
    if not (args.db or args.postgres):
        yield None
        return
    with server(args.db, tmp) as url:
        yield url


@contextlib.contextmanager
def round_database(server_url: str | None, n: int) -> Iterator[str | None]:
    """A fresh database for round `n` on the server (dropped after), or None on SQLite."""
    if server_url is None:
        yield None
        return
    with fresh_database(server_url, f"rem_bench_turns_{n}") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--bare", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--slices", type=int, default=5)
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--postgres", action="store_true", help="a throw-away PostgreSQL server (fsync on)")
    store.add_argument("--db", metavar="URL", help="a PostgreSQL server you run (CREATEDB needed)")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rem-turns-") as tmp, postgres(args, Path(tmp)) as server_url:
        for n in range(max(1, args.rounds)):
            root = Path(tmp) / f"round-{n}"
            with round_database(server_url, n) as db_url:
                rounds.append(
                    asyncio.run(
                        measure(
                            root, args.turns, args.sessions, args.concurrency, args.bare, args.slices, db_url
                        )
                    )
                )
            print(
                f"round {n + 1}: {rounds[-1]['turns_per_s']} turns/s, ratio {rounds[-1]['ratio']} "
                f"(CPU ratio {rounds[-1]['ratio_cpu']})",
                file=sys.stderr,
            )
    result = median_round(rounds)
    print(json.dumps(result))
    for key, value in result.items():
        if key != "per_round":
            print(f"{key:>22}  {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
