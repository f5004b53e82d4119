"""Idle cost: the CPU an idle `rem up` burns per daemon, and how fast it still wakes.

    python benchmarks/idle.py [--store sqlite|postgres|both] [--turns 12000] [--sessions 300]
        [--window-s 60] [--wakes 20] [--json] [--keep]

1. Builds a settled data dir: TURNS imported turns over SESSIONS sessions
   (`rem import`'s library call), then `rem up` with its defaults (2
   executors, 1 summarizer, 1 Dream, the supervisor) summarizes, digests and
   indexes them until nothing is pending; then it is left alone for
   `--quiet-s` seconds.
2. Idle CPU: the utime + stime ticks of each daemon and of the supervisor
   (`/proc/PID/stat`) over WINDOW_S seconds with nothing to do, as a share of
   one core (target: <= 0.2 % per daemon). The Chroma server's (and on
   PostgreSQL the server's, all its processes) are shown beside, not counted.
3. Wake latency: WAKES inputs, each into a new session after an idle gap of
   1-3 s: from the moment the input is durable (the benchmark's `send`
   committed) to its claim (the `execution.claimed` event's time, taken by the
   executor inside the claiming transaction). Target: median <= 0.5 s.

`--store both` measures SQLite, then PostgreSQL (a throw-away local server,
the test extra's binaries), and prints both. The load average is printed
with the figures: on a busy machine both figures read high.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend import ops
from backend.core.datadir import DataDir
from backend.programs.supervisor import read_manifest
from backend.runtime.context import Context

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
WORDS = (
    "river lantern harbor copper meadow signal garden winter orbit canyon violet ember quartz "
    "falcon timber saddle marble thunder pepper willow cobalt island ribbon summit velvet "
    "anchor prairie glacier comet walnut beacon cedar"
).split()
CLAIM_SQL = "SELECT time FROM event WHERE kind = 'execution.claimed' AND session_id = ? ORDER BY id LIMIT 1"


def conversation_lines(turns: int, sessions: int, seed: int = 7) -> list[dict[str, Any]]:
    """`rem import` lines: `turns` turns spread over `sessions` sessions in 10 projects."""
    rng = random.Random(seed)
    start = int(time.time() * 1000) - 86_400_000
    lines = []
    for i in range(turns):
        s = i % sessions
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
        lines.append(
            {
                "project": f"idle{s % 10}",
                "session": f"idle-s{s}",
                "id": f"idle-m{i}",
                "role": "user" if (i // sessions) % 2 == 0 else "assistant",
                "speaker": "ana" if (i // sessions) % 2 == 0 else "bo",
                "text": f"{text}.",
                "time": start + i * 1000,
            }
        )
    return lines


def proc_ticks(pid: int) -> int | None:
    """utime + stime of a process, in clock ticks (None: it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted after `comm`


def tree_pids(pid: int) -> list[int]:
    """A process and every descendant (the PostgreSQL server's backends and workers)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(c) for c in children)
    return out


def fleet(root: Path) -> dict[str, int]:
    """The supervisor's and its children's pids, from `up.json` (empty until it is written)."""
    manifest = read_manifest(Context(DataDir(root), start_chroma=False)) or {}
    pids = {"supervisor": manifest.get("pid")}
    for child in manifest.get("children", []):
        pids[child["name"]] = child["pid"]
    pids["chroma"] = (manifest.get("chroma") or {}).get("pid")
    return {name: pid for name, pid in pids.items() if pid}


def start_up(root: Path, db_url: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, REM_AGENT_DELAY_MS="0")
    if db_url:
        env["REM_DB_URL"] = db_url
    log = (root.parent / "up.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "backend.cli.app", "up", "--data", str(root)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def settled(ctx: Context) -> bool:
    status = await ops.status(ctx)
    index = status["backlog"]["index"]
    leases = status["leases"]
    return not (status["counts"]["backlog"] or index["sessions_behind"] or index["vectors_pending"] or leases)


async def wait_quiet(pid: int, timeout_s: float = 300.0, pct: float = 2.0, windows: int = 3) -> float:
    """Seconds until `pid`'s whole process tree (a `rem up`: its daemons and Chroma) used at most
    `pct` % of a core in `windows` one-second windows in a row: settled is not idle (a pass
    finishing its tail, a sweep); raises after `timeout_s`."""
    started, calm = time.monotonic(), 0
    while time.monotonic() - started < timeout_s:
        pids = tree_pids(pid)
        before = sum(proc_ticks(p) or 0 for p in pids)
        await asyncio.sleep(1.0)
        used = sum(proc_ticks(p) or 0 for p in pids) - before
        calm = calm + 1 if used / TICKS_PER_S * 100 <= pct else 0
        if calm >= windows:
            return round(time.monotonic() - started - windows, 1)
    raise SystemExit(f"rem up did not go quiet in {timeout_s:.0f} s")


async def wait_settled(ctx: Context, up: subprocess.Popen[bytes], timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if up.poll() is not None:
            raise SystemExit(f"rem up exited with {up.returncode}; see its log")
        if await settled(ctx):
            return time.monotonic() - started
        await asyncio.sleep(1.0)
    raise SystemExit(f"the data dir did not settle in {timeout_s:.0f} s")


def idle_cpu(pids: dict[str, int], window_s: float, server_pid: int | None) -> dict[str, Any]:
    """Each process's share of one core over the window (ticks read before and after)."""
    watched = dict(pids)
    server = tree_pids(server_pid) if server_pid else []
    before = {name: proc_ticks(pid) for name, pid in watched.items()}
    server_before = sum(proc_ticks(p) or 0 for p in server)
    load_before = os.getloadavg()[0]
    time.sleep(window_s)
    after = {name: proc_ticks(pid) for name, pid in watched.items()}
    server_after = sum(proc_ticks(p) or 0 for p in tree_pids(server_pid)) if server_pid else 0
    pct: dict[str, float | None] = {}
    for name in watched:
        b, a = before[name], after[name]
        pct[name] = None if a is None or b is None else round((a - b) / TICKS_PER_S / window_s * 100, 3)
    daemons = {n: v for n, v in pct.items() if n not in ("supervisor", "chroma") and v is not None}
    out: dict[str, Any] = {
        "window_s": window_s,
        "pct_of_a_core": pct,
        "ticks_per_s": TICKS_PER_S,
        "daemon_pct_max": max(daemons.values(), default=None),
        "daemon_pct_mean": round(statistics.fmean(daemons.values()), 3) if daemons else None,
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if server_pid:
        out["postgres_server_pct"] = round((server_after - server_before) / TICKS_PER_S / window_s * 100, 3)
    return out


async def wake_latency(ctx: Context, wakes: int, run: str) -> dict[str, Any]:
    """Inputs into new sessions after idle gaps: durable -> claimed, in ms."""
    rng = random.Random(11)
    db = await ctx.db()
    latencies: list[float] = []
    for i in range(wakes):
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        session = f"wake-{run}-{i}"
        await ops.send(ctx, session, f"wake up {i}", project="idle-wake")
        durable_ms = time.time() * 1000
        deadline = time.monotonic() + 30
        claimed = None
        while claimed is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            claimed = await db.scalar(CLAIM_SQL, (session,))
        if claimed is None:
            raise SystemExit(f"input {i} was not claimed within 30 s")
        latencies.append(max(0.0, int(claimed) - durable_ms))
    latencies.sort()
    return {
        "n": len(latencies),
        "median_ms": round(statistics.median(latencies), 1),
        "p90_ms": round(latencies[int(0.9 * (len(latencies) - 1))], 1),
        "max_ms": round(latencies[-1], 1),
        "all_ms": [round(x, 1) for x in latencies],
    }


async def build(root: Path, db_url: str | None, turns: int, sessions: int) -> int:
    ctx = Context(DataDir(root), db_url=db_url, start_chroma=False)
    try:
        jsonl = root.parent / "idle.jsonl"
        jsonl.write_text("".join(json.dumps(line) + "\n" for line in conversation_lines(turns, sessions)))
        imported = await ops.import_file(ctx, jsonl)
    finally:
        await ctx.close()
    return int(imported["written"])


async def measure(
    args: argparse.Namespace, root: Path, db_url: str | None, server_pid: int | None
) -> dict[str, Any]:
    written = await build(root, db_url, args.turns, args.sessions)
    up = start_up(root, db_url)
    try:
        ctx = Context(DataDir(root), db_url=db_url, start_chroma=False)
        try:
            settle_s = await wait_settled(ctx, up, args.settle_timeout_s)
        finally:
            await ctx.close()  # not a reader during the window
        await asyncio.sleep(args.quiet_s)
        pids = fleet(root)
        cpu = await asyncio.to_thread(idle_cpu, pids, args.window_s, server_pid)
        if fleet(root) != pids:
            raise SystemExit("a process of rem up restarted during the window; see its log")
        ctx = Context(DataDir(root), db_url=db_url, start_chroma=False)
        try:
            wake = await wake_latency(ctx, args.wakes, run=str(int(time.time())))
        finally:
            await ctx.close()
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
    return {
        "store": "postgresql" if db_url else "sqlite",
        "turns": written,
        "sessions": args.sessions,
        "settle_s": round(settle_s, 1),
        "quiet_s": args.quiet_s,
        "idle_cpu": cpu,
        "wake_latency": wake,
        "targets": {
            "daemon % of a core <= 0.2": cpu["daemon_pct_max"],
            "wake median ms <= 500": wake["median_ms"],
        },
    }


def run_store(args: argparse.Namespace, store: str) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix=f"rem-idle-{store}-"))
    server = None
    try:
        db_url = server_pid = None
        if store == "postgres":
            from backend.programs import postgres_server

            server = postgres_server.start(scratch / "pg")
            db_url, server_pid = server.url(), server.process.pid
        return asyncio.run(measure(args, scratch / "data", db_url, server_pid))
    finally:
        if server is not None:
            server.stop(remove=True)
        if args.keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def print_result(result: dict[str, Any]) -> None:
    cpu, wake = result["idle_cpu"], result["wake_latency"]
    print(
        f"{result['store']}: {result['turns']} turns over {result['sessions']} sessions, settled in "
        f"{result['settle_s']} s; idle {cpu['window_s']:g} s (load average {cpu['load_average_1m']})"
    )
    for name, pct in cpu["pct_of_a_core"].items():
        note = " (not counted)" if name == "chroma" else ""
        print(f"  {name:<14} {pct if pct is not None else 'gone'} % of a core{note}")
    if "postgres_server_pct" in cpu:
        print(f"  {'postgres':<14} {cpu['postgres_server_pct']} % of a core (all its processes; not counted)")
    print(f"  per daemon: max {cpu['daemon_pct_max']} %, mean {cpu['daemon_pct_mean']} % (target <= 0.2 %)")
    print(
        f"  wake, durable -> claimed ({wake['n']} inputs): median {wake['median_ms']} ms, "
        f"p90 {wake['p90_ms']} ms, max {wake['max_ms']} ms (target median <= 500 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--turns", type=int, default=12_000)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument(
        "--quiet-s", type=float, default=15.0, help="left alone after settling, before the window"
    )
    parser.add_argument("--wakes", type=int, default=20)
    parser.add_argument("--settle-timeout-s", type=float, default=1800.0)
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir (data dir, logs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    results = {"postgresql" if s == "postgres" else "sqlite": run_store(args, s) for s in stores}
    result: dict[str, Any] = results if len(results) > 1 else next(iter(results.values()))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for one in results.values():
        print_result(one)


if __name__ == "__main__":
    main()
