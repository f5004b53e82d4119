"""The operator view at scale: status(), a metrics scrape, `rem check` and the query plans, on one big data dir.

    python benchmarks/scale.py [--scale 10] [--cache DIR] [--rounds 200] [--scrapes 30] [--plans]

`--scale 10` is 1 000 000 sessions / 10 000 000 messages / 100 000 receipts
(5 000 mismatched) / 20 000 leases (a quarter expired, owned by a dead
worker) / 10 000 Dream-pending / 200 000 journal rows; `--scale 1` is a tenth
of that (the README's 100 000 sessions). The data dir is built once into
`--cache` (default: the user cache dir, `rem/scale-<N>x`) and reused; its
build time and size are reported with the figures (building the 10x one
takes a while and about 5 GB). Targets (docs/benchmarks.md): status() p95 < 50 ms,
scrape p95 < 100 ms, `rem check` < 60 s.

* status(): `ops.status` over one long-lived read-only context (the console's
  and the exporter's way), `--rounds` times with nothing committed between
  calls (the snapshot's rows reused), then `--rounds` times re-reading them as
  after a commit, then the same plus the OpenMetrics rendering (a scrape's work).
* scrape: a real `rem metrics --listen 127.0.0.1:0` process; scrapes 1.1 s
  apart (each takes a snapshot; the data dir is not written, so its rows are
  reused), then warm ones (the exporter's 1 s cache).
* check: `ops.check` on the state.db (Chroma's half is the receipts benchmark),
  with its phases' times and the longest single read it held.
* plans: EXPLAIN QUERY PLAN of every status, totals and tally query.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context

SHAPES = {
    10: dict(
        sessions=1_000_000,
        per_session=10,
        receipts=100_000,
        mismatched=5_000,
        leases=20_000,
        dream_pending=10_000,
        events=200_000,
    ),
    1: dict(
        sessions=100_000,
        per_session=10,
        receipts=10_000,
        mismatched=500,
        leases=2_000,
        dream_pending=1_000,
        events=20_000,
    ),
}


def default_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("rem", appauthor=False))


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def ensure_data(scale: int, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The cached data dir of this scale, built on first use; (path, shape + build seconds + bytes)."""
    from benchmarks.gen_big import generate

    root = cache / f"scale-{scale}x"
    info_path = cache / f"scale-{scale}x.json"
    if (root / "state.db").exists() and info_path.exists():
        info = json.loads(info_path.read_text())
        # a data dir cached by an older rem: bring it to this schema (the measurements open it
        # read-only, which refuses an older schema), timing the migration
        started = time.perf_counter()
        asyncio.run(_migrate(root))
        info["migrated_s"] = round(time.perf_counter() - started, 2)
    else:
        if root.exists():
            raise SystemExit(f"{root} exists without {info_path}: remove it (a build that did not finish)")
        cache.mkdir(parents=True, exist_ok=True)
        print(f"building {root} (once) ...", file=sys.stderr)
        started = time.perf_counter()
        shape = generate(root, **SHAPES[scale])  # type: ignore[arg-type]
        info = {**shape, "build_s": round(time.perf_counter() - started, 1)}
        info_path.write_text(json.dumps(info))
    info["bytes"] = dir_bytes(root)
    return root, info


async def _migrate(root: Path) -> None:
    ctx = Context(DataDir(root), start_chroma=False)
    try:
        await ctx.db()  # a writable open migrates
    finally:
        await ctx.close()


def spread(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "n": len(times),
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 2),
        "max_ms": round(times[-1], 2),
        "min_ms": round(times[0], 2),
    }


async def measure_status(root: Path, rounds: int) -> dict[str, Any]:
    """status() with nothing committed between calls (rows reused), then re-reading every time.

    The data dir is not written to, so "after a commit" drops the snapshot's
    cache before each call: exactly what a commit by another process does to it
    (and the costlier case, the one the console meets under load). The
    in-process scrape is that status() plus rendering it as OpenMetrics.
    """
    from backend.ops import actions, prometheus

    ctx = Context(DataDir(root), read_only=True, start_chroma=False)
    out: dict[str, Any] = {}
    try:
        first_started = time.perf_counter()
        await ops.status(ctx)  # the first call also folds the journal tally
        out["first_ms"] = round((time.perf_counter() - first_started) * 1000, 1)
        cache = actions._SNAPSHOT_CACHES[await ctx.db()]
        for mode in ("unchanged", "after_commit", "scrape_after_commit"):
            times = []
            for _ in range(rounds):
                if mode != "unchanged":
                    cache.key = None
                started = time.perf_counter()
                snap = await ops.status(ctx)
                if mode == "scrape_after_commit":
                    prometheus.exposition(snap)
                times.append((time.perf_counter() - started) * 1000)
            out[mode] = spread(times)
    finally:
        await ctx.close()
    return {
        **out,
        "sessions": snap["counts"]["sessions"],
        "leases": sum(t["held"] for t in snap["totals"]["leases"].values()),
        "leases_listed": len(snap["leases"]),
        "mismatched": snap["counts"]["mismatches"],
    }


