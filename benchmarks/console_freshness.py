"""Freshness: how long a commit by another process takes to appear in the console (target p95 < 300 ms).

    python benchmarks/console_freshness.py [--data DIR] [--commits 100] [--interval-ms 200]

A writer process makes COMMITS commits (a journal row each, plus heartbeats
and lease renewals) at random intervals around INTERVAL_MS; the console runs
headless at 120x40 with its normal live refresh (file watch + data_version
gate). Latency = the moment the console has applied the snapshot containing
that row to its widgets minus the row's time (taken just before COMMIT).
Without --data a fresh data dir with a few workers and leases is used.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from benchmarks.console_common import start_writer, summary, wait_for
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


async def measure(data: DataDir, commits: int, interval_ms: float) -> dict[str, Any]:
    app = MeasuredConsole(data, data_label="bench")
    app.seen = {}
    app.run_id = f"fresh-{time.time()}"
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.applied is not None, pilot)
        writer = start_writer(data.state_db, interval_ms, commits, app.run_id)
        try:
            await wait_for(
                lambda: len(app.seen) >= commits or writer.poll() is not None,
                pilot,
                timeout_s=commits * interval_ms / 1000 * 3 + 30,
            )
            await wait_for(lambda: len(app.seen) >= commits, pilot, timeout_s=10)
        finally:
            writer.kill()
            writer.wait()
        latencies = [app.seen[i] for i in sorted(app.seen)]
        return {
            "commits": commits,
            "seen": len(app.seen),
            "latency_ms": summary(latencies),
            "refreshes": app.stats["applies"],
            "load_ms": summary(app.stats["load_ms"]),
            "apply_ms": summary(app.stats["apply_ms"]),
        }


def small_data_dir() -> DataDir:
    from tests.tui import scenes

    root = Path(tempfile.mkdtemp(prefix="rem-fresh-")) / "data"
    return scenes.build(root, scenes.healthy, now=int(time.time() * 1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=200.0)
    args = parser.parse_args()
    data = DataDir(args.data) if args.data else small_data_dir()
    if args.data is None:
        atexit.register(shutil.rmtree, data.root.parent, True)
    result = asyncio.run(measure(data, args.commits, args.interval_ms))
    result["data_dir"] = str(data.root)
    print(json.dumps(result))
    lat = result["latency_ms"]
    print(
        f"console freshness: {result['seen']}/{args.commits} commits seen; latency p50 {lat['p50']} ms, "
        f"p95 {lat['p95']} ms, max {lat['max']} ms (target p95 < 300 ms); "
        f"snapshot load p95 {result['load_ms']['p95']} ms, apply p95 {result['apply_ms']['p95']} ms",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
