"""The console beside a busy fleet: its CPU, commit → screen latency, refreshes/s and RSS, by commit rate and backlog.

    python benchmarks/console_load.py [--store sqlite|postgres|both] [--rates 10,50,200]
        [--backlogs 100,3000,30000] [--seconds 30] [--soak-s 0 --soak-rate 50 --soak-backlog 3000]
        [--profile FILE] [--json]

For each store, backlog size and commit rate, a writer process commits at
that rate the way a busy fleet does: each commit promotes the oldest waiting
input and admits a new one to the same session (the backlog keeps its size
and its first rows change) and journals one `bench.commit` event (every
commit moves the Backlog and the Events panels); as the daemons do, the 16
execution leases are renewed every 10 s each (in turn) and the workers
heartbeat every 2 s. The console runs
headless at 120x40 in this process with its normal live refresh (the watch
on state.db, or PostgreSQL's LISTEN). At each point, over `--seconds`:

* the console's CPU, as a share of one core (this process's user + system
  time: the console's threads; the writer is another process), and by thread;
* commit → screen: for every commit, the moment the console has shown a
  snapshot that holds it (every panel updated) minus the commit's time
  (taken just before COMMIT), p50 / p95;
* the refreshes (snapshots shown) per second;
* the snapshot read's wall time per refresh (`SnapshotReader.load`'s `took_ms`: the
  gate, `ops.status` and its hop to the database thread and back), p50 / p95;
* the RSS at the start and at the end of the point.

`--soak-s` adds one long point (`--soak-rate`, `--soak-backlog`) that
prints the RSS every minute: over an hour at 50 commits/s it should grow by
less than 10 %. `--profile FILE` writes a cProfile of the UI thread's CPU
(thread time) over every point to FILE (`python -m pstats FILE`).

The PostgreSQL store runs on a throw-away server (`backend.programs.
postgres_server`, the test extra's binaries) with a fresh database per
backlog size. Wall-clock figures swing on a busy machine; the CPU share is
this process's CPU time and moves less, but it too grows when the machine
is short of CPU (caches are shared): say which figures were taken quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import bisect
import cProfile
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.core.datadir import DataDir
from benchmarks.console_common import summary, wait_for
from tui.app import ConsoleApp

EXECUTORS = ("executor-bench-1-1001-a1", "executor-bench-1-1002-b2")
WORKERS = (*EXECUTORS, "summarizer-bench-1-1003-c3", "dream-bench-1-1004-d4")
LEASES = 16

# the writer: `path_or_url rate seconds`; one fleet-like commit per 1/rate s (see the module doc)
WRITER = r"""
import json, sys, time
target, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
pg = target.startswith(("postgresql://", "postgres://"))
if pg:
    import psycopg
    conn = psycopg.connect(target, autocommit=True)
    P = "%s"
else:
    import sqlite3
    conn = sqlite3.connect(target, isolation_level=None, timeout=10)
    P = "?"
def q(sql):
    return sql.replace("?", P)
leases = [r[0] for r in conn.execute("SELECT id FROM session_execution ORDER BY id").fetchall()]
RENEW_EVERY_S, BEAT_EVERY_S = 10.0, 2.0  # an executor's lease renewals, a daemon's heartbeat
renewed, beaten = 0, 0.0
OLDEST = q("SELECT id, session_id, admitted_seq FROM session_input "
           "WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL ORDER BY time_created, session_id LIMIT 1")
