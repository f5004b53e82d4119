"""Benchmark the summary side of recall for large projects: Chroma's filtered search vs rem's path.

Builds a data dir with `--rows` sessions and one summary row each (random
256-d vectors, as many as WordLlama gives; the vectors' meaning does not
matter here, only how Chroma searches them) in a real `chroma run` server:
half the sessions in `default`, ten projects of 4 % each, four of 0.75 % each
(750 of 100 000: past fetching by id, a small share for the wide query), the
rest in 2 000 small projects. Then times, `--queries` random query vectors each:

* Chroma's search of the whole collection (no filter), n = 5;
* Chroma's where-filtered search (`{"project": P}`), n = 5, for the big, a
  medium and a small project;
* ranking among the project's own rows fetched by id (`nearest_among`), for
  projects of at most 2 000 sessions;
* rem's `vector_search.summary_hits` for the same projects (recall's summary retriever:
  by id for a project of at most SUMMARIES_BY_ID sessions, else the whole
  collection's nearest rows kept when in scope, as many as the project's
  share of the sessions needs, else the filtered search).

Prints p50/p95 in ms per line, then one JSON document. With `--keep DIR` the
data dir is built there once and reused by later runs (new random queries).

    python benchmarks/summary_search.py --rows 100000 [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.core.datadir import DataDir
from backend.memory import vector_search
from backend.memory.config import recall_config
from backend.memory.scope import Scope
from backend.runtime.context import Context

BATCH = 2000


def project_of(i: int, r: float) -> str:
    if r < 0.5:
        return "default"
    if r < 0.9:
        return f"medium-{int(r * 250) % 10}"
    if r < 0.93:
        return f"band-{i % 4}"
    return f"small-{i % 2000}"


async def build(ctx: Context, rows: int, rng: np.random.Generator) -> dict[str, Any]:
    projects = [project_of(i, float(r)) for i, r in enumerate(rng.random(rows))]
    db = await ctx.db()
    store = ctx.store()
    started = time.monotonic()
    async with db.tx() as conn:
        await conn.executemany(
            "INSERT INTO session (id, project, time_created, time_updated) VALUES (?, ?, ?, ?)",
            [(f"s{i}", p, i, i) for i, p in enumerate(projects)],
        )
    for start in range(0, rows, BATCH):
        ids = range(start, min(rows, start + BATCH))
        vectors = rng.standard_normal((len(ids), 256)).astype(np.float32)
        await store.upsert(
            [f"summary_s{i}" for i in ids],
            [f"summary of session s{i}" for i in ids],
            [{"project": projects[i], "sessionId": f"s{i}"} for i in ids],
            embeddings=vectors.tolist(),
        )
    return {"rows": rows, "build_s": round(time.monotonic() - started, 1)}


def pcts(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": round(values[len(values) // 2], 1),
        "p95": round(values[min(len(values) - 1, int(len(values) * 0.95))], 1),
    }


async def timed(fn: Any, queries: list[list[float]]) -> dict[str, float]:
    await fn(queries[0])  # warm
    latencies = []
    for vector in queries:
        started = time.perf_counter()
        await fn(vector)
        latencies.append((time.perf_counter() - started) * 1000)
    return pcts(latencies)


async def measure(ctx: Context, queries: list[list[float]]) -> dict[str, Any]:
    store = ctx.store()
    db = await ctx.db()
    config = recall_config()
    out: dict[str, Any] = {}
    out["chroma_unfiltered"] = await timed(lambda v: store.query(v, config.summaries, None), queries)
    for project in ("default", "medium-3", "band-1", "small-17"):
        out[f"chroma_filtered[{project}]"] = await timed(
            lambda v, p=project: store.query(v, config.summaries, {"project": p}), queries
        )
        ids = [
            f"summary_{r[0]}"
            for r in await db.fetchall("SELECT id FROM session WHERE project = ?", (project,))
        ]
        if len(ids) <= 2000:  # ranking among the project's own rows fetched by id: small projects only
            out[f"by_id[{project}]({len(ids)} ids)"] = await timed(
                lambda v, i=ids: store.nearest_among(i, v, config.summaries), queries
            )
        scope = Scope(project)
        out[f"rem[{project}]"] = await timed(
            lambda v, s=scope: vector_search.summary_hits(ctx, v, s, config), queries
        )
    return out


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    ctx = Context(DataDir(root / "data"))
    try:
        if (root / "built.json").exists():
            result = json.loads((root / "built.json").read_text())  # fresh random queries, same rows
        else:
            result = await build(ctx, args.rows, rng)
            (root / "built.json").write_text(json.dumps(result))
        queries = rng.standard_normal((args.queries, 256)).astype(np.float32).tolist()
        result.update(await measure(ctx, queries))
    finally:
        await ctx.close()
    return result


def run_and_print(
    prefix: str, run_in: Callable[[Path], Awaitable[dict[str, Any]]], keep: Path | None
) -> None:
    """`run_in(dir)` in a temp dir (removed after) or in `keep`; its figures as lines on stderr, JSON on stdout."""
    root = keep or Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = asyncio.run(run_in(root))
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:>{width}}  {value}", file=sys.stderr)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="build in this dir and keep it (reused when it exists)")
    args = parser.parse_args()
    run_and_print("rem-summary-search-", lambda root: run(args, root), args.keep)


if __name__ == "__main__":
    main()
