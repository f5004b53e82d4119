"""Admission over HTTP (`POST /v1/sessions/{id}/inputs` on a real `rem serve`) against the library's.

    .venv/bin/python benchmarks/api_admission.py [--latency 500] [--inputs 3200] [--clients 32] [--rounds 3]
        [--client raw|httpx] [--json]

One fresh data dir (state.db; `--db URL` for PostgreSQL), one `rem serve` process on a free
loopback port, one token. Latency: `--latency` admissions one after another on one keep-alive
connection, each with its own id (p50, p99). Throughput: `--inputs` admissions by `--clients`
concurrent clients (one session each, every input with its id), against the same admissions
made in this process by `--clients` concurrent tasks calling `backend.ops.send` on one Context:
the library's admission (and, for reference, one library caller alone, which shares no group
commit). The ratio HTTP / library is the figure (target >= 0.5); the client runs
on the same cores as the server, as a co-located application would. The CPU each input costs
(the library; the server and the client over HTTP, from /proc and `process_time`) gives the same
ratio as it would be on cores nobody else uses: the figure to trust on a shared machine.
The clients are bare HTTP/1.1 ones (one keep-alive connection each, no pooling: ~0.04 ms of CPU
an input); `--client httpx` drives the same requests through httpx, whose own ~1 ms of CPU an
input is more than the server's, so that it measures the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context

REM = str(Path(sys.executable).parent / "rem")


def start_server(data: Path, db_url: str | None) -> tuple[subprocess.Popen[bytes], str]:
    log = data.parent / "serve.log"
    env = {"REM_CHROMA_AUTOSTART": "0", **({"REM_DB_URL": db_url} if db_url else {})}
    proc = subprocess.Popen(
        [REM, "--data", str(data), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        env={**os.environ, **env},
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"rem serve exited: {log.read_text()}")
        time.sleep(0.05)
    raise SystemExit("rem serve did not start in 60 s")


def cpu_s(pid: int) -> float:
    """A process's CPU time (user + system) so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def httpx_latency_ms(url: str, token: str, count: int) -> list[float]:
    took = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as api:
        for i in range(count):
            started = time.perf_counter()
            answer = api.post("/v1/sessions/lat/inputs", json={"text": f"hello {i}", "input_id": f"lat-{i}"})
            took.append((time.perf_counter() - started) * 1000)
            assert answer.status_code == 202, answer.text
    return took


async def http_rate(url: str, token: str, inputs: int, clients: int, tag: str) -> float:
    per = inputs // clients
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {token}"},
        limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients),
        timeout=60,
    ) as api:

        async def client(c: int) -> None:
            for i in range(per):
                answer = await api.post(
                    f"/v1/sessions/{tag}-h{c}/inputs",
                    json={"text": f"input {i}", "input_id": f"{tag}-h{c}-{i}"},
                )
                assert answer.status_code == 202, answer.text

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return per * clients / (time.perf_counter() - started)


class RawClient:
    """A bare keep-alive HTTP/1.1 client on one connection (no pooling, no parsing past the status
    and the length): what rem's server costs, without httpx's own ~1 ms of CPU a request."""

    def __init__(self, url: str, token: str) -> None:
        self.host, self.port = url.removeprefix("http://").rsplit(":", 1)
        self.auth = f"Bearer {token}"
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, int(self.port))

    async def post(self, path: str, body: dict[str, Any]) -> int:
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: {self.auth}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        # the head in one read, its length found in it: the client's CPU stays small beside the server's
        head_in = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        at = head_in.find(b"\r\ncontent-length:")
        length = int(head_in[at + 17 : head_in.index(b"\r\n", at + 2)]) if at >= 0 else 0
        await self.reader.readexactly(length)
        return int(head_in.split(b" ", 2)[1])

    def close(self) -> None:
        self.writer.close()


async def raw_latency_ms(url: str, token: str, count: int) -> list[float]:
    took = []
    conn = RawClient(url, token)
    await conn.open()
    try:
        for i in range(count):
            started = time.perf_counter()
            status = await conn.post(
                "/v1/sessions/lat/inputs", {"text": f"hello {i}", "input_id": f"lat-{i}"}
            )
            took.append((time.perf_counter() - started) * 1000)
            assert status == 202, status
    finally:
        conn.close()
    return took


async def raw_rate(url: str, token: str, inputs: int, clients: int, tag: str) -> float:
    per = inputs // clients
    conns = [RawClient(url, token) for _ in range(clients)]
    await asyncio.gather(*(c.open() for c in conns))

    async def client(c: int) -> None:
        for i in range(per):
            status = await conns[c].post(
                f"/v1/sessions/{tag}-w{c}/inputs", {"text": f"input {i}", "input_id": f"{tag}-w{c}-{i}"}
            )
            assert status == 202, status

    try:
        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return per * clients / (time.perf_counter() - started)
    finally:
        for conn in conns:
            conn.close()


