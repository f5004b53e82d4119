"""Soak: `rem up --load` for a stated time, with a console-like reader polling status.

Reports turns completed, p50/p99 turn latency (input admitted -> reply
completed), the WAL size over time (it must stay bounded: readers must not
starve checkpoints), the RSS of every process over time, and `rem check
--settled` at the end.

    python benchmarks/soak.py [--minutes 10] [--rate 4] [--sessions 6] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from backend import ops
from backend.core.datadir import DataDir
from backend.programs.supervisor import read_manifest
from backend.runtime.context import Context

LATENCY_SQL = """
SELECT i.time_created AS admitted,
       (SELECT min(a.time_updated) FROM session_message AS a
        WHERE a.session_id = i.session_id AND a.type = 'assistant' AND a.seq > i.promoted_seq
          AND json_extract(a.data, '$.status') = 'completed') AS answered
FROM session_input AS i WHERE i.promoted_seq IS NOT NULL
"""


def _pids(root: Path) -> dict[str, int]:
    ctx = Context(DataDir(root), start_chroma=False)
    manifest = read_manifest(ctx) or {}
    pids = {"up": manifest.get("pid")}
    pids["chroma"] = (manifest.get("chroma") or {}).get("pid")
    for child in manifest.get("children", []):
        pids[child["name"]] = child["pid"]
    return {k: v for k, v in pids.items() if v}


def _rss_mb(pid: int) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


async def reader(root: Path, stop: asyncio.Event, period: float) -> int:
    """A console-like reader: a read-only status snapshot every `period` seconds."""
    ctx = Context(DataDir(root), read_only=True, start_chroma=False)
    reads = 0
    while not stop.is_set():
        await ops.status(ctx)
        reads += 1
        try:
            await asyncio.wait_for(stop.wait(), period)
        except TimeoutError:
            pass
    await ctx.close()
    return reads


async def sample(root: Path, stop: asyncio.Event, every: float, out: list[dict[str, Any]]) -> None:
    started = time.monotonic()
    while not stop.is_set():
        wal = root / "state.db-wal"
        out.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "wal_mb": round(wal.stat().st_size / 2**20, 2) if wal.exists() else 0.0,
                "rss_mb": {name: _rss_mb(pid) for name, pid in _pids(root).items()},
            }
        )
        try:
            await asyncio.wait_for(stop.wait(), every)
        except TimeoutError:
            pass


async def soak(
    root: Path, minutes: float, rate: float, reader_period: float, sessions: int = 6
) -> dict[str, Any]:
    env = dict(os.environ, REM_AGENT_DELAY_MS=os.environ.get("REM_AGENT_DELAY_MS", "100"))
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backend.cli.app",
            "up",
            "--data",
            str(root),
            "--load",
            "--load-rate",
            str(rate),
            "--load-sessions",
            str(sessions),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    stop = asyncio.Event()
    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while not _pids(root).get("chroma") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        tasks = [
            asyncio.create_task(reader(root, stop, reader_period)),
            asyncio.create_task(sample(root, stop, 10.0, samples)),
        ]
        await asyncio.sleep(minutes * 60)
        os.kill(up.pid, signal.SIGUSR1)  # stop the load, let the daemons finish
        ctx = Context(DataDir(root), read_only=True)
        for _ in range(120):
            result = await ops.check(ctx)
            if result["counts"]["unsettled"] == 0:
                break
            await asyncio.sleep(1)
        check = await ops.check(ctx, settled=True)
        stop.set()
        reads = (await asyncio.gather(*tasks))[0]
        db = await ctx.db()
        rows = await db.fetchall(LATENCY_SQL)
        await ctx.close()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    latencies = sorted(r["answered"] - r["admitted"] for r in rows if r["answered"])
    return {
        "minutes": minutes,
        "rate": rate,
        "sessions": sessions,
        "turns_completed": len(latencies),
        "latency_p50_ms": statistics.median(latencies) if latencies else None,
        "latency_p99_ms": latencies[int(len(latencies) * 0.99) - 1] if latencies else None,
        "status_reads": reads,
        "wal_mb_max": max((s["wal_mb"] for s in samples), default=0),
        "samples": samples,
        "check_ok": check["ok"],
        "check": check,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=4.0, help="load inputs per second")
    parser.add_argument("--reader-period", type=float, default=0.5)
    parser.add_argument(
        "--sessions",
        type=int,
        default=6,
        help="sessions the load spreads over (few: sessions grow long; many: they stay short)",
    )
    parser.add_argument("--data", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the generated data dir (logs, state.db)")
    args = parser.parse_args()
    root = args.data or Path(tempfile.mkdtemp(prefix="rem-soak-")) / "data"
    if args.data is None and not args.keep:
        atexit.register(shutil.rmtree, root.parent, True)
    result = asyncio.run(soak(root, args.minutes, args.rate, args.reader_period, args.sessions))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return
    print(
        f"soak {args.minutes} min at {args.rate} inputs/s: {result['turns_completed']} turns, "
        f"latency p50 {result['latency_p50_ms']} ms p99 {result['latency_p99_ms']} ms, "
        f"WAL max {result['wal_mb_max']} MB, status reads {result['status_reads']}, "
        f"check {'ok' if result['check_ok'] else 'FAILED'}"
    )
    for s in result["samples"]:
        print(f"  t={s['t_s']:>6}s wal={s['wal_mb']:>6} MB rss={s['rss_mb']}")


if __name__ == "__main__":
    main()
