"""The status snapshot's model usage total: summed over the usage index (before schema v8) vs
read from the usage counters (v8), in a state.db where every session used a model.

    python benchmarks/usage_totals.py [--sessions 1000000] [--rounds 200] [--keep DIR]

Builds a state.db at the current schema in a temp dir (or DIR), `--sessions`
sessions each with tokens and a cost (the triggers keep the counters as they
are inserted), then times, alternately, `--rounds` times each: the pre-v8
total (`count`, `total(cost)` and the five token totals over
`session_usage_idx`, a walk of one index entry per session) and what the
snapshot does now (`counters.counts_sync` + `model_health.usage_sync`, which
also reads the 500 costliest sessions both ways); then schema v8's backfill
of the same file (as a v7 state.db would meet it; rolled back). Prints one
JSON line on stdout and a table on stderr: p50 / p95 / max in ms, the build
time and the backfill's.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.ops import model_health
from backend.store import counters, schema

OLD_TOTAL_SQL = f"""
SELECT count(*), total(cost), total(tokens_input), total(tokens_output), total(tokens_reasoning),
       total(tokens_cache_read), total(tokens_cache_write)
FROM session INDEXED BY session_usage_idx WHERE {counters.USAGE_WHERE}"""


def build(path: Path, sessions: int) -> float:
    started = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    for script in schema.MIGRATIONS:
        for statement in schema.split_statements(script):
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")
    rng = random.Random(7)
    rows = (
        (
            f"s{i:08d}",
            rng.randint(100, 9000),
            rng.randint(10, 900),
            rng.randint(0, 50),
            rng.randint(0, 4000),
            round(rng.random() / 100, 6),
        )
        for i in range(sessions)
    )
    conn.executemany(
        "INSERT INTO session (id, time_created, time_updated, tokens_input, tokens_output, "
        "tokens_reasoning, tokens_cache_read, cost) VALUES (?1, 1, 1, ?2, ?3, ?4, ?5, ?6)",
        rows,
    )
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - started


def time_backfill(path: Path) -> float:
    """Schema v8's migration on this state.db as a v7 one would meet it: its usage triggers and
    counter rows dropped, then the v8 script timed (rolled back: the file is left as it was)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for counter in counters.SUMS:
            for name, *_ in counters.trigger_parts(counter):
                conn.execute(f"DROP TRIGGER {name}")
        conn.execute(f"DELETE FROM {counters.TABLE} WHERE name LIKE 'usage_%'")
        started = time.perf_counter()
        for statement in schema.split_statements(schema.V8):
            conn.execute(statement)
        return time.perf_counter() - started
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def timed(fn: object, rounds: list[float]) -> None:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    rounds.append((time.perf_counter() - started) * 1000)


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="rem-usage-"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / "state.db"
    path.unlink(missing_ok=True)
    build_s = build(path, args.sessions)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    old_total = conn.execute(OLD_TOTAL_SQL).fetchone()
    new_total = model_health.usage_sync(conn)["total"]
    assert new_total["sessions"] == old_total[0] == args.sessions, (new_total, tuple(old_total))
    assert new_total["tokens"]["input"] == int(old_total[2])
    old: list[float] = []
    new: list[float] = []
    old_snapshot: list[float] = []
    for _ in range(args.rounds):
        timed(lambda: conn.execute(OLD_TOTAL_SQL).fetchone(), old)
        timed(lambda: counters.counts_sync(conn), new)
        timed(
            lambda: (
                conn.execute(model_health.USAGE_SESSIONS_SQL, {"cap": model_health.USAGE_CAP}).fetchall(),
                conn.execute(OLD_TOTAL_SQL).fetchone(),
            ),
            old_snapshot,
        )
    new_snapshot: list[float] = []
    for _ in range(args.rounds):
        timed(lambda: model_health.usage_sync(conn), new_snapshot)
    conn.close()
    backfill_s = time_backfill(path)
    result = {
        "sessions": args.sessions,
        "build_s": round(build_s, 1),
        "total_summed_ms": summary(old),
        "total_from_counters_ms": summary(new),
        "usage_block_before_ms": summary(old_snapshot),
        "usage_block_now_ms": summary(new_snapshot),
        "v8_backfill_s": round(backfill_s, 2),
    }
    print(json.dumps(result))
    for key, value in result.items():
        print(f"{key:>24}: {value}", file=sys.stderr)


if __name__ == "__main__":
    main()
