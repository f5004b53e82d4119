"""Dream benchmark: selection query cost at scale, and sessions digested per second.

    .venv/bin/python benchmarks/dream.py [--sessions 100000] [--pending 1000] [--digest 300] [--json]

Prints EXPLAIN QUERY PLAN of the selection query (it must use
dream_state_pending_idx), its latency over a 100 000-session state.db with
1 000 pending, and the digestion rate with and without the Chroma overlay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.chroma import server as chroma_server
from backend.chroma.ownership import summary_row_id
from backend.core.datadir import DataDir
from backend.dream.digester import SELECT_PENDING_SQL, Dreamer, select_pending
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.handoffs import publish_input_revision
from backend.store.revision import raw_revision

NOW = 1_800_000_000_000


async def _populate(db: Database, sessions: int, pending: int) -> None:
    """`sessions` dream_state rows, `pending` of them not at their revision (mixed lanes)."""
    rng = random.Random(7)
    pending_ids = set(rng.sample(range(sessions), pending))
    async with db.tx() as conn:
        await conn.executemany(
            "INSERT INTO session (id, time_created, time_updated) VALUES (?, ?, ?)",
            ((f"s{i:06d}", NOW, NOW) for i in range(sessions)),
        )
        rows = []
        for i in range(sessions):
            rev = f"sha256:{i:064x}"
            published = NOW - rng.randrange(86_400_000)
            if i not in pending_ids:
                rows.append((f"s{i:06d}", rev, rev, "digested", 0, published))
                continue
            lane = rng.random()  # 70% never tried, 20% retry due, 10% backing off or parked
            nxt = 0 if lane < 0.7 else NOW - rng.randrange(60_000) if lane < 0.9 else NOW + 60_000
            state = "pending" if lane < 0.7 else "deferred"
            rows.append((f"s{i:06d}", rev, None, state, nxt, published))
        await conn.executemany(
            "INSERT INTO dream_state (session_id, input_revision, completed_revision, digest_state, "
            "next_attempt_at, time_published, time_updated) VALUES (?, ?, ?, ?, ?, ?, 0)",
            rows,
        )
    await db.conn.execute("ANALYZE")


async def bench_selection(root: Path, sessions: int, pending: int, runs: int = 300) -> dict[str, Any]:
    db = await Context(DataDir(root), start_chroma=False).db()
    t0 = time.perf_counter()
    await _populate(db, sessions, pending)
    build_s = time.perf_counter() - t0
    plan = [
        r["detail"]
        for r in await db.fetchall("EXPLAIN QUERY PLAN " + SELECT_PENDING_SQL, {"now": NOW, "limit": 32})
    ]
    timings = []
    for _ in range(runs):
        t = time.perf_counter()
        got = await select_pending(db, NOW, 32)
        timings.append((time.perf_counter() - t) * 1000)
    assert len(got) == 32
    eligible = await db.scalar(
        "SELECT count(*) FROM dream_state INDEXED BY dream_state_pending_idx "
        "WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision "
        "AND next_attempt_at <= ?",
        (NOW,),
    )
    await db.close()
    return {
        "sessions": sessions,
        "pending": pending,
        "eligible_now": eligible,
        "build_s": round(build_s, 2),
        "select_ms_median": round(statistics.median(timings), 3),
        "select_ms_p99": round(sorted(timings)[int(runs * 0.99) - 1], 3),
        "plan": plan,
    }


def _texts(i: int, turns: int) -> list[str]:
    rng = random.Random(i)
    names = ["Kafka", "Postgres", "Redis", "SQLite", "Chroma", "Linux", "Textual"]
    words = ["latency", "storage", "budget", "replica", "journal", "snapshot", "cursor", "backlog", "lease"]
    return [
        f"We tuned {rng.choice(names)} with {rng.choice(names)} for {rng.choice(words)} and "
        f"{rng.choice(words)}; the {rng.choice(words)} of turn {j} uses {rng.choice(names)}."
        for j in range(turns)
    ]


async def _load_sessions(ctx: Context, sessions: int, turns: int, with_chroma: bool) -> None:
    db = await ctx.db()
    async with db.tx() as conn:
        for i in range(sessions):
            sid = f"b{i:05d}"
            await conn.execute(
                "INSERT INTO session (id, time_created, time_updated, last_seq) VALUES (?, ?, ?, ?)",
                (sid, NOW, NOW, turns),
            )
            await conn.executemany(
                "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        f"{sid}-{j:04d}",
                        sid,
                        "user" if j % 2 == 0 else "assistant",
                        j + 1,
                        NOW + j,
                        NOW + j,
                        json.dumps({"text": t, "status": "completed"}),
                    )
                    for j, t in enumerate(_texts(i, turns))
                ],
            )
            revision, _ = await raw_revision(conn, sid)
            await publish_input_revision(conn, sid, revision, NOW + i)
    if with_chroma:
        ids = [summary_row_id(f"b{i:05d}") for i in range(sessions)]
        for start in range(0, sessions, 100):
            part = ids[start : start + 100]
            await ctx.store().upsert(part, [f"summary {x}" for x in part], [{"sessionId": x} for x in part])


async def bench_digest(root: Path, sessions: int, turns: int, chroma_url: str | None) -> dict[str, Any]:
    ctx = Context(DataDir(root), chroma_url=chroma_url, start_chroma=False, collection="bench_dream")
    try:
        await _load_sessions(ctx, sessions, turns, chroma_url is not None)
        dreamer = Dreamer(ctx)
        await dreamer.open()
        t0 = time.perf_counter()
        while await dreamer.run_pass():
            pass
        elapsed = time.perf_counter() - t0
        db = await ctx.db()
        done = await db.scalar("SELECT count(*) FROM dream_state WHERE completed_revision IS input_revision")
        nodes = await db.scalar("SELECT count(*) FROM graph_node")
        edges = await db.scalar("SELECT count(*) FROM graph_edge")
        overlays = await db.scalar("SELECT count(*) FROM dream_state WHERE overlay_pending = 0")
    finally:
        await ctx.close()
    return {
        "sessions": sessions,
        "turns_per_session": turns,
        "digested": done,
        "seconds": round(elapsed, 2),
        "sessions_per_s": round(done / elapsed, 1),
        "turns_per_s": round(done * turns / elapsed, 1),
        "graph_nodes": nodes,
        "graph_edges": edges,
        "overlays_confirmed": overlays,
        "chroma_overlay": chroma_url is not None,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import chromadb  # noqa: F401  (imported once up front: ~1 s that no digestion should be charged)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        selection = await bench_selection(root / "sel", args.sessions, args.pending)
        all_pending = await bench_selection(root / "sel_all", args.sessions, args.sessions, runs=100)
        graph_only = await bench_digest(root / "dig", args.digest, args.turns, None)
        server = chroma_server.resolve(DataDir(root / "chroma").ensure())
        try:
            with_chroma = await bench_digest(root / "dig_chroma", args.digest, args.turns, server.url)
        finally:
            server.stop()
    return {
        "selection": selection,
        "selection_all_pending": all_pending,
        "digest_graph_only": graph_only,
        "digest_with_chroma": with_chroma,
    }


def _print(result: dict[str, Any]) -> None:
    sel = result["selection"]
    print("EXPLAIN QUERY PLAN (selection):")
    for line in sel["plan"]:
        print("  " + line)
    print(
        f"selection, {sel['sessions']} sessions / {sel['pending']} pending ({sel['eligible_now']} ready now): "
        f"median {sel['select_ms_median']} ms, p99 {sel['select_ms_p99']} ms"
    )
    worst = result["selection_all_pending"]
    print(
        f"selection, {worst['sessions']} sessions all pending: median {worst['select_ms_median']} ms, "
        f"p99 {worst['select_ms_p99']} ms"
    )
    for key in ("digest_graph_only", "digest_with_chroma"):
        d = result[key]
        print(
            f"{key}: {d['digested']} sessions x {d['turns_per_session']} turns in {d['seconds']} s = "
            f"{d['sessions_per_s']} sessions/s ({d['turns_per_s']} turns/s); graph {d['graph_nodes']} nodes, "
            f"{d['graph_edges']} edges; overlays confirmed {d['overlays_confirmed']}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--pending", type=int, default=1_000)
    parser.add_argument("--digest", type=int, default=300)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    logging.getLogger("rem").setLevel(logging.ERROR)  # the graph-only run has no Chroma, by design
    out = asyncio.run(main(ns))
    if ns.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
