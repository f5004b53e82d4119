"""Benchmark the session-scoped dense turn search (`rem recall --session`): Chroma's filtered search vs by id.

Builds one project's turn collection in a real `chroma run` server: `--turns`
random 256-d vectors (only how Chroma searches them matters here) over
sessions of `--per-session` turns, plus one session of `--big-session`
turns, with their `memory_turn` rows in state.db. Then times, `--queries`
random query vectors each, n = the recall config's dense candidates:

* Chroma's search of the whole collection (no filter);
* Chroma's where-filtered search (`{"sessionId": S}`) for a usual session
  and for the big one;
* rem's `vector_search.dense` for the same sessions (the session's vectors fetched by id
  and ranked in process, up to SESSION_BY_ID_MAX turns).

Prints p50/p95 in ms per line, then one JSON document.

    python benchmarks/session_search.py --turns 50000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.core.datadir import DataDir
from backend.memory import vector_search
from backend.memory.config import recall_config
from backend.memory.scope import Scope
from backend.runtime.context import Context
from benchmarks.summary_search import run_and_print, timed

BATCH = 2000
PROJECT = "default"


async def build(
    ctx: Context, turns: int, per_session: int, big: int, rng: np.random.Generator
) -> dict[str, Any]:
    sessions = [f"s{i // per_session}" for i in range(turns)] + ["big"] * big
    db = await ctx.db()
    store = ctx.turn_store(PROJECT)
    started = time.monotonic()
    async with db.tx() as conn:
        await conn.executemany(
            "INSERT INTO session (id, project, time_created, time_updated) VALUES (?, ?, 0, 0)",
            [(s, PROJECT) for s in dict.fromkeys(sessions)],
        )
        await conn.executemany(
            "INSERT INTO memory_turn (message_id, session_id, project, ord, role, speaker, time, digest, "
            "vector_digest, revision, time_indexed) VALUES (?, ?, ?, ?, 'user', '', 0, 'd', 'd', 'r', 0)",
            [(f"m{i}", s, PROJECT, i) for i, s in enumerate(sessions)],
        )
    for start in range(0, len(sessions), BATCH):
        ids = range(start, min(len(sessions), start + BATCH))
        vectors = rng.standard_normal((len(ids), 256)).astype(np.float32)
        await store.upsert(
            [f"m{i}" for i in ids],
            [f"turn {i}" for i in ids],
            [{"project": PROJECT, "sessionId": sessions[i]} for i in ids],
            embeddings=vectors.tolist(),
        )
    return {"turns": len(sessions), "build_s": round(time.monotonic() - started, 1)}


async def measure(ctx: Context, queries: list[list[float]], per_session: int, big: int) -> dict[str, Any]:
    store = ctx.turn_store(PROJECT)
    config = recall_config()
    n = config.dense_candidates
    out: dict[str, Any] = {"n": n, "session_by_id_max": vector_search.SESSION_BY_ID_MAX}
    out["chroma_unfiltered"] = await timed(lambda v: store.nearest(v, n), queries)
    for session, size in (("s7", per_session), ("big", big)):
        out[f"chroma_filtered[{session}: {size} turns]"] = await timed(
            lambda v, s=session: store.nearest(v, n, {"sessionId": s}), queries
        )
        scope = Scope(PROJECT, session)
        out[f"rem[{session}: {size} turns]"] = await timed(
            lambda v, s=scope: vector_search.dense(ctx, v, s, config), queries
        )
    return out


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    ctx = Context(DataDir(root / "data"))
    try:
        result = await build(ctx, args.turns, args.per_session, args.big_session, rng)
        queries = rng.standard_normal((args.queries, 256)).astype(np.float32).tolist()
        result.update(await measure(ctx, queries, args.per_session, args.big_session))
    finally:
        await ctx.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50000)
    parser.add_argument("--per-session", type=int, default=200)
    parser.add_argument("--big-session", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    run_and_print("rem-session-search-", lambda root: run(args, root), None)


if __name__ == "__main__":
    main()