start, i = time.monotonic(), 0
while time.monotonic() - start < seconds:
    wait = start + i / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    conn.execute("BEGIN" if pg else "BEGIN IMMEDIATE")
    now = int(time.time() * 1000)
    row = conn.execute(OLDEST).fetchone()
    if row is not None:
        input_id, session_id, seq = row
        conn.execute(q("UPDATE session_input SET promoted_seq = admitted_seq, wake_pending = 0 WHERE id = ?"),
                     (input_id,))
        conn.execute(q("INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                       "wake_pending, time_created) VALUES (?, ?, '{}', 'queue', ?, 1, ?)"),
                     (f"in_{session_id}_{seq + 1}", session_id, seq + 1, now))
    elapsed = time.monotonic() - start
    while leases and renewed < elapsed * len(leases) / RENEW_EVERY_S:  # each lease every 10 s, in turn
        conn.execute(q("UPDATE session_execution SET expires_at = ?, time_renewed = ? WHERE id = ?"),
                     (now + 30000, now, leases[renewed % len(leases)]))
        renewed += 1
    if elapsed - beaten >= BEAT_EVERY_S:
        conn.execute(q("UPDATE worker SET heartbeat_at = ? WHERE state = 'running'"), (now,))
        beaten = elapsed
    now = int(time.time() * 1000)
    conn.execute(q("INSERT INTO event (time, kind, actor, data) VALUES (?, 'bench.commit', 'bench', ?)"),
                 (now, json.dumps({"seq": i})))
    conn.execute("COMMIT")
    i += 1
print(i)
"""


def fill_sql(backlog: int, now: int) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The rows of a fleet with `backlog` waiting inputs (one a session), as (SQL with ?, rows)."""
    sessions = [
        (f"s-{i:06d}", f"session {i}", now - 3_600_000, now - 3_600_000) for i in range(backlog + LEASES)
    ]
    workers = [
        (owner, owner.split("-")[0], 1001 + i, "bench-1", now - 600_000, now, "running")
        for i, owner in enumerate(WORKERS)
    ]
    leases = [
        (
            f"exe_{i:04d}",
            f"s-{backlog + i:06d}",
            EXECUTORS[i % 2],
            1,
            "unknown",
            now - 5_000,
            now,
            now + 25_000,
        )
        for i in range(LEASES)
    ]
    inputs = [
        (f"in_s-{i:06d}_100", f"s-{i:06d}", "{}", "queue", 100, 1, now - 600_000 + i * 10)
        for i in range(backlog)
    ]
    events = [(now - 60_000 + i * 100, "execution.step", EXECUTORS[i % 2], "{}") for i in range(200)]
    return [
        ("INSERT INTO session (id, title, time_created, time_updated) VALUES (?,?,?,?)", sessions),
        (
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES (?,?,?,?,?,?,?)",
            workers,
        ),
        (
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES (?,?,?,?,?,?,?,?)",
            leases,
        ),
        (
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "time_created) VALUES (?,?,?,?,?,?,?)",
            inputs,
        ),
        ("INSERT INTO event (time, kind, actor, data) VALUES (?,?,?,?)", events),
    ]


def sqlite_store(backlog: int) -> DataDir:
    """A fresh data dir holding the fleet (removed at exit)."""
    import sqlite3

    from tests.tui.scenes import _init, _run

    root = Path(tempfile.mkdtemp(prefix="rem-load-")) / "data"
    atexit.register(shutil.rmtree, root.parent, True)
    data = DataDir(root)
    _run(_init(data))
    conn = sqlite3.connect(data.state_db, isolation_level=None, timeout=10)
    conn.execute("BEGIN IMMEDIATE")
    for sql, rows in fill_sql(backlog, int(time.time() * 1000)):
        conn.executemany(sql, rows)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return data


class PgServer:
    """A throw-away PostgreSQL server; a fresh migrated database per backlog size."""

    def __init__(self) -> None:
        from backend.programs import postgres_server

        self.root = Path(tempfile.mkdtemp(prefix="rem-load-pg-"))
        atexit.register(shutil.rmtree, self.root, True)
        self.server = postgres_server.start(self.root / "pg")
        atexit.register(self.server.stop)
        self.count = 0

    def store(self, backlog: int) -> str:
        import psycopg

        from backend.store import schema_pg
        from backend.store.postgres import PgConnection

        self.count += 1
        name = f"load{self.count}"
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = self.server.url(name)
        migrated = PgConnection(url)
        try:
            schema_pg.migrate_sync(migrated, "bench")
        finally:
            migrated.close()
        with psycopg.connect(url) as conn:
            for sql, rows in fill_sql(backlog, int(time.time() * 1000)):
                with conn.cursor() as cursor:
                    cursor.executemany(sql.replace("?", "%s"), rows)
            conn.execute("ANALYZE")
        return url


