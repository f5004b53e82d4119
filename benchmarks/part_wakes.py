"""Streamed parts and the idle daemons: how often the summarizer and Dream wake while turns stream.

    python benchmarks/part_wakes.py [--store sqlite|postgres|both] [--inputs 60] [--rate 4]
        [--sessions 6] [--part-ms 40] [--json]

Schema v13 journals every streamed part (`message.part`, for the API's event
streams). An idle daemon takes a journal row for news (`backend.runtime.idle`):
unless the head it reads leaves parts out, every part's commit would wake the
summarizer and Dream for a pass that finds nothing new. This runs `rem up`
(1 executor, 1 summarizer, 1 Dream) under INPUTS inputs at RATE a second over
SESSIONS sessions, the offline agent streaming each reply in parts PART_MS
apart, and reports for the summarizer and Dream: why their idle waits ended
(`changed`: a pass for news; `upkeep`: a commit set aside unread as no news;
`no_commit`: a checkpoint), and the CPU they used, beside the journal rows the
load wrote. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from benchmarks.idle import TICKS_PER_S, fleet, proc_ticks

STATS = re.compile(r"idle waits ended by: IdleStats\((?P<fields>[^)]*)\)")
ROLES = ("summarizer", "dream")


def start_up(root: Path, db_url: str | None, part_ms: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, REM_AGENT_DELAY_MS=str(part_ms), REM_LOG="1")
    if db_url:
        env["REM_DB_URL"] = db_url
    return subprocess.Popen(
        [sys.executable, "-m", "backend.cli.app", "up", "--data", str(root), "--executors", "1"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=(root.parent / "up.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def wait_fleet(root: Path, timeout_s: float = 120) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = fleet(root)
        if all(any(name.startswith(role) for name in pids) for role in (*ROLES, "executor")):
            return pids
        await asyncio.sleep(0.5)
    raise SystemExit("rem up did not start its daemons; see up.log")


async def drive(ctx: Context, inputs: int, rate: float, sessions: int) -> float:
    """Send the inputs at `rate` a second; the seconds until every one is answered."""
    started = time.monotonic()
    for i in range(inputs):
        await ops.send(ctx, f"pw-s{i % sessions}", f"Question {i}: what is the export format of report {i}?")
        await asyncio.sleep(1 / rate)
    db = await ctx.db()
    while await db.scalar("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL") or await db.scalar(
        "SELECT count(*) FROM session_execution"
    ):
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def idle_stats(root: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for log in sorted((root / "logs").glob("*.log")):
        role = next((r for r in ROLES if log.name.startswith(r)), None)
        found = STATS.findall(log.read_text(errors="replace"))
        if role and found:
            out[log.stem] = {k: int(v) for k, v in (f.split("=") for f in found[-1].split(", "))}
    return out


async def measure(args: argparse.Namespace, root: Path, db_url: str | None) -> dict[str, Any]:
    ctx = Context(DataDir(root), db_url=db_url, start_chroma=False)
    await ctx.db()
    up = start_up(root, db_url, args.part_ms)
    try:
        pids = {n: p for n, p in (await wait_fleet(root)).items() if n.startswith(ROLES)}
        await asyncio.sleep(args.quiet_s)
        before, load = {n: proc_ticks(p) or 0 for n, p in pids.items()}, os.getloadavg()[0]
        first_event = await (await ctx.db()).scalar("SELECT coalesce(max(id), 0) FROM event")
        seconds = await drive(ctx, args.inputs, args.rate, args.sessions)
        cpu = {n: round(((proc_ticks(p) or 0) - before[n]) / TICKS_PER_S, 2) for n, p in pids.items()}
        rows = await (await ctx.db()).fetchall(
            "SELECT kind, count(*) AS n FROM event WHERE id > ? GROUP BY kind ORDER BY kind", (first_event,)
        )
    finally:
        await ctx.close()
        up.send_signal(signal.SIGTERM)
        up.wait(120)
    journal = {r["kind"]: int(r["n"]) for r in rows}
    return {
        "store": "postgresql" if db_url else "sqlite",
        "inputs": args.inputs,
        "load_s": round(seconds, 1),
        "journal_rows": sum(journal.values()),
        "part_rows": journal.get("message.part", 0),
        "cpu_s": cpu,
        "idle_waits": idle_stats(root),
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def run_store(args: argparse.Namespace, store: str) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix=f"rem-partwakes-{store}-"))
    server = None
    try:
        db_url = None
        if store == "postgres":
            from backend.programs import postgres_server

            server = postgres_server.start(scratch / "pg")
            db_url = server.url()
        return asyncio.run(measure(args, scratch / "data", db_url))
    finally:
        if server is not None:
            server.stop(remove=True)
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--inputs", type=int, default=60)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--part-ms", type=int, default=40)
    parser.add_argument("--quiet-s", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    results = [run_store(args, s) for s in stores]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"{r['store']}: {r['inputs']} inputs in {r['load_s']} s, {r['journal_rows']} journal rows "
            f"({r['part_rows']} parts), load average {r['load_average_1m']}"
        )
        for name, waits in r["idle_waits"].items():
            print(f"  {name:<28} cpu {r['cpu_s'].get(name, '?')} s, idle waits ended by {waits}")


if __name__ == "__main__":
    main()
