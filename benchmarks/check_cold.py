"""`rem check`'s state.db part from a cold page cache, with and without reading the file ahead.

    python benchmarks/check_cold.py (DATA_DIR | --scale {1,10}) [--rounds 2]

DATA_DIR is a data dir of `benchmarks/scale.py` (its cache, `scale-1x` or
`scale-10x`; `--scale N` takes that cache's, built first if missing). Before each run, state.db's and its WAL's pages are dropped from
the page cache (`posix_fadvise(DONTNEED)`, which needs no root; the share still
cached is printed, so a kernel that ignores it shows). Each round then runs
`check_database_in_batches` twice, alternating: without `warm_page_cache` (as
before it existed), then as `rem check` runs it. Prints the seconds of each run,
its structure phase (`quick_check` and the foreign keys, the part that reads
every page), and whether the two reports were the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from backend.ops import checks
from backend.ops.checks import check_database_in_batches, summarize
from backend.runtime.context import Context
from backend.store import maintenance


def evict(state: Path) -> float:
    """Drop state.db's (and its WAL's) cached pages; the share of state.db still cached."""
    for path in (state, state.with_name(state.name + "-wal")):
        if path.exists():
            maintenance.evict_page_cache(path)
    return round(maintenance.page_cache_share(state), 4)


async def one_run(ctx: Context, warm: bool) -> tuple[dict[str, Any], Any]:
    db = await ctx.db()
    phases: dict[str, float] = {}
    started = time.perf_counter()

    def progress(phase: str, _done: int, _total: int) -> None:
        phases.setdefault(phase, time.perf_counter())

    original = checks.warm_page_cache
    if not warm:
        checks.warm_page_cache = lambda _path, **_kw: 0  # type: ignore[assignment]
    try:
        report = await check_database_in_batches(db, progress=progress)
    finally:
        checks.warm_page_cache = original
    seconds = time.perf_counter() - started
    structure = phases.get("sessions", started + seconds) - phases.get("structure", started)
    return {"s": round(seconds, 1), "structure_s": round(structure, 1)}, summarize(report, settled=False)


async def run(root: Path, rounds: int) -> dict[str, Any]:
    ctx = Context(DataDir(root), start_chroma=False, read_only=True)
    state = root / "state.db"
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "cold_read_ahead": []}
    reports: dict[str, Any] = {}
    try:
        await ctx.db()
        for _ in range(rounds):
            for name, warm in (("cold", False), ("cold_read_ahead", True)):
                cached = evict(state)
                measured, reports[name] = await one_run(ctx, warm)
                runs[name].append({**measured, "cached_before": cached})
                print(name, runs[name][-1], file=sys.stderr, flush=True)
    finally:
        await ctx.close()
    return {
        "bytes": state.stat().st_size,
        **runs,
        "same_findings": reports["cold"] == reports["cold_read_ahead"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?")
    parser.add_argument(
        "--scale", type=int, choices=(1, 10), help="benchmarks/scale.py's data dir of this scale"
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = args.data
    if root is None:
        if not args.scale:
            parser.error("give a DATA_DIR or --scale")
        from benchmarks.scale import default_cache, ensure_data

        root, _ = ensure_data(args.scale, default_cache())
    print(json.dumps({"data_dir": str(root), **asyncio.run(run(root, args.rounds))}))


if __name__ == "__main__":
    main()