class MeasuredConsole(ConsoleApp):
    """The real console, noting when each snapshot is on screen and the newest journal row it holds,
    and how long each snapshot's read took."""

    shown: Shown
    reads: array[float]  # each snapshot read's wall time (ms), in the order they were read

    def snapshot_loaded(self, snapshot: Any, version: int, took_ms: float, limits: Any) -> None:
        self.reads.append(took_ms)
        super().snapshot_loaded(snapshot, version, took_ms, limits)

    def snapshot_shown(self, cycle_s: float, *, first: bool) -> None:
        super().snapshot_shown(cycle_s, first=first)
        applied = self.applied
        newest = max((e["id"] for e in applied["events"]), default=0) if applied else 0
        self.shown.add(time.time() * 1000, newest)


class Shown:
    """When each snapshot was shown and the newest journal row it held, in two flat arrays.

    Flat so that the benchmark's own record (~17 bytes a refresh, ~0.3 MB over an hour at
    5 refreshes/s) does not read as the console's RSS growing in a soak, as a list of tuples
    (~110 bytes a refresh) did.
    """

    def __init__(self) -> None:
        self.at = array("d")
        self.newest = array("q")

    def add(self, at_ms: float, newest: int) -> None:
        if self.newest and newest < self.newest[-1]:
            newest = self.newest[-1]  # running max: bisect needs it sorted
        self.at.append(at_ms)
        self.newest.append(newest)

    def last(self) -> int:
        return self.newest[-1] if self.newest else 0


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (summed over same names)."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        name = thread.name.split(" (")[-1].rstrip(")") if "(" in thread.name else thread.name
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class UpdateMeter:
    """Screen updates (Textual's compositor) and snapshot applies on the UI thread: count and CPU."""

    def __init__(self) -> None:
        self.counts = {"screen_updates": 0, "lines": 0, "panel_shows": 0, "trends": 0, "header": 0}
        self.cpu = dict.fromkeys(self.counts, 0.0)
        self._undo: list[Any] = []

    def _wrap(self, owner: Any, name: str, what: str) -> None:
        original = getattr(owner, name)
        meter = self

        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return original(self, *args, **kwargs)
            finally:
                meter.counts[what] += 1
                meter.cpu[what] += time.thread_time() - started

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self) -> None:
        from textual._styles_cache import StylesCache
        from textual.screen import Screen

        from tui.widgets.header import ConsoleHeader
        from tui.widgets.snapshot_table import SnapshotTable
        from tui.widgets.trends import Trends

        self._wrap(Screen, "_on_timer_update", "screen_updates")
        self._wrap(StylesCache, "render_line", "lines")
        self._wrap(SnapshotTable, "show", "panel_shows")
        self._wrap(Trends, "record", "trends")
        self._wrap(ConsoleHeader, "set_state", "header")

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def take(self) -> dict[str, Any]:
        out = {
            what: {"n": n, "cpu_ms_each": round(1000 * self.cpu[what] / n, 2) if n else None}
            for what, n in self.counts.items()
        }
        self.counts = dict.fromkeys(self.counts, 0)
        self.cpu = dict.fromkeys(self.cpu, 0.0)
        return out


def commit_times(target: str, after_id: int) -> list[tuple[int, int]]:
    """(event id, commit time) of the writer's commits journaled after `after_id`."""
    sql = "SELECT id, time FROM event WHERE kind = 'bench.commit' AND id > ? ORDER BY id"
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as conn:
            return [(r[0], r[1]) for r in conn.execute(sql.replace("?", "%s"), (after_id,)).fetchall()]
    import sqlite3

    conn = sqlite3.connect(target, timeout=10)
    try:
        return [(r[0], r[1]) for r in conn.execute(sql, (after_id,)).fetchall()]
    finally:
        conn.close()


