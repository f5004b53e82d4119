"""Shared pieces of the console benchmarks: a headless console, a writer process, a lag probe."""

from __future__ import annotations

import asyncio
import heapq
import math
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# A separate process committing to state.db like a daemon would: heartbeats, lease
# renewals and one journal row per commit (`time` = just before COMMIT, ms).
WRITER = r"""
import json, random, sqlite3, sys, time
path, interval_ms, count, run = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(7)
conn = sqlite3.connect(path, isolation_level=None, timeout=10)
conn.execute("PRAGMA journal_mode = WAL")
leases = [r[0] for r in conn.execute("SELECT id FROM session_execution LIMIT 5000")]
i = 0
while count < 0 or i < count:
    conn.execute("BEGIN IMMEDIATE")
    now = int(time.time() * 1000)
    conn.execute("UPDATE worker SET heartbeat_at = ? WHERE state = 'running'", (now,))
    for lease in rng.sample(leases, min(20, len(leases))):
        conn.execute("UPDATE session_execution SET expires_at = ?, time_renewed = ? WHERE id = ?",
                     (now + 30000, now, lease))
    now = int(time.time() * 1000)
    conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (?, 'bench.commit', 'bench', ?)",
                 (now, json.dumps({"run": run, "seq": i})))
    conn.execute("COMMIT")
    i += 1
    time.sleep(rng.uniform(0.5, 1.5) * interval_ms / 1000)
"""


# The same writer on the PostgreSQL store (`url` instead of a state.db path).
WRITER_PG = r"""
import json, random, sys, time
import psycopg
url, interval_ms, count, run = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(7)
conn = psycopg.connect(url)
leases = [r[0] for r in conn.execute("SELECT id FROM session_execution LIMIT 5000")]
conn.commit()
i = 0
while count < 0 or i < count:
    now = int(time.time() * 1000)
    conn.execute("UPDATE worker SET heartbeat_at = %s WHERE state = 'running'", (now,))
    for lease in rng.sample(leases, min(20, len(leases))):
        conn.execute("UPDATE session_execution SET expires_at = %s, time_renewed = %s WHERE id = %s",
                     (now + 30000, now, lease))
    now = int(time.time() * 1000)
    conn.execute("INSERT INTO event (time, kind, actor, data) VALUES (%s, 'bench.commit', 'bench', %s)",
                 (now, json.dumps({"run": run, "seq": i})))
    conn.commit()
    i += 1
    time.sleep(rng.uniform(0.5, 1.5) * interval_ms / 1000)
"""


def start_writer(
    state_db: Path | str, interval_ms: float, count: int = -1, run: str = ""
) -> subprocess.Popen[bytes]:
    """The writer process; its journal rows carry `run` so reruns on one data dir do not mix.

    `state_db` is a state.db path, or a `postgresql://` URL for the PostgreSQL store.
    """
    script = WRITER_PG if str(state_db).startswith(("postgresql://", "postgres://")) else WRITER
    return subprocess.Popen(
        [sys.executable, "-c", script, str(state_db), str(interval_ms), str(count), run or str(time.time())]
    )


class Samples:
    """Timings (ms) kept in fixed memory: their count, max, the max since the last look, and a
    histogram of 1 % wide bins for percentiles (to within 1 %).

    A list or even an array of every sample grows with the soak (a 2-hour soak took
    ~170 000 callback and ~570 000 lag samples: ~7 MB that the console's RSS then
    counted as its own); this does not.
    """

    LOW_MS = 0.001  # the first bin's lower edge; smaller samples count in it
    STEP = 1.01
    BINS = 2400  # up to LOW_MS * STEP**BINS: ~23 000 s

    def __init__(self) -> None:
        self.bins = array("Q", bytes(8 * self.BINS))
        self.n = 0
        self.max = 0.0
        self.window_max = 0.0
        self._log_step = math.log(self.STEP)

    def append(self, value: float) -> None:
        index = int(math.log(value / self.LOW_MS) / self._log_step) if value > self.LOW_MS else 0
        self.bins[min(index, self.BINS - 1)] += 1
        self.n += 1
        self.max = max(self.max, value)
        self.window_max = max(self.window_max, value)

    def take_window_max(self) -> float:
        """The largest sample since the last call (0 if none)."""
        largest, self.window_max = self.window_max, 0.0
        return largest

    def __len__(self) -> int:
        return self.n

    def percentile(self, q: float) -> float:
        """The value below which a share `q` of the samples lie (its bin's middle, at most the max)."""
        rank, seen = max(1, math.ceil(q * self.n)), 0
        for index, count in enumerate(self.bins):
            seen += count
            if seen >= rank:
                return min(self.max, self.LOW_MS * self.STEP ** (index + 0.5))
        return self.max


