"""Benchmark turns/s on the PostgreSQL store with one host identity vs two.

    python benchmarks/hosts.py [--turns 1500] [--sessions 60] [--rounds 3] [--db URL]

Each round, for each layout, on a fresh database of one server (a throw-away
one from `backend/programs/postgres_server.py`, fsync on, unless `--db`):
admits `--turns` queue inputs over `--sessions` sessions, then starts real
`rem daemon --role executor` processes (the instant offline agent, no Chroma)
and times from the first completed reply to the last one (process start-up is
not counted). The layouts:

* `one host`: one executor, `REM_HOST=host-a`;
* `one host, 2 executors`: two executors, both `host-a` (what a bigger `rem up`
  on one host does);
* `two hosts`: two executors, `host-a` and `host-b` (two `rem up`s sharing
  the store, here on one machine).

Every round waits for a completed reply per input and ends with `rem check`
on the store (one completed reply per promoted input, every invariant; not
`--settled`, as no summarizer runs): its violations are reported. Prints a table on stderr and one JSON line on stdout: each
layout's median turns/s and every round's, plus the statements per turn and
the CPU each process used (from /proc), so what limits the rate can be read
off: on one 2-core machine the executors and the server share the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from benchmarks.pg_common import fresh_database, server

REM = str(Path(sys.executable).with_name("rem"))
LAYOUTS = {
    "one host": ["host-a"],
    "one host, 2 executors": ["host-a", "host-a"],
    "two hosts": ["host-a", "host-b"],
}
ASKS = (
    "Why did the nightly ledger export stall after the PgBouncer change?",
    "Summarise what Priya said about the Canary Pipeline.",
    "List the risks of moving the Invoice Service behind Stripe webhooks.",
)


def env(host: str, url: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("REM_")}
    e.update(REM_HOST=host, REM_DB_URL=url, REM_AGENT_DELAY_MS="0", REM_CHROMA_AUTOSTART="0", REM_LOG="1")
    return e


def admit(url: str, data: Path, turns: int, sessions: int) -> None:
    """Admit the inputs through the backend in one process (not timed)."""
    script = (
        "import asyncio, sys\nfrom pathlib import Path\n"
        "from backend.core.datadir import DataDir\n"
        "from backend.execution import sessions\n"
        "from backend.runtime.context import Context\n"
        "async def main():\n"
        f"    ctx = Context(DataDir(Path({str(data)!r})), start_chroma=False, db_url={url!r})\n"
        "    db = await ctx.db()\n"
        f"    for i in range({turns}):\n"
        f"        await sessions.admit(db, f'bench-{{i % {sessions}}}', f'{ASKS[0]} (#{{i}})')\n"
        "    await ctx.close()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env("admin", url))


def done_count(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE data::jsonb->>'status' = 'completed'), count(*) "
            "FROM session_message WHERE type = 'assistant'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(url: str) -> float:
    """CPU seconds of the server's backends serving rem (`application_name = rem`)."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'rem'")]
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_of(pid)
    return total


def run_layout(url: str, tmp: Path, hosts: list[str], turns: int, sessions: int) -> dict[str, Any]:
    data = tmp / "data"
    subprocess.run([REM, "init", "--data", str(data)], check=True, env=env("admin", url), capture_output=True)
    admit(url, data, turns, sessions)
    procs = []
    for n, host in enumerate(hosts):
        log = open(tmp / f"executor-{n}.log", "ab")
        procs.append(
            (
                subprocess.Popen(
                    [REM, "daemon", "--role", "executor", "--data", str(data / host)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env(host, url),
                ),
                log,
            )
        )
    first = last = None
    deadline = time.monotonic() + 600
    backend_cpu = 0.0
    cpu = [0.0] * len(procs)
    try:
        while time.monotonic() < deadline:
            completed, _ = done_count(url)
            now = time.perf_counter()
            if completed and first is None:
                first, first_done = now, completed
            cpu = [cpu_of(p.pid) for p, _ in procs]
            backend_cpu = max(backend_cpu, server_cpu(url))
            if completed >= turns:
                last = now
                break
            time.sleep(0.02)
    finally:
        for p, _ in procs:
            p.terminate()
        for p, log in procs:
            p.wait(30)
            log.close()
    if first is None or last is None:
        raise SystemExit(f"the executors did not answer every input within 600 s (see {tmp})")
    completed, _ = done_count(url)
    # the operators' own verdict: one completed reply per promoted input, every invariant
    # (not --settled: no summarizer runs here, so the summaries stay behind by design)
    check = subprocess.run(
        [REM, "check", "--json", "--data", str(data)],
        capture_output=True,
        text=True,
        env=env("admin", url),
    )
    violations = json.loads(check.stdout)["violations"] if check.stdout.strip() else [check.stderr]
    if violations:
        print(f"rem check: {violations}", file=sys.stderr)
    elapsed = last - first
    return {
        "turns_per_s": round((turns - first_done) / elapsed, 1),
        "elapsed_s": round(elapsed, 2),
        "completed": completed,
        "check_violations": len(violations),
        "executor_cpu_s": [round(c, 2) for c in cpu],
        "server_backend_cpu_s": round(backend_cpu, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1500)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", metavar="URL", help="a PostgreSQL server you run (CREATEDB needed)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="rem-hosts-") as tmp, server(args.db, Path(tmp)) as url:
        for n in range(args.rounds):
            for name, hosts in LAYOUTS.items():  # layouts alternate: load drifts weigh on each alike
                work = Path(tmp) / f"{n}-{name.replace(' ', '_').replace(',', '')}"
                work.mkdir()
                with fresh_database(url, f"rem_bench_hosts_{n}") as db_url:
                    r = run_layout(db_url, work, hosts, args.turns, args.sessions)
                results[name].append(r)
                print(f"round {n + 1} {name:>22}: {r['turns_per_s']} turns/s {r}", file=sys.stderr)
    summary = {
        name: {
            "turns_per_s_median": statistics.median(r["turns_per_s"] for r in rs),
            "turns_per_s": [r["turns_per_s"] for r in rs],
            "rem_check_clean": all(r["check_violations"] == 0 for r in rs),
            "executor_cpu_s": [r["executor_cpu_s"] for r in rs],
            "server_backend_cpu_s": [r["server_backend_cpu_s"] for r in rs],
        }
        for name, rs in results.items()
    }
    summary["load_average_1m"] = round(os.getloadavg()[0], 2)  # type: ignore[assignment]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
