"""The API's event streams: how soon an input reaches a client, and what open streams cost a server.

    python benchmarks/api_streams.py [--store sqlite|postgres|both] [--inputs 100] [--streams 1000]
        [--window-s 60] [--fanouts 10] [--json]

Against a real `rem serve` process (a fresh data dir; on PostgreSQL a
throw-away local server), with clients in this process on raw sockets (HTTP/1.1,
the cheapest client; their CPU is not the server's):

1. Admission to a client: INPUTS inputs admitted (`sessions.admit`, the
   library's admission: durable when it returns) 20-80 ms apart, one client
   following the project stream; from durable to the `input.admitted` event's
   bytes at the client, in ms: p50, p95 (target p95 < 50 ms), max.
2. STREAMS open idle streams (the project stream) on the one server: its CPU
   over WINDOW_S with nothing committed (heartbeat comments every 15 s
   included; target <= 0.5 % of a core), beside its CPU over the same window
   with no stream open (its own heartbeat, the change feed's keepalive), and
   the memory each stream costs
   (the server's RSS with the streams open less before, over STREAMS).
3. Fan-out: FANOUTS inputs with the STREAMS streams open, each from durable
   to its event at every stream: the first and last stream's arrival, in ms.

The load average is printed with the figures: on a busy machine they read high.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
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
from backend.execution import sessions
from backend.runtime.context import Context
from benchmarks.idle import TICKS_PER_S, proc_ticks

PROJECT = "bench"
INPUT_ID = re.compile(rb'"input_id":"(bi-[0-9]+)"')


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS for {pid}")


def start_server(root: Path, db_url: str | None) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ)
    if db_url:
        env["REM_DB_URL"] = db_url
    log = root.parent / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "backend.cli.app", "--data", str(root), "serve", "--listen", "127.0.0.1:0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"rem serve exited: {log.read_text()[-500:]}")
        time.sleep(0.05)
    raise SystemExit("rem serve did not start")


class Stream:
    """One SSE client on a raw socket: notes when each benchmark input's event arrives."""

    def __init__(self, arrivals: dict[str, list[float]]) -> None:
        self.arrivals = arrivals
        self.primed = asyncio.Event()
        self._tail = b""
        self._seen: set[bytes] = set()
        self.task: asyncio.Task[None] | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self, port: str, token: str) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", int(port))
        self.writer.write(
            f"GET /v1/events?project={PROJECT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        self.task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(65536):
            now = time.perf_counter()
            self.primed.set()
            data, self._tail = self._tail + chunk, chunk[-64:]
            for found in INPUT_ID.finditer(data):  # the tail kept: an id cut in two is found whole
                if found.group(1) not in self._seen:
                    self._seen.add(found.group(1))
                    self.arrivals.setdefault(found.group(1).decode(), []).append(now)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.writer is not None:
            self.writer.close()


async def open_streams(n: int, port: str, token: str, arrivals: dict[str, list[float]]) -> list[Stream]:
    streams = []
    for start in range(0, n, 100):  # in batches: the listen backlog and the loop stay comfortable
        batch = [Stream(arrivals) for _ in range(min(100, n - start))]
        await asyncio.gather(*(s.open(port, token) for s in batch))
        await asyncio.wait_for(asyncio.gather(*(s.primed.wait() for s in batch)), 60)
        streams += batch
    return streams


async def cpu_pct(pid: int, window_s: float) -> float:
    """`pid`'s CPU over the next `window_s` seconds, in % of one core."""
    ticks = proc_ticks(pid) or 0
    await asyncio.sleep(window_s)
    return ((proc_ticks(pid) or 0) - ticks) / TICKS_PER_S / window_s * 100


async def admit(ctx: Context, i: int) -> float:
    db = await ctx.db()
    await sessions.admit(db, f"bs-{i % 20}", f"benchmark input {i}", input_id=f"bi-{i}", project=PROJECT)
    return time.perf_counter()  # durable: the admission's transaction has committed


async def wait_arrivals(
    arrivals: dict[str, list[float]], key: str, count: int, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    while len(arrivals.get(key, ())) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"input {key} reached {len(arrivals.get(key, ()))} of {count} streams")
        await asyncio.sleep(0.001)


def percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": round(statistics.median(values), 2),
        "p95": round(values[int(0.95 * (len(values) - 1))], 2),
        "max": round(values[-1], 2),
    }