def latencies(shown: Shown, commits: list[tuple[int, int]]) -> tuple[list[float], int]:
    """Commit → screen of every commit (the first snapshot shown holding it), and how many never showed."""
    newest = shown.newest
    out, unseen = [], 0
    for event_id, at in commits:
        i = bisect.bisect_left(newest, event_id)
        if i == len(newest):
            unseen += 1
            continue
        out.append(max(0.0, shown.at[i] - at))
    return out, unseen


@contextmanager
def profiled(profile: cProfile.Profile | None) -> Iterator[None]:
    if profile is not None:
        profile.enable()
    try:
        yield
    finally:
        if profile is not None:
            profile.disable()


@dataclass(frozen=True)
class Reading:
    """The console's counters at one moment: wall clock, CPU (in all and by thread), RSS, refreshes."""

    wall: float
    at_ms: float  # the wall clock, to place the writer's commits (journaled with their time)
    cpu: float
    threads: dict[str, float]
    rss: float
    applies: int
    loads: int

    @classmethod
    def of(cls, app: ConsoleApp) -> Reading:
        stats = app.stats
        now = (time.monotonic(), time.time() * 1000)
        return cls(*now, cpu_s(), thread_cpu_s(), rss_mb(), stats["applies"], stats["loads"])


def figures(rate: float, commits: list[tuple[int, int]], start: Reading, end: Reading) -> dict[str, Any]:
    """A point's rates and shares over the time from `start` to `end` (`commits`: `commit_times`)."""
    wall = end.wall - start.wall
    measured = sum(1 for _, at in commits if start.at_ms <= at < end.at_ms)
    return {
        "rate": rate,
        "commits": len(commits),  # the writer's, measured or not (it starts before, ends after)
        "commits_per_s": round(measured / wall, 1),  # those measured
        "cpu_pct": round(100 * (end.cpu - start.cpu) / wall, 1),
        "cpu_by_thread_pct": {
            name: round(100 * (end.threads.get(name, 0.0) - before) / wall, 1)
            for name, before in sorted(start.threads.items())
            if end.threads.get(name, 0.0) - before > 0.005 * wall
        },
        "refreshes_per_s": round((end.applies - start.applies) / wall, 2),
        "loads_per_s": round((end.loads - start.loads) / wall, 2),
        "rss_mb": {"start": round(start.rss, 1), "end": round(end.rss, 1)},
        "load_avg": round(os.getloadavg()[0], 2),
    }


async def point(
    data: DataDir,
    db_url: str | None,
    rate: float,
    seconds: float,
    profile: cProfile.Profile | None = None,
    minute_rss: bool = False,
    meter: UpdateMeter | None = None,
) -> dict[str, Any]:
    """One measured point: the console over the store while the writer commits at `rate`."""
    app = MeasuredConsole(data, data_label="bench", db_url=db_url)
    app.shown = Shown()
    app.reads = array("d")
    meter = meter or UpdateMeter()
    target = db_url or str(data.state_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.applied is not None, pilot)
        if db_url:  # commits before the listener is up would be found by the poll, not the feed
            await wait_for(lambda: app.backend is not None and app.backend.listening, pilot)
        await asyncio.sleep(2.0)  # settled: the first snapshot's caches and strips made
        first_id = app.shown.last()
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, target, str(rate), str(seconds + 1)], stdout=subprocess.PIPE
        )
        await asyncio.sleep(0.5)  # the writer's start (its imports) is not the fleet's steady state
        start = Reading.of(app)
        reads_from = len(app.reads)
        by_minute = [round(start.rss, 1)]
        meter.take()
        with profiled(profile):
            while (elapsed := time.monotonic() - start.wall) < seconds:
                await asyncio.sleep(min(60.0, seconds - elapsed))
                if minute_rss:
                    by_minute.append(round(rss_mb(), 1))
        end = Reading.of(app)
        read_ms = summary(list(app.reads[reads_from:]))
        ui = meter.take() if meter._undo else None
        # waited for off the loop: blocking here froze the console for the writer's last second,
        # and its last ~5 commits (~2 % of a point at 10/s) read as 150-550 ms late
        await asyncio.to_thread(writer.communicate, timeout=60)
        await asyncio.sleep(1.0)  # the last commits reach the screen
        shown = app.shown
        budget = app.refresher.describe() if hasattr(app.refresher, "describe") else None
    commits = commit_times(target, first_id)
    lat, unseen = latencies(shown, commits)
    result = figures(rate, commits, start, end)
    result.update(
        latency_ms=summary(lat), unseen=unseen, read_ms=read_ms, **({"ui_thread": ui} if ui else {})
    )
    if budget is not None:
        result["budget"] = budget
    if minute_rss:
        result["rss_mb"]["by_minute"] = by_minute
    return result


