"""rem against the durable-execution peers: DBOS Transact and LangGraph, on SQLite and PostgreSQL.

    pip install -e '.[peers]'     # the peers: never in the default install
    python benchmarks/peers.py [--inputs 1000] [--sessions 50] [--concurrency 8] [--rounds 5]
                               [--store sqlite|postgres|both] [--db URL] [--systems rem,dbos,langgraph]
                               [--crash] [--json]

Each round runs every system once per store, each in a fresh process on a fresh
database (PostgreSQL: a database of its own on one server, a throw-away one with
fsync on unless `--db`; SQLite: a fresh directory), the systems' order rotating
round by round so a busy or quiet patch of a shared machine weighs on each
alike. The workload and what each system guarantees in it are in
`benchmarks/peer_workloads.py`. Printed per system and store: the median
turns/s with the rounds' spread, CPU ms per turn of its process and (on the
throw-away server) of the server's, and rem's ratio to each peer.

`--crash` adds the crash column (`benchmarks/peer_crash.py`): each system's
process is SIGKILLed while its model call is in flight, restarted, and what
happened is counted: model calls for the input (is the step repeated?) and
replies stored (one, none, or two).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pg_common import fresh_database, server

SYSTEMS = ("rem", "dbos", "dbos-direct", "langgraph")
PEERS = ("dbos", "dbos-direct", "langgraph")


def versions() -> dict[str, str]:
    """The installed version of each system (and LangGraph's checkpointers)."""
    found = {}
    for name in ("rem", "dbos", "langgraph", "langgraph-checkpoint-postgres", "langgraph-checkpoint-sqlite"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def server_cpu_s(pid: int | None, *, system_only: bool = False) -> float:
    """The PostgreSQL server's CPU seconds so far: the postmaster and every backend it has reaped
    (`system_only`: in the kernel, which is where its WAL flushes spend theirs)."""
    if pid is None:
        return 0.0
    import psutil

    times = psutil.Process(pid).cpu_times()
    if system_only:
        return times.system + times.children_system
    return times.user + times.system + times.children_user + times.children_system


def run_child(
    system: str, store: str, target: str, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    """One system's run in a process of its own; its JSON line."""
    command = [
        sys.executable,
        __file__,
        "--child",
        system,
        "--store",
        store,
        "--target",
        target,
        "--inputs",
        str(args.inputs),
        "--sessions",
        str(args.sessions),
        "--concurrency",
        str(args.concurrency),
    ]
    env = {**os.environ, "PEERS_SCRATCH": str(scratch), "REM_DATA": str(scratch)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{system} on {store} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def target_for(store: str, server_url: str | None, tmp: Path, name: str) -> Iterator[str]:
    """A fresh database (PostgreSQL) or directory (SQLite) for one run."""
    if store == "sqlite":
        path = tmp / name
        path.mkdir()
        yield str(path)
        return
    assert server_url is not None
    with fresh_database(server_url, name) as url:
        yield url


def one_round(
    n: int, args: argparse.Namespace, stores: list[str], server_url: str | None, pid: int | None, tmp: Path
) -> list[dict[str, Any]]:
    systems = list(args.systems)
    order = systems[n % len(systems) :] + systems[: n % len(systems)]
    results = []
    for store in stores:
        for system in order:
            scratch = tmp / f"scratch-{n}-{store}-{system}"
            scratch.mkdir()
            with target_for(
                store, server_url, tmp, f"peers_{n}_{store[:2]}_{system.replace('-', '_')}"
            ) as target:
                before = server_cpu_s(pid) if store == "postgres" else 0.0
                kernel = server_cpu_s(pid, system_only=True)
                result = run_child(system, store, target, args, scratch)
                # after the child exited: its backends are gone, and their CPU is the postmaster's children's
                server = server_cpu_s(pid) - before if store == "postgres" else None
                result["server_system_cpu_s"] = server_cpu_s(pid, system_only=True) - kernel
            result.update(system=system, store=store, round=n + 1, server_cpu_s=server)
            print(
                f"round {n + 1} {store:8} {system:9} {result['turns'] / result['seconds']:7.1f} turns/s "
                f"{1000 * result['cpu_s'] / result['turns']:6.2f} ms CPU a turn"
                + (
                    f" (server {1000 * server / result['turns']:.2f}, of it in the kernel "
                    f"{1000 * result['server_system_cpu_s'] / result['turns']:.2f})"
                    if server
                    else ""
                ),
                file=sys.stderr,
            )
            results.append(result)
    return results


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per store and system: the median turns/s and its spread, CPU per turn; rem's ratio to each."""
    table: dict[str, Any] = {}
    for store in sorted({r["store"] for r in results}):
        rows: dict[str, Any] = {}
        for system in SYSTEMS:
            mine = [r for r in results if r["store"] == store and r["system"] == system]
            if not mine:
                continue
            rates = sorted(r["turns"] / r["seconds"] for r in mine)
            servers = [r["server_cpu_s"] / r["turns"] for r in mine if r["server_cpu_s"]]
            rows[system] = {
                "turns_per_s": round(statistics.median(rates), 1),
                "turns_per_s_min": round(rates[0], 1),
                "turns_per_s_max": round(rates[-1], 1),
                "rounds": len(mine),
                "cpu_ms_per_turn": round(1000 * statistics.median(r["cpu_s"] / r["turns"] for r in mine), 2),
                "server_cpu_ms_per_turn": round(1000 * statistics.median(servers), 2) if servers else None,
            }
        if "rem" in rows:
            for peer in PEERS:
                if peer in rows:
                    rows[f"rem_vs_{peer}"] = round(rows["rem"]["turns_per_s"] / rows[peer]["turns_per_s"], 2)
        table[store] = rows
    return table


def print_table(table: dict[str, Any]) -> None:
    for store, rows in table.items():
        print(f"\n{store}:", file=sys.stderr)
        for system in SYSTEMS:
            if system not in rows:
                continue
            row = rows[system]
            server = row["server_cpu_ms_per_turn"]
            print(
                f"  {system:9} {row['turns_per_s']:7.1f} turns/s ({row['turns_per_s_min']}-{row['turns_per_s_max']}, "
                f"{row['rounds']} rounds)  {row['cpu_ms_per_turn']:5.2f} ms CPU a turn"
                + (f", server {server:.2f}" if server else ""),
                file=sys.stderr,
            )
        for peer in PEERS:
            if f"rem_vs_{peer}" in rows:
                print(f"  rem / {peer}: {rows[f'rem_vs_{peer}']}", file=sys.stderr)


def child(args: argparse.Namespace) -> None:
    from benchmarks.peer_workloads import RUNNERS

    result = RUNNERS[args.child](args.store, args.target, args.inputs, args.sessions, args.concurrency)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--db", metavar="URL", help="a PostgreSQL server you run (CREATEDB needed)")
    parser.add_argument("--systems", type=lambda s: s.split(","), default=list(SYSTEMS))
    parser.add_argument("--crash", action="store_true", help="add the crash column (SIGKILL mid-turn)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--crash-child", choices=("rem", "dbos", "langgraph"), help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=("victim", "restart"), help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.crash_child:
        from benchmarks.peer_crash import crash_child

        scratch = Path(os.environ["PEERS_SCRATCH"])
        print(json.dumps(crash_child(args.crash_child, args.phase, args.store, args.target, scratch)))
        return
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    results: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rem-peers-") as tmp, server(args.db, Path(tmp)) as server_url:
        pid = None if args.db else _postmaster_pid(server_url)
        for n in range(args.rounds):
            results += one_round(
                n, args, stores, server_url if "postgres" in stores else None, pid, Path(tmp)
            )
        if args.crash:
            from benchmarks.peer_crash import crash_all

            crashing = [s for s in args.systems if s != "dbos-direct"]  # the same DBOS as `dbos` once started
            crashes = crash_all(crashing, stores, server_url, Path(tmp))
    table = summary(results)
    print_table(table)
    report = {
        "versions": versions(),
        "workload": vars(args) | {"child": None, "crash_child": None},
        "summary": table,
    }
    if crashes:
        report["crash"] = crashes
        from benchmarks.peer_crash import print_crashes

        print_crashes(crashes)
    report["runs"] = results
    report["load_average_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report) if args.json else json.dumps(report["summary"]))


def _postmaster_pid(url: str) -> int | None:
    """The throw-away server's postmaster (this process's child), found by its socket dir."""
    import psutil

    me = psutil.Process()
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "postgres" in proc.name() or "unshare" in proc.name():
                return int(proc.pid)
    return None


if __name__ == "__main__":
    main()
