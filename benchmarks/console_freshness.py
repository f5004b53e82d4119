"""Freshness: how long a commit by another process takes to appear in the console (target p95 < 300 ms).

    python benchmarks/console_freshness.py [--data DIR] [--commits 100] [--interval-ms 200]
        [--store sqlite|postgres|both] [--db URL]

A writer process makes COMMITS commits (a journal row each, plus heartbeats
and lease renewals) at random intervals around INTERVAL_MS; the console runs
headless at 120x40 with its normal live refresh (file watch + data_version
gate). Latency = the moment the console has applied the snapshot containing
that row to its widgets minus the row's time (taken just before COMMIT).
Without --data a fresh data dir with a few workers and leases is used.

`--store postgres` measures the console over the PostgreSQL store (its change
feed: LISTEN/NOTIFY) on a throw-away server (`backend.programs.postgres_server`,
the test extra's binaries) holding the same workers and leases, or on
`--db URL` (a migrated rem database: the benchmark writes to it). `--store
both` measures SQLite, then PostgreSQL, in one run, and prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from benchmarks.console_common import start_writer, summary, wait_for, wait_quietly
from tui.app import ConsoleApp


class MeasuredConsole(ConsoleApp):
    """The real console, noting when each benchmark row first reaches the widgets."""

    seen: dict[int, float]
    run_id: str

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        super().apply_snapshot(snapshot)
        now_ms = time.time() * 1000
        for event in snapshot.get("events") or []:
            if event.get("kind") == "bench.commit" and event["data"].get("run") == self.run_id:
                seq = int(event["data"]["seq"])
                if seq not in self.seen:
                    self.seen[seq] = now_ms - int(event["time"])


async def measure(
    data: DataDir, commits: int, interval_ms: float, db_url: str | None = None
) -> dict[str, Any]:
    app = MeasuredConsole(data, data_label="bench", db_url=db_url)
    app.seen = {}
    app.run_id = f"fresh-{time.time()}"
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.applied is not None, pilot)
        if db_url:  # commits before the listener is up would be found by the poll, not the feed
            await wait_for(lambda: app.backend is not None and app.backend.listening, pilot)
        writer = start_writer(db_url or data.state_db, interval_ms, commits, app.run_id)
        try:
            await wait_quietly(
                lambda: len(app.seen) >= commits or writer.poll() is not None,
                timeout_s=commits * interval_ms / 1000 * 3 + 30,
            )
            # the last commit on screen: under the refresh budget a stream of commits can scroll some
            # past the events panel between two refreshes (counted as unseen, not waited for)
            await wait_quietly(lambda: commits - 1 in app.seen, timeout_s=10)
        finally:
            writer.kill()
            writer.wait()
        latencies = [app.seen[i] for i in sorted(app.seen)]
        return {
            "commits": commits,
            "seen": len(app.seen),
            "latency_ms": summary(latencies),
            "refreshes": app.stats["applies"],
            "load_ms": summary(list(app.stats["load_ms"])),
            "apply_ms": summary(list(app.stats["apply_ms"])),
        }


def small_data_dir() -> DataDir:
    from tests.tui import scenes

    root = Path(tempfile.mkdtemp(prefix="rem-fresh-")) / "data"
    return scenes.build(root, scenes.healthy, now=int(time.time() * 1000))


def throwaway_postgres() -> str:
    """A migrated database on a throw-away local server (stopped at exit) holding the healthy scene."""
    from benchmarks.pg_common import migrated_throwaway

    url, root = migrated_throwaway("rem-fresh-pg-")
    with PgScene(url, root / "data") as scene:
        from tests.tui import scenes

        scenes.healthy(scene)
    return url


class PgScene:
    """`tests.tui.scenes.Scene` writing its rows to the PostgreSQL store instead of a state.db."""

    def __new__(cls, url: str, root: Path) -> Any:
        from backend.store.postgres import PgConnection
        from tests.tui import scenes

        class Scene(scenes.Scene):
            def __init__(self) -> None:
                self.data, self.now, self._msg = DataDir(root), int(time.time() * 1000), 0
                self.conn = PgConnection(url)  # type: ignore[assignment]

            def x(self, sql: str, *params: Any) -> None:
                if sql.startswith("INSERT OR IGNORE"):  # the one SQLite-only form the scenes use
                    sql = sql.replace("INSERT OR IGNORE", "INSERT", 1) + " ON CONFLICT DO NOTHING"
                self.conn.execute(sql, params)

        return Scene()


def report(store: str, result: dict[str, Any], commits: int) -> None:
    lat = result["latency_ms"]
    print(
        f"console freshness on {store}: {result['seen']}/{commits} commits seen; latency p50 {lat['p50']} ms, "
        f"p95 {lat['p95']} ms, max {lat['max']} ms; "
        f"snapshot load p95 {result['load_ms']['p95']} ms, apply p95 {result['apply_ms']['p95']} ms",
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=200.0)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--db", help="a migrated rem database on PostgreSQL (default: a throw-away server)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.store in ("sqlite", "both"):
        data = DataDir(args.data) if args.data else small_data_dir()
        if args.data is None:
            atexit.register(shutil.rmtree, data.root.parent, True)
        results["sqlite"] = asyncio.run(measure(data, args.commits, args.interval_ms))
        results["sqlite"]["data_dir"] = str(data.root)
    if args.store in ("postgres", "both"):
        url = args.db or throwaway_postgres()
        data = DataDir(Path(tempfile.mkdtemp(prefix="rem-fresh-pgdata-")))
        atexit.register(shutil.rmtree, data.root, True)
        results["postgresql"] = asyncio.run(measure(data, args.commits, args.interval_ms, db_url=url))
    # one store: its result as before (what `rem bench console` reads); both: one per store
    result = results[next(iter(results))] if len(results) == 1 else dict(results)
    result["load_avg"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(result))
    for store, one in results.items():
        report(store, one, args.commits)
    print(
        f"targets: p95 < 300 ms on SQLite, < 100 ms on PostgreSQL; load {result['load_avg']}", file=sys.stderr
    )


if __name__ == "__main__":
    main()