def line(store: str, backlog: int, r: dict[str, Any]) -> str:
    lat = r["latency_ms"]
    return (
        f"{store:10} backlog {backlog:>6} rate {r['rate']:>5g}/s ({r['commits_per_s']:>5g} done): "
        f"CPU {r['cpu_pct']:5.1f} %  commit→screen p50 {lat.get('p50', float('nan')):7.1f} "
        f"p95 {lat.get('p95', float('nan')):7.1f} ms  {r['refreshes_per_s']:5.2f} refreshes/s  "
        f"read p50 {r['read_ms'].get('p50', float('nan')):4.1f} p95 {r['read_ms'].get('p95', float('nan')):4.1f} ms  "
        f"RSS {r['rss_mb']['start']:.1f} → {r['rss_mb']['end']:.1f} MB  load {r['load_avg']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rates", default="10,50,200", help="commits per second, comma-separated")
    parser.add_argument("--backlogs", default="100,3000,30000", help="waiting inputs, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per point")
    parser.add_argument(
        "--soak-s", type=float, default=0.0, help="one long point this long (RSS each minute)"
    )
    parser.add_argument("--soak-rate", type=float, default=50.0)
    parser.add_argument("--soak-backlog", type=int, default=3000)
    parser.add_argument("--profile", type=Path, help="write a cProfile (thread CPU) of the UI thread here")
    parser.add_argument(
        "--meter",
        action="store_true",
        help="count screen updates, lines painted and panel updates (and their CPU)",
    )
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    backlogs = [int(b) for b in args.backlogs.split(",") if b]
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    meter = UpdateMeter()
    if args.meter:
        meter.install()
    results: list[dict[str, Any]] = []
    pg = PgServer() if "postgres" in stores else None
    empty = DataDir(Path(tempfile.mkdtemp(prefix="rem-load-pgdata-")))
    atexit.register(shutil.rmtree, empty.root, True)
    for store in stores:
        points = [(b, r, args.seconds, False) for b in backlogs for r in rates]
        if args.soak_s > 0:
            points.append((args.soak_backlog, args.soak_rate, args.soak_s, True))
        made: dict[int, tuple[DataDir, str | None]] = {}
        for backlog, rate, seconds, soak in points:
            if backlog not in made:
                made[backlog] = (
                    (sqlite_store(backlog), None)
                    if pg is None or store == "sqlite"
                    else (empty, pg.store(backlog))
                )
            data, url = made[backlog]
            r = asyncio.run(point(data, url, rate, seconds, profile, minute_rss=soak, meter=meter))
            r.update(store=store, backlog=backlog, soak=soak)
            results.append(r)
            print(line(store, backlog, r), file=sys.stderr, flush=True)
    if profile is not None:
        profile.dump_stats(args.profile)
    print(json.dumps({"points": results, "load_avg": [round(v, 2) for v in os.getloadavg()]}))


if __name__ == "__main__":
    main()