async def admission_latency(ctx: Context, port: str, token: str, inputs: int) -> dict[str, Any]:
    arrivals: dict[str, list[float]] = {}
    (client,) = await open_streams(1, port, token, arrivals)
    rng, latencies = random.Random(5), []
    try:
        for i in range(inputs):
            await asyncio.sleep(rng.uniform(0.02, 0.08))
            durable = await admit(ctx, i)
            await wait_arrivals(arrivals, f"bi-{i}", 1)
            latencies.append((arrivals[f"bi-{i}"][0] - durable) * 1000)
    finally:
        client.close()
    return {"n": inputs, **percentiles(latencies)}


async def idle_and_fanout(
    ctx: Context, server: subprocess.Popen[bytes], port: str, token: str, args: argparse.Namespace
) -> dict[str, Any]:
    arrivals: dict[str, list[float]] = {}
    await asyncio.sleep(2)
    rss_before = rss_bytes(server.pid)
    baseline_pct = await cpu_pct(server.pid, args.window_s)  # the server idle with no stream open
    streams = await open_streams(args.streams, port, token, arrivals)
    try:
        await asyncio.sleep(2)
        rss_open = rss_bytes(server.pid)
        load = os.getloadavg()[0]
        idle_pct = await cpu_pct(server.pid, args.window_s)
        first, last = [], []
        for n in range(args.fanouts):
            i = 100_000 + n
            durable = await admit(ctx, i)
            await wait_arrivals(arrivals, f"bi-{i}", args.streams)
            times = arrivals[f"bi-{i}"]
            first.append((min(times) - durable) * 1000)
            last.append((max(times) - durable) * 1000)
            await asyncio.sleep(0.5)
    finally:
        for stream in streams:
            stream.close()
    return {
        "streams": args.streams,
        "idle_window_s": args.window_s,
        "idle_pct_of_a_core": round(idle_pct, 3),
        "no_streams_pct_of_a_core": round(baseline_pct, 3),
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_open_mb": round(rss_open / 2**20, 1),
        "kb_per_stream": round((rss_open - rss_before) / args.streams / 1024, 1),
        "fanout_first_ms": percentiles(first),
        "fanout_last_ms": percentiles(last),
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


async def measure(args: argparse.Namespace, root: Path, db_url: str | None) -> dict[str, Any]:
    ctx = Context(DataDir(root), db_url=db_url, start_chroma=False)
    token = (await ops.token_create(ctx, "bench", projects=[PROJECT], scopes=["read"]))["token"]
    server, port = start_server(root, db_url)
    try:
        latency = await admission_latency(ctx, port, token, args.inputs)
        scale = await idle_and_fanout(ctx, server, port, token, args)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        await ctx.close()
    return {
        "store": "postgresql" if db_url else "sqlite",
        "admitted_to_client_ms": latency,
        **scale,
        "targets": {
            "admitted -> client p95 < 50 ms": latency["p95"],
            f"{args.streams} idle streams <= 0.5 % of a core": scale["idle_pct_of_a_core"],
        },
    }


def run_store(args: argparse.Namespace, store: str) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix=f"rem-streams-{store}-"))
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


def print_result(r: dict[str, Any]) -> None:
    lat, first, last = r["admitted_to_client_ms"], r["fanout_first_ms"], r["fanout_last_ms"]
    print(f"{r['store']} (load average {r['load_average_1m']}):")
    print(f"  input durable -> input.admitted at a client ({lat['n']}): p50 {lat['p50']} ms, p95 {lat['p95']} ms, max {lat['max']} ms (target p95 < 50 ms)")  # fmt: skip
    print(f"  {r['streams']} idle streams: {r['idle_pct_of_a_core']} % of a core over {r['idle_window_s']:g} s (target <= 0.5 %; no stream open: {r['no_streams_pct_of_a_core']} %); {r['kb_per_stream']} KiB each (RSS {r['rss_before_mb']} -> {r['rss_open_mb']} MB)")  # fmt: skip
    print(f"  one event to {r['streams']} streams: first p50 {first['p50']} ms, last p50 {last['p50']} ms, last max {last['max']} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--inputs", type=int, default=100)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--fanouts", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    results = [run_store(args, s) for s in stores]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print_result(r)


if __name__ == "__main__":
    main()
