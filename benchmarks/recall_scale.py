"""Recall at scale: 100 000 sessions' summaries and 1 000 000 turns, p50/p95 per query.

    .venv/bin/python benchmarks/recall_scale.py --data ../shared/data/locomo [--turns 1000000]
        [--sessions 100000] [--queries 500] [--vector-projects N] [--keep DIR] [--reuse DIR] [--json]

The corpus: LoCoMo's raw turns replicated until there are `--turns`, each
replica its own project with its two speakers renamed (so term statistics
stay realistic and names spread over many projects), each LoCoMo session
split into `sessions / turns`-sized rem sessions. It is written the way rem
writes it, at full size: `session`, `session_message`, `memory_turn` and its
rows in each project's FTS5 table in state.db (in bulk, the same row shapes `backend.memory.index`
writes), every turn's WordLlama vector in the Chroma turn collection, and
one summary row per session in the summary collection (document: the
session's first turns; metadata: project and session). Build times are
reported per part.

With `--vector-projects N`, turn vectors are written for the first N
projects only (and queries go to those): every part a query shares with the
whole corpus (state.db, its one FTS5 table, the summary collection) is at
full size, while the other projects' own turn collections, which no query in
another project reads, are left out (at ~450 vectors/s, Chroma's ingest of
1 000 000 turn vectors alone takes ~40 minutes on this machine).

Queries: the LoCoMo questions, names renamed as in a random replica, each
recalled in that replica's project through `backend.memory.recall.recall`
(the default pipeline: FTS5 + dense + graph + summaries + facts, k=10) on a
warm process; p50, p95 and max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.chroma import server as chroma_server
from backend.core.datadir import DataDir
from backend.memory import recall as memory_recall
from backend.memory.index import plan_session
from backend.memory.text import FTS_TABLES_SQL, fts_table, fts_table_ddl
from backend.runtime.context import Context
from benchmarks.locomo import load, to_jsonl

NAMES = """James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara Richard
Susan Joseph Jessica Thomas Sarah Charles Karen Christopher Lisa Daniel Nancy Matthew Betty Anthony Margaret
Mark Sandra Donald Ashley Steven Kimberly Paul Emily Andrew Donna Joshua Michelle Kenneth Carol Kevin Amanda
Brian Dorothy George Melissa Timothy Deborah Ronald Stephanie Edward Rebecca Jason Sharon Jeffrey Laura Ryan
Cynthia Jacob Kathleen Gary Amy Nicholas Angela Eric Shirley Jonathan Anna Stephen Brenda Larry Pamela""".split()
BATCH = 5000


def replicas(convs: dict[str, Any], turns: int, sessions: int) -> Any:
    """(project, speaker map, [(session id, [line, ...]), ...]) per replica, until `turns` lines."""
    base = {cid: to_jsonl(cid, conv) for cid, conv in convs.items()}
    per_session = max(1, round(turns / sessions))
    rng = random.Random(0)
    made = r = 0
    while made < turns:
        for cid, lines in base.items():
            a, b = rng.sample(NAMES, 2)
            speakers = [convs[cid]["speaker_a"], convs[cid]["speaker_b"]]
            rename = dict(zip(speakers, (a, b), strict=True))
            pattern = re.compile(r"\b(" + "|".join(map(re.escape, speakers)) + r")\b")
            project = f"r{r}c{cid}"
            groups: dict[str, list[dict[str, Any]]] = {}
            for line in lines:
                groups.setdefault(line["session"], []).append(line)
            out = []
            for sid, group in groups.items():
                for part in range(0, len(group), per_session):
                    chunk = []
                    for line in group[part : part + per_session]:
                        chunk.append(
                            {
                                **line,
                                "id": f"r{r}-{line['id']}",
                                "speaker": rename[line["speaker"]],
                                "text": pattern.sub(lambda m, names=rename: names[m.group(1)], line["text"]),
                            }
                        )
                    out.append((f"r{r}-{sid}-{part // per_session}", chunk))
                    made += len(chunk)
            yield project, rename, out
            if made >= turns:
                return
        r += 1


async def build(
    ctx: Context, convs: dict[str, Any], turns: int, sessions: int, vector_projects: int | None
) -> dict[str, Any]:
    db = await ctx.db()
    times: dict[str, float] = {"state_db_s": 0.0, "turn_vectors_s": 0.0, "summaries_s": 0.0}
    counts = {"projects": 0, "sessions": 0, "turns": 0, "turn_vectors": 0}
    pending: list[Any] = []
    summaries: list[tuple[str, str, dict[str, Any]]] = []
    # the projects whose turn vectors are written (None: all)
    with_vectors: set[str] | None = None if vector_projects is None else set()
    for project, _rename, groups in replicas(convs, turns, sessions):
        counts["projects"] += 1
        if with_vectors is not None and len(with_vectors) < (vector_projects or 0):
            with_vectors.add(project)
        for sid, lines in groups:
            records = [
                {"id": ln["id"], "role": ln["role"], "text": ln["text"], "time": ln["time"]} for ln in lines
            ]
            plan = plan_session(sid, project, records, {ln["id"]: ln["speaker"] for ln in lines})
            pending.append((project, sid, lines, plan))
            doc = " ".join(f"{ln['speaker']}: {ln['text']}" for ln in lines[:4])
            summaries.append((f"summary_{sid}", doc, {"project": project, "sessionId": sid}))
            counts["sessions"] += 1
            counts["turns"] += len(lines)
        if sum(len(p[2]) for p in pending) >= BATCH * 4:
            counts["turn_vectors"] += await _flush(ctx, pending, times, with_vectors)
            pending = []
    counts["turn_vectors"] += await _flush(ctx, pending, times, with_vectors)
    started = time.monotonic()
    for start in range(0, len(summaries), BATCH):
        chunk = summaries[start : start + BATCH]
        await ctx.store().upsert([c[0] for c in chunk], [c[1] for c in chunk], [c[2] for c in chunk])
    times["summaries_s"] = time.monotonic() - started
    started = time.monotonic()
    await db.write_in_thread(_optimize_sync)
    times["fts_optimize_s"] = time.monotonic() - started
    return {**counts, **{k: round(v, 1) for k, v in times.items()}}


async def _flush(
    ctx: Context, pending: list[Any], times: dict[str, float], with_vectors: set[str] | None
) -> int:
    """Write `pending` sessions to state.db and their turn vectors to Chroma; the vectors written."""
    if not pending:
        return 0
    db = await ctx.db()
    started = time.monotonic()
    await db.write_in_thread(lambda conn: _write_rows_sync(conn, pending))
    times["state_db_s"] += time.monotonic() - started
    started = time.monotonic()
    by_project: dict[str, list[Any]] = {}
    for _, _, _, plan in pending:
        for row in plan:
            if with_vectors is None or row.project in with_vectors:
                by_project.setdefault(row.project, []).append(row)
    chunks = [rows[s : s + BATCH] for rows in by_project.values() for s in range(0, len(rows), BATCH)]
    for chunk in chunks:
        await ctx.turn_store(chunk[0].project).upsert(
            [r.message_id for r in chunk],
            [r.text for r in chunk],
            [r.chroma_metadata() for r in chunk],
            embed_texts=[r.dense_text for r in chunk],
        )
    times["turn_vectors_s"] += time.monotonic() - started
    print(
        f"  {pending[-1][1]}: state.db {times['state_db_s']:.0f} s, vectors {times['turn_vectors_s']:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    return sum(len(chunk) for chunk in chunks)


def _optimize_sync(conn: sqlite3.Connection) -> None:
    for (table,) in conn.execute(FTS_TABLES_SQL).fetchall():
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")


def _write_rows_sync(conn: sqlite3.Connection, pending: list[Any]) -> None:
    """The batch's sessions, messages, memory_turn rows and their FTS5 rows: one transaction, bulk."""
    next_id = int(conn.execute("SELECT coalesce(max(id), 0) FROM memory_turn").fetchone()[0]) + 1
    sessions, messages, turns = [], [], []
    fts: dict[str, list[tuple[int, str, str, str]]] = {}
    for project, sid, lines, plan in pending:
        sessions.append((sid, project, len(lines), len(lines), lines[0]["time"], lines[-1]["time"]))
        for i, ln in enumerate(lines):
            data = {"text": ln["text"], "speaker": ln["speaker"], "imported": True, "status": "completed"}
            messages.append((ln["id"], sid, ln["role"], i + 1, ln["time"], ln["time"], json.dumps(data)))
        for row in plan:
            turns.append(
                (next_id, row.message_id, sid, project, row.ord, row.role, row.speaker, row.time)
                + (row.digest, row.digest)
            )
            fts.setdefault(fts_table(project), []).append((next_id, row.body, row.ctx, row.scope))
            next_id += 1
    conn.executemany(
        "INSERT INTO session (id, project, last_seq, message_count, time_created, time_updated) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        sessions,
    )
    conn.executemany(
        "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        messages,
    )
    conn.executemany(
        "INSERT INTO memory_turn (id, message_id, session_id, project, ord, role, speaker, time, digest, "
        "vector_digest, revision, time_indexed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'bench', 0)",
        turns,
    )
    for table, rows in fts.items():
        conn.execute(fts_table_ddl(table))
        conn.executemany(f"INSERT INTO {table} (rowid, body, ctx, scope) VALUES (?, ?, ?, ?)", rows)


