"""Benchmark `ops.status()` on a large data dir (target: p95 < 50 ms, docs/benchmarks.md#status).

python benchmarks/status.py [DIR] [--quick] [--keep]   # DIR from gen_big.py; else generated in a temp dir, removed unless --keep
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context


async def measure(root: Path, rounds: int = 200) -> dict[str, float]:
    ctx = Context(DataDir(root), read_only=True, start_chroma=False)
    await ops.status(ctx)  # warm the page cache and the connection
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        snap = await ops.status(ctx)
        times.append((time.perf_counter() - start) * 1000)
    await ctx.close()
    times.sort()
    return {
        "rounds": rounds,
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(len(times) * 0.95) - 1], 2),
        "max_ms": round(times[-1], 2),
        "leases": len(snap["leases"]),
        "mismatched": len(snap["receipts"]["mismatched"]),
        "sessions": snap["counts"]["sessions"],
        "dream_pending": snap["counts"]["dream_pending"],
    }


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in ("--quick", "--keep")]
    if args:
        root = Path(args[0])
    else:
        from benchmarks.gen_big import generate  # type: ignore[import-not-found]

        root = Path(tempfile.mkdtemp(prefix="rem-big-")) / "data"
        if "--keep" not in sys.argv:  # ~300 MB: gone when the run ends, whatever happens
            atexit.register(shutil.rmtree, root.parent, True)
        scale = 10 if "--quick" in sys.argv else 1
        print(f"generating {root} ...", file=sys.stderr)
        generate(
            root,
            100_000 // scale,
            10,
            10_000 // scale,
            500 // scale,
            2_000 // scale,
            1_000 // scale,
            20_000 // scale,
        )
    result = asyncio.run(measure(root))
    print(json.dumps(result))
    print(
        f"status(): p50 {result['p50_ms']} ms, p95 {result['p95_ms']} ms, max {result['max_ms']} ms "
        f"over {result['rounds']} rounds ({result['sessions']} sessions, {result['leases']} leases, "
        f"{result['mismatched']} mismatched receipts)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