async def library_rate(ctx: Context, inputs: int, clients: int, tag: str) -> float:
    per = inputs // clients

    async def client(c: int) -> None:
        for i in range(per):
            await ops.send(ctx, f"{tag}-l{c}", f"input {i}", input_id=f"{tag}-l{c}-{i}")

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return per * clients / (time.perf_counter() - started)


async def library_sequential_rate(ctx: Context, inputs: int) -> float:
    """One caller admitting one input after another: no group commit to share."""
    started = time.perf_counter()
    for i in range(inputs):
        await ops.send(ctx, "seq", f"input {i}", input_id=f"seq-{i}")
    return inputs / (time.perf_counter() - started)


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    data = root / "data"
    ctx = Context(DataDir(data), start_chroma=False, db_url=args.db)
    await ctx.db()
    token = (await ops.token_create(ctx, "bench", all_projects=True, scopes=("read", "write")))["token"]
    proc, url = start_server(data, args.db)
    try:
        if args.client == "raw":
            lat = await raw_latency_ms(url, token, args.latency)
        else:
            lat = await asyncio.to_thread(httpx_latency_ms, url, token, args.latency)
        sequential = await library_sequential_rate(ctx, args.latency)
        rounds = []
        for r in range(args.rounds):
            cpu = time.process_time()
            library = await library_rate(ctx, args.inputs, args.clients, f"r{r}")
            library_cpu = (time.process_time() - cpu) / args.inputs
            cpu, server = time.process_time(), cpu_s(proc.pid)
            rate = raw_rate if args.client == "raw" else http_rate
            http = await rate(url, token, args.inputs, args.clients, f"r{r}")
            client_cpu = (time.process_time() - cpu) / args.inputs
            server_cpu = (cpu_s(proc.pid) - server) / args.inputs
            rounds.append(
                {
                    "http_per_s": round(http, 1),
                    "library_per_s": round(library, 1),
                    "ratio": round(http / library, 3),
                    # CPU an input costs (ms): what the ratio comes to when the cores are not shared
                    "cpu_ms": {
                        "library": round(library_cpu * 1000, 3),
                        "server": round(server_cpu * 1000, 3),
                        "client": round(client_cpu * 1000, 3),
                    },
                    "cpu_ratio": round(library_cpu / (server_cpu + client_cpu), 3),
                }
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        await ctx.close()
    ordered = sorted(lat)
    return {
        "store": "postgresql" if args.db else "sqlite",
        "latency_ms": {
            "p50": round(statistics.median(ordered), 2),
            "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
            "count": len(ordered),
        },
        "clients": args.clients,
        "client": args.client,
        "inputs": args.inputs,
        "rounds": rounds,
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
        # the library with one caller (no group commit): what a lone in-process caller gets
        "library_sequential_per_s": round(sequential, 1),
        "ratio_to_sequential_median": round(
            statistics.median(r["http_per_s"] for r in rounds) / sequential, 3
        ),
        "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=int, default=500)
    parser.add_argument("--inputs", type=int, default=3200)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", default=None, help="a postgresql:// URL (default: state.db in a temp dir)")
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="raw (default): a bare HTTP/1.1 client, ~0.04 ms of CPU an input; httpx costs ~1 ms, "
        "more than the server, and so measures itself",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rem-api-bench-"))
    try:
        result = asyncio.run(measure(args, root))
    except BaseException:
        log = root / "serve.log"
        print(
            f"rem serve's log: {log.read_text(errors='replace')[-2000:] if log.exists() else '(none)'}",
            file=sys.stderr,
        )
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    lat = result["latency_ms"]
    print(
        f"admission over HTTP ({result['store']}): p50 {lat['p50']} ms, p99 {lat['p99']} ms ({lat['count']} sequential)"
    )
    for r in result["rounds"]:
        print(
            f"{result['clients']} clients: {r['http_per_s']} inputs/s over HTTP, {r['library_per_s']} in the library, "
            f"ratio {r['ratio']}; CPU per input {r['cpu_ms']} ms, CPU ratio {r['cpu_ratio']}"
        )
    print(
        f"the library with one caller: {result['library_sequential_per_s']} inputs/s; HTTP with "
        f"{result['clients']} clients / that: {result['ratio_to_sequential_median']}"
    )
    print(
        f"ratio (median of {len(result['rounds'])} rounds): {result['ratio_median']} (target >= 0.5); "
        f"CPU ratio {result['cpu_ratio_median']}"
    )


if __name__ == "__main__":
    main()