def measure_scrapes(root: Path, cold: int, warm: int = 200) -> dict[str, Any]:
    rem = str(Path(sys.executable).parent / "rem")
    proc = subprocess.Popen(
        [rem, "metrics", "--listen", "127.0.0.1:0", "--data", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = line.split("serving ")[1].split()[0]

        def scrape() -> float:
            started = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as response:
                response.read()
            return (time.perf_counter() - started) * 1000

        scrape()  # the exporter's first snapshot folds the journal tally
        cold_ms = []
        for _ in range(cold):
            time.sleep(1.1)  # past the 1 s cache: every one of these takes a fresh snapshot
            cold_ms.append(scrape())
        warm_ms = [scrape() for _ in range(warm)]
    finally:
        proc.terminate()
        proc.wait(30)
    return {"cold": spread(cold_ms), "warm": spread(warm_ms)}


async def measure_check(root: Path) -> dict[str, Any]:
    ctx = Context(DataDir(root), read_only=True, start_chroma=False)
    phases: dict[str, float] = {}
    last = [time.perf_counter(), 0.0]
    longest = [0.0]

    def progress(phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        longest[0] = max(longest[0], now - last[0])  # one batch: one read transaction
        last[0] = now
        phases.setdefault(phase, now)

    started = time.perf_counter()
    try:
        result = await ops.check(ctx, verify_chroma=False, progress=progress)
    finally:
        await ctx.close()
    took = time.perf_counter() - started
    order = sorted(phases.items(), key=lambda kv: kv[1])
    phase_s = {
        name: round((order[i + 1][1] if i + 1 < len(order) else started + took) - at, 1)
        for i, (name, at) in enumerate(order)
    }
    return {
        "seconds": round(took, 1),
        "phases_s": phase_s,
        "longest_read_ms": round(longest[0] * 1000, 1),
        "violations": result["counts"]["violations"],
        "unsettled": result["counts"]["unsettled"],
        "findings": sorted(f["what"] for f in result["violations"] + result["unsettled"]),
    }


def query_plans(root: Path) -> dict[str, list[str]]:
    import sqlite3

    from backend.ops import throughput
    from backend.ops.status_queries import PLAN_PARAMS, STATUS_QUERIES

    conn = sqlite3.connect(f"{(root / 'state.db').as_uri()}?mode=ro", uri=True)
    params = dict(PLAN_PARAMS)
    queries = {**STATUS_QUERIES, "tally": throughput.FOLD_SQL, "tally_latency": throughput.LATENCY_SQL}
    try:
        return {
            name: [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
            for name, sql in queries.items()
        }
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, choices=sorted(SHAPES), default=10)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--plans", action="store_true", help="print the query plans too")
    args = parser.parse_args()
    root, info = ensure_data(args.scale, args.cache or default_cache())
    result: dict[str, Any] = {"scale": args.scale, "data_dir": str(root), "data": info}
    result["status"] = asyncio.run(measure_status(root, args.rounds))
    result["scrape"] = measure_scrapes(root, args.scrapes)
    if not args.no_check:
        result["check"] = asyncio.run(measure_check(root))
    if args.plans:
        result["plans"] = query_plans(root)
    import os

    result["load_avg"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(result))
    s, sc = result["status"], result["scrape"]
    u, c = s["unchanged"], s["after_commit"]
    print(
        f"scale {args.scale}x ({info['sessions']:,} sessions, {info['messages']:,} messages, "
        f"{info['bytes'] / 2**30:.2f} GiB, built in {info['build_s']} s): status() unchanged p50 "
        f"{u['p50_ms']} p95 {u['p95_ms']} ms, after a commit p50 {c['p50_ms']} p95 {c['p95_ms']} ms; "
        f"scrape after a commit (in process) p95 {s['scrape_after_commit']['p95_ms']} ms; "
        f"exporter scrape p95 {sc['cold']['p95_ms']} ms, warm p95 {sc['warm']['p95_ms']} ms"
        + (
            f"; rem check {result['check']['seconds']} s (longest read {result['check']['longest_read_ms']} ms)"
            if "check" in result
            else ""
        )
        + f"; load {result['load_avg'][0]}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
