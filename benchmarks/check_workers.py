"""`rem check`'s state.db part in one process vs in worker processes, alternating, on one data dir.

    python benchmarks/check_workers.py DATA_DIR [--rounds 3]

DATA_DIR is a data dir of `benchmarks/scale.py` (its cache, `scale-1x` or
`scale-10x`). Each round runs `check_database_in_batches` with `workers=1`,
then with the default (one per core, at most 4), on one read-only context,
and checks the two reports are identical (counts and listed rows). Prints
the seconds of each round per side and whether the findings were the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.ops.checks import CHECK_WORKERS, check_database_in_batches, summarize
from backend.runtime.context import Context


async def run(root: Path, rounds: int) -> dict[str, object]:
    ctx = Context(DataDir(root), start_chroma=False, read_only=True)
    db = await ctx.db()
    seconds: dict[int, list[float]] = {1: [], CHECK_WORKERS: []}
    reports: dict[int, object] = {}
    try:
        for _ in range(rounds):
            for workers in seconds:
                started = time.perf_counter()
                report = await check_database_in_batches(db, workers=workers)
                seconds[workers].append(round(time.perf_counter() - started, 2))
                reports[workers] = summarize(report, settled=False)
    finally:
        await ctx.close()
    return {
        "one_process_s": seconds[1],
        f"{CHECK_WORKERS}_workers_s": seconds[CHECK_WORKERS],
        "same_findings": reports[1] == reports[CHECK_WORKERS],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.data, args.rounds))))


if __name__ == "__main__":
    main()
