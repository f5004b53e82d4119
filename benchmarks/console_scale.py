"""Scale: the console over a 100 000-session data dir (start < 3 s, input never blocked > 100 ms, RSS < 250 MB).

    python benchmarks/console_scale.py [DIR] [--soak-s 600] [--quiet-s 60] [--interval-ms 100]

DIR comes from benchmarks/gen_big.py (generated in a temp dir when omitted).
1. Start: `rem console`'s import + first snapshot applied, in a fresh process, 3 runs.
2. Soak: the console (headless, 120x40, live refresh on) while a writer process
   commits every INTERVAL_MS (heartbeats, 20 lease renewals, a journal row). A
   probe coroutine on the console's event loop records how late a 10 ms sleep
   wakes up: the longest stretch during which a key press could not have been
   handled. The operator presses a key every second (↓, PgDn, Tab ...).
   RSS of the console process is sampled every second; each minute's RSS, load
   average, longest callback and longest loop lag are reported (`by_minute`), so a
   long soak shows whether memory levels off and what the machine's load did to
   the UI. `--tracemalloc` also traces the console's Python allocations: their
   total each minute, and the lines that grew most since a baseline snapshot
   taken after `--trace-base-s` (when the Trends window has filled). Each minute also
   counts the full (generation 2) cyclic collections and the longest of them.
   Before it, a `--quiet-s` soak with the same writer and no key presses: the
   longest callback there is what refreshes alone cost the UI (a navigation
   key's own repaint of a whole panel is the slowest thing in the soak).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.console_common import (
    CallbackTimer,
    LagProbe,
    Samples,
    latest,
    start_writer,
    summary,
    wait_for,
)

KEYS = tuple(
    os.environ.get("REM_BENCH_KEYS", "down,down,pagedown,tab,up,2,end,home,3,pagedown,1,s,s").split(",")
)


def start_child(root: Path) -> None:
    """In a fresh process: import the console, run it until the first snapshot is shown."""
    t0 = float(os.environ["REM_BENCH_T0"])
    from backend.core.datadir import DataDir
    from tui.app import ConsoleApp

    imported = time.time()

    async def run() -> float:
        app = ConsoleApp(DataDir(root))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(lambda: app.applied is not None, pilot)
            await pilot.pause()
            return time.time()

    shown = asyncio.run(run())
    print(json.dumps({"import_s": round(imported - t0, 3), "start_s": round(shown - t0, 3)}))


def measure_start(root: Path, runs: int = 3) -> list[dict[str, float]]:
    results = []
    for _ in range(runs):
        env = dict(os.environ, REM_BENCH_T0=str(time.time()))
        proc = subprocess.run(
            [sys.executable, __file__, "--child-start", str(root)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


class GcProbe:
    """How long each of Python's full (generation 2) cyclic collections stopped the console."""

    def __init__(self) -> None:
        self.pauses_ms = Samples()
        self._started = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._started) * 1000)

    def install(self) -> None:
        import gc

        gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        import gc

        gc.callbacks.remove(self._on_gc)