class LagProbe:
    """How late the event loop wakes a 10 ms sleeper: the longest the UI could not react."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        # fixed memory: the soak's RSS is the console's, not the probe's
        self.lags_ms = Samples()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.lags_ms.append((time.perf_counter() - start - self.period_s) * 1000)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


SLOWEST_KEPT = 8


class CallbackTimer:
    """CPU and wall time of every event-loop callback on this thread (a task step, a timer,
    a message): the longest one is the longest the console itself kept input waiting,
    whatever else the (shared) machine was doing."""

    def __init__(self) -> None:
        self.cpu_ms = Samples()
        self.wall_ms = Samples()
        self.slow: list[tuple[float, str]] = []  # the slowest, at most SLOWEST_KEPT
        self._original: Any = None

    def install(self) -> None:
        handle = asyncio.events.Handle
        original = handle._run
        timer = self

        def timed_run(self: Any) -> None:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                original(self)
            finally:
                cpu_ms = (time.thread_time() - cpu) * 1000
                if cpu_ms > 0.5:
                    timer.cpu_ms.append(cpu_ms)
                    if cpu_ms > 50:
                        owner = getattr(self._callback, "__self__", None)
                        what = owner.get_coro() if isinstance(owner, asyncio.Task) else self._callback
                        timer_obj = getattr(getattr(what, "cr_frame", None), "f_locals", {}).get("self")
                        if timer_obj is not None and hasattr(timer_obj, "_callback"):
                            what = f"Timer {timer_obj.name}: {getattr(timer_obj._callback, '__qualname__', timer_obj._callback)}"
                        entry = (round(cpu_ms, 1), repr(what)[:160])
                        if len(timer.slow) < SLOWEST_KEPT:
                            heapq.heappush(timer.slow, entry)
                        else:
                            heapq.heappushpop(timer.slow, entry)
                    timer.wall_ms.append((time.perf_counter() - wall) * 1000)

        self._original = original
        handle._run = timed_run  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            asyncio.events.Handle._run = self._original  # type: ignore[method-assign]


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def latest(samples: Any, n: int) -> list[float]:
    """The last `n` of a console's kept timings (`app.stats`: rings of a fixed size)."""
    return list(samples)[-n:] if n > 0 else []


def summary(values: Sequence[float] | Samples) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    if isinstance(values, Samples):
        return {
            "n": values.n,
            "p50": round(values.percentile(0.5), 1),
            "p95": round(values.percentile(0.95), 1),
            "p99": round(values.percentile(0.99), 1),
            "max": round(values.max, 1),
        }
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 1),
        "p95": round(pct(values, 0.95), 1),
        "p99": round(pct(values, 0.99), 1),
        "max": round(max(values), 1),
    }


async def wait_quietly(predicate: Any, timeout_s: float = 30.0, every_s: float = 0.05) -> None:
    """`wait_for` without the pilot: while the console is measured, a `pilot.pause()` every 10 ms
    (a wake of the app and a look at its CPU clock each) cost the console's process ~4 % of a core,
    which its refresh budget counted as its own and paid for with later refreshes."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise RuntimeError("timed out")
        await asyncio.sleep(every_s)


async def wait_for(predicate: Any, pilot: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await pilot.pause()
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("timed out")