async def measure(ctx: Context, convs: dict[str, Any], projects: int, queries: int) -> dict[str, Any]:
    rng = random.Random(2)
    qs = [(cid, qa["question"]) for cid, conv in convs.items() for qa in conv["qa"]]
    await memory_recall.recall(ctx, "warm up", project="r0c26")
    latencies, sizes = [], []
    replicas_n = max(1, projects // len(convs))
    for _ in range(queries):
        cid, question = rng.choice(qs)
        r = rng.randrange(replicas_n)
        project = f"r{r}c{cid}"
        started = time.perf_counter()
        result = await memory_recall.recall(ctx, question, project=project, k=10)
        latencies.append((time.perf_counter() - started) * 1000)
        sizes.append(len(result["items"]))
        assert not result["degraded"], result["degraded"]
    latencies.sort()
    return {
        "queries": queries,
        "p50_ms": round(statistics.median(latencies), 2),
        "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
        "max_ms": round(latencies[-1], 2),
        "mean_items": round(statistics.fmean(sizes), 1),
    }


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    convs = dict(load(p) for p in sorted(args.data.glob("*.json")))
    data = DataDir(root / "data")
    ctx = Context(data)
    try:
        built: dict[str, Any]
        if args.reuse:
            db = await ctx.db()
            built = {
                "reused": True,
                "turns": await db.scalar("SELECT count(*) FROM memory_turn"),
                "projects": await db.scalar("SELECT count(DISTINCT project) FROM session"),
                "sessions": await db.scalar("SELECT count(*) FROM session"),
            }
        else:
            started = time.monotonic()
            built = await build(ctx, convs, args.turns, args.sessions, args.vector_projects)
            built["build_s"] = round(time.monotonic() - started, 1)
        built["state_db_mb"] = round(data.state_db.stat().st_size / 1e6)
        built["chroma_mb"] = round(
            sum(p.stat().st_size for p in (data.root / "chroma").rglob("*") if p.is_file()) / 1e6
        )
        queried = int(built["projects"])
        if args.vector_projects is not None:
            queried = min(queried, args.vector_projects)
        built["queried_projects"] = queried
        measured = [await measure(ctx, convs, queried, args.queries) for _ in range(args.rounds)]
    finally:
        await ctx.close()
        chroma_server.stop_recorded(data) if hasattr(chroma_server, "stop_recorded") else None
    return {"corpus": built, "rounds": measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--vector-projects", type=int, help="write turn vectors for the first N projects only (queried)"
    )
    parser.add_argument("--keep", type=Path, help="build in this dir and keep it")
    parser.add_argument("--reuse", type=Path, help="measure a dir built before with --keep")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = args.reuse or args.keep or Path(tempfile.mkdtemp(prefix="rem-recall-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(run(args, root))
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    c = result["corpus"]
    print(f"corpus: {c}")
    for i, m in enumerate(result["rounds"], 1):
        print(
            f"round {i}: {m['queries']} queries, p50 {m['p50_ms']} ms, p95 {m['p95_ms']} ms, max {m['max_ms']} ms"
        )


if __name__ == "__main__":
    main()