class MinuteLog:
    """Each minute of a soak: RSS, load, the longest callback and loop lag in it, traced Python memory."""

    def __init__(
        self, probe: LagProbe, callbacks: CallbackTimer, gcs: GcProbe, trace_base_s: float | None
    ) -> None:
        self.probe, self.callbacks, self.gcs = probe, callbacks, gcs
        self.rows: list[dict[str, Any]] = []
        self._gc_at = 0
        self.trace_base_s = trace_base_s
        self.base: Any = None
        self.growth: list[dict[str, Any]] = []

    def record(self, minute: int, elapsed_s: float, rss_mb: float) -> None:
        full_gcs, self._gc_at = self.gcs.pauses_ms.n - self._gc_at, self.gcs.pauses_ms.n
        row: dict[str, Any] = {
            "minute": minute,
            "rss_mb": round(rss_mb, 1),
            "load_1m": round(os.getloadavg()[0], 2),
            "callback_max_ms": round(self.callbacks.cpu_ms.take_window_max(), 1),
            "lag_max_ms": round(self.probe.lags_ms.take_window_max(), 1),
            "full_gcs": full_gcs,
            "full_gc_max_ms": round(self.gcs.pauses_ms.take_window_max(), 1),
            "allocated_blocks": sys.getallocatedblocks(),  # cheap: every live allocation of the interpreter
        }
        if self.trace_base_s is not None:
            import tracemalloc

            row["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
            if self.base is None and elapsed_s >= self.trace_base_s:
                self.base = tracemalloc.take_snapshot()
            elif self.base is not None and minute % 30 == 0:
                self.growth.append({"minute": minute, "top": top_growth(self.base)})
        self.rows.append(row)


def top_growth(base: Any, n: int = 8) -> list[str]:
    """The lines (or, when tracing more than one frame, the call stacks) whose live
    allocations grew most since `base` (a tracemalloc snapshot)."""
    import tracemalloc

    now = tracemalloc.take_snapshot()
    if tracemalloc.get_traceback_limit() == 1:
        return [str(stat) for stat in now.compare_to(base, "lineno")[:n]]
    stats = now.compare_to(base, "traceback")[:n]
    del now
    return [
        f"{stat.size_diff / 2**10:+.1f} KiB, {stat.count_diff:+d} blocks\n  "
        + "\n  ".join(stat.traceback.format(most_recent_first=True))
        for stat in stats
    ]


async def soak(
    root: Path, seconds: float, interval_ms: float, keys: bool = True, trace_base_s: float | None = None
) -> dict[str, Any]:
    import psutil

    from backend.core.datadir import DataDir
    from tui.app import ConsoleApp

    me = psutil.Process()
    app = ConsoleApp(DataDir(root))
    rss: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.applied is not None, pilot)
        await pilot.pause()
        probe = LagProbe()
        probe.start()
        callbacks = CallbackTimer()
        callbacks.install()
        gcs = GcProbe()
        gcs.install()
        writer = start_writer(root / "state.db", interval_ms, run=f"soak-{time.time()}")
        applies0, loads0 = app.stats["applies"], app.stats["loads"]
        minutes = MinuteLog(probe, callbacks, gcs, trace_base_s)
        started = time.monotonic()
        try:
            i = 0
            while time.monotonic() - started < seconds:
                if keys:
                    await pilot.press(KEYS[i % len(KEYS)])
                    i += 1
                rss.append(me.memory_info().rss / 2**20)
                if len(rss) % 60 == 0:
                    minutes.record(len(rss) // 60, time.monotonic() - started, rss[-1])
                await asyncio.sleep(1.0)
        finally:
            writer.kill()
            writer.wait()
            probe.stop()
            callbacks.uninstall()
            gcs.uninstall()
        return {
            "sessions": (app.applied or {}).get("counts", {}).get("sessions"),
            "soak_s": round(time.monotonic() - started),
            "writes_every_ms": interval_ms,
            "refreshes": app.stats["applies"] - applies0,
            "keys_pressed": i,
            "loop_lag_ms": summary(probe.lags_ms),
            "callback_cpu_ms": summary(callbacks.cpu_ms),
            "callback_wall_ms": summary(callbacks.wall_ms),
            "full_gc_ms": summary(gcs.pauses_ms),
            "slowest_callbacks": sorted(callbacks.slow, reverse=True)[:8],
            "apply_ms": summary(latest(app.stats["apply_ms"], app.stats["applies"] - applies0)),
            "load_ms": summary(latest(app.stats["load_ms"], app.stats["loads"] - loads0)),
            "rss_mb": {
                "start": round(rss[0], 1),
                "max": round(max(rss), 1),
                "end": round(rss[-1], 1),
                "by_minute": [round(v, 1) for v in rss[::60]],
            },
            "minutes": minutes.rows,
            "traced_growth": minutes.growth
            + ([{"minute": "end", "top": top_growth(minutes.base)}] if minutes.base is not None else []),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, nargs="?")
    parser.add_argument("--soak-s", type=float, default=600.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=60.0,
        help="first soak this long with no key presses: what refreshes alone cost the UI",
    )
    parser.add_argument(
        "--sessions", type=int, default=100_000, help="size of the generated data dir when DIR is omitted"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated data dir (printed)")
    parser.add_argument(
        "--scale", type=int, choices=(1, 10), help="use benchmarks/scale.py's cached data dir of this scale"
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the console's Python allocations in the soak (slows it; for a memory soak)",
    )
    parser.add_argument(
        "--trace-base-s",
        type=float,
        default=900.0,
        help="with --tracemalloc: the baseline snapshot's time; growth since it is reported every 30 minutes",
    )
    parser.add_argument(
        "--trace-frames",
        type=int,
        default=1,
        help="with --tracemalloc: frames kept per allocation; above 1, growth is grouped by call stack",
    )
    parser.add_argument("--skip-start", action="store_true", help="skip the start measurement")
    parser.add_argument("--child-start", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_start:
        start_child(args.child_start)
        return
    root = args.dir
    if root is None and args.scale:
        from benchmarks.scale import default_cache, ensure_data  # type: ignore[import-not-found]

        root, _ = ensure_data(args.scale, default_cache())
    if root is None:
        from benchmarks.gen_big import generate  # type: ignore[import-not-found]

        root = Path(tempfile.mkdtemp(prefix="rem-big-")) / "data"
        n = args.sessions
        print(f"generating {root} ({n} sessions) ...", file=sys.stderr)
        generate(root, n, 10, n // 10, n // 200, n // 50, n // 100, n // 5)
        if not args.keep:  # hundreds of MB: gone when the run ends, whatever happens
            atexit.register(shutil.rmtree, root.parent, True)
    starts = [] if args.skip_start else measure_start(root)
    quiet = asyncio.run(soak(root, args.quiet_s, args.interval_ms, keys=False)) if args.quiet_s > 0 else None
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(args.trace_frames)
    trace_base = args.trace_base_s if args.tracemalloc else None
    result = {
        "data_dir": str(root),
        "start": starts,
        **asyncio.run(soak(root, args.soak_s, args.interval_ms, trace_base_s=trace_base)),
    }
    if quiet is not None:
        result["refresh_only"] = {
            k: quiet[k] for k in ("soak_s", "refreshes", "callback_cpu_ms", "slowest_callbacks", "apply_ms")
        }
    print(json.dumps(result))
    lag, rss = result["loop_lag_ms"], result["rss_mb"]
    print(
        f"console scale ({root}): "
        + (f"start {max(s['start_s'] for s in starts):.2f} s worst of 3 (target < 3 s); " if starts else "")
        + f"over a {result['soak_s']} s soak with a commit every {args.interval_ms:g} ms: "
        f"{result['refreshes']} refreshes; longest UI callback {result['callback_cpu_ms']['max']} ms CPU "
        f"with a navigation key every second, "
        + (
            f"{result['refresh_only']['callback_cpu_ms']['max']} ms with refreshes alone "
            f"({result['refresh_only']['soak_s']} s, no keys) "
            if quiet is not None
            else ""
        )
        + f"(target: a refresh never blocks input > 100 ms); event-loop lag max {lag['max']} ms, p99 {lag['p99']} ms (includes "
        f"waiting for a CPU on this machine: load {os.getloadavg()[0]:.1f}); apply p95 {result['apply_ms']['p95']} ms, RSS {rss['start']} -> max "
        f"{rss['max']} MB (target < 250 MB)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
