"""What the PostgreSQL change feed (a `pg_notify` trigger on every rem table) costs writers.

    python benchmarks/change_feed_cost.py [--db URL] [--rounds 9] [--block 200] [--fast]

Each round times blocks of `--block` write transactions alternately with the
change feed's triggers firing and with them off (`session_replication_role =
replica`, which skips ordinary triggers, on the same connection), so a busy
patch of a shared machine weighs on both sides alike. Two shapes: a
turn-path-like transaction (a journal row, a heartbeat, a lease renewal: three
statements, one notification) and a bare `INSERT INTO event; COMMIT`. A console
LISTENs throughout (notifications are queued for it). Without --db a
throw-away server (`backend.programs.postgres_server`) holds a migrated database.
Prints one JSON line on stdout and a table on stderr: transactions/s per side,
the median ratio (feed on / feed off) and every round's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from backend.store import schema_pg
from benchmarks.pg_common import migrated_throwaway


def throwaway_database(fast: bool) -> str:
    return migrated_throwaway("rem-feed-cost-", fast=fast)[0]


def turn_like(conn: psycopg.Connection[Any], i: int) -> None:
    now = int(time.time() * 1000)
    conn.execute(
        "INSERT INTO event (time, kind, actor, data) VALUES (%s, 'bench.turn', 'bench', %s)",
        (now, json.dumps({"seq": i})),
    )
    conn.execute("UPDATE worker SET heartbeat_at = %s WHERE owner_id = 'bench-exec'", (now,))
    conn.execute(
        "UPDATE session_execution SET expires_at = %s, time_renewed = %s WHERE id = 'bench-lease'",
        (now + 30000, now),
    )
    conn.commit()


def bare(conn: psycopg.Connection[Any], i: int) -> None:
    conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (%s, 'bench.bare', 'bench', '{}')", (i,))
    conn.commit()


def block_rate(
    conn: psycopg.Connection[Any], write: Callable[[psycopg.Connection[Any], int], None], n: int
) -> float:
    start = time.perf_counter()
    for i in range(n):
        write(conn, i)
    return n / (time.perf_counter() - start)


def feed(conn: psycopg.Connection[Any], on: bool) -> None:
    conn.execute(f"SET session_replication_role = {'origin' if on else 'replica'}")
    conn.commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a migrated rem database (default: a throw-away server)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument(
        "--fast",
        action="store_true",
        help="the throw-away server without fsync: the trigger's CPU cost shows",
    )
    args = parser.parse_args()
    url = args.db or throwaway_database(args.fast)
    listener = psycopg.connect(url, autocommit=True)
    listener.execute(f"LISTEN {schema_pg.CHANGE_CHANNEL}")
    conn = psycopg.connect(url)
    rounds: dict[str, list[dict[str, float]]] = {"turn_like": [], "bare": []}
    for _ in range(args.rounds):
        for name, write in (("turn_like", turn_like), ("bare", bare)):
            rates = {"on": 0.0, "off": 0.0}
            for on in (True, False, True, False):  # on/off/on/off: drift weighs on both sides
                feed(conn, on)
                rates["on" if on else "off"] += block_rate(conn, write, args.block) / 2
            rates["ratio"] = rates["on"] / rates["off"]
            rounds[name].append(rates)
        for _notify in listener.notifies(timeout=0):  # keep the console's queue drained, as it would
            pass
    feed(conn, True)
    result: dict[str, Any] = {
        "rounds": args.rounds,
        "block": args.block,
        "fsync": not args.fast,
        "load_avg": [round(v, 2) for v in os.getloadavg()],
    }
    for name, values in rounds.items():
        ratios = [r["ratio"] for r in values]
        result[name] = {
            "feed_on_tx_s": round(statistics.median(r["on"] for r in values)),
            "feed_off_tx_s": round(statistics.median(r["off"] for r in values)),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
        }
        print(
            f"{name:9}: feed on {result[name]['feed_on_tx_s']} tx/s, off {result[name]['feed_off_tx_s']} tx/s; "
            f"on/off median {result[name]['ratio_median']} (rounds {result[name]['ratio_min']}"
            f"..{result[name]['ratio_max']})",
            file=sys.stderr,
        )
    print(json.dumps(result))
    conn.close()
    listener.close()


if __name__ == "__main__":
    main()
